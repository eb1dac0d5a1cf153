"""Weight interpolation, α grids and the selection rule (negft.patching)."""
import pytest
import torch

from negft import models
from negft.models import tower_of
from negft.patching import Rule, interpolate, parse_alphas, select


@pytest.fixture(scope="module")
def pair():
    """Two tiny models' state dicts: a base and a 'fine-tuned' one whose every float weight moved."""
    torch.manual_seed(0)
    base = models.build("negft-tiny", "").model.state_dict()
    ft = {k: (v + 0.01 * torch.randn_like(v)) if v.is_floating_point() else v.clone() for k, v in base.items()}
    # a float buffer holding -inf, as some architectures save their causal attention mask
    mask = torch.full((4, 4), float("-inf")).triu(1)
    return {**base, "text_mask": mask}, {**ft, "text_mask": mask.clone()}


def test_alpha_0_is_the_base_and_alpha_1_the_finetuned_model_exactly(pair):
    base, ft = pair
    for k, v in interpolate(base, ft, 0.0, "vt").items():
        assert torch.equal(v, base[k]), k
    for k, v in interpolate(base, ft, 1.0, "vt").items():
        assert torch.equal(v, ft[k]), k
    half = interpolate(base, ft, 0.25, "vt")
    k = "visual.conv1.weight"
    assert torch.allclose(half[k], 0.75 * base[k] + 0.25 * ft[k])
    assert torch.equal(half["text_mask"], base["text_mask"])      # -inf entries stay -inf, never NaN


@pytest.mark.parametrize("mode, moved", [("v", {"v"}), ("t", {"t"}), ("vt", {"v", "t"})])
def test_a_tower_mode_moves_only_its_tower(pair, mode, moved):
    base, ft = pair
    out = interpolate(base, ft, 1.0, mode)
    for k, v in out.items():
        tower = tower_of(k)
        if tower == "shared":          # logit_scale: interpolated in every mode (a documented choice)
            assert torch.equal(v, ft[k])
        elif tower in moved:
            assert torch.equal(v, ft[k]) or torch.equal(base[k], ft[k]), k
        else:
            assert torch.equal(v, base[k]), k
    assert any(tower_of(k) == "v" for k in out) and any(tower_of(k) == "t" for k in out)


def test_mismatched_state_dicts_are_refused_with_the_keys_named(pair):
    base, ft = pair
    missing = {k: v for k, v in ft.items() if k != "visual.proj"}
    with pytest.raises(ValueError, match=r"visual\.proj"):
        interpolate(base, missing, 0.5)
    reshaped = {**ft, "text_projection": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match=r"text_projection: shape"):
        interpolate(base, reshaped, 0.5)
    with pytest.raises(ValueError, match="weight of the fine-tuned model"):
        interpolate(base, ft, 1.5)


def test_a_resnet_pair_with_different_batch_norm_counters_is_patched():
    """A ResNet image tower fine-tuned in training mode counts its batch-norm steps; the counters differ."""
    torch.manual_seed(0)
    base = models.build("negft-tiny-rn", "").model.state_dict()
    ft = {k: v + 0.01 * torch.randn_like(v) if v.is_floating_point() else v + 7 for k, v in base.items()}
    counters = [k for k in base if k.endswith("num_batches_tracked")]
    assert counters
    for alpha, want in ((0.0, base), (1.0, ft)):
        for k, v in interpolate(base, ft, alpha, "vt").items():
            assert torch.equal(v, want[k]), (alpha, k)
    assert all(torch.equal(interpolate(base, ft, 1.0, "t")[k], base[k]) for k in counters)   # t leaves visual.*
    with pytest.raises(ValueError, match="integer buffer differs"):                      # other integers must match
        interpolate({**base, "ids": torch.arange(3)}, {**ft, "ids": torch.arange(3) + 1}, 0.5)


def test_alpha_grids():
    assert parse_alphas("0:1:0.1") == [round(0.1 * i, 10) for i in range(11)]
    assert parse_alphas("0,0.2,1") == [0.0, 0.2, 1.0]
    for bad in ("0:2:0.5", "a,b", "0:1:0"):
        with pytest.raises(ValueError, match="alphas"):
            parse_alphas(bad)


def _row(tower, alpha, target, drift):
    return {"tower": tower, "alpha": alpha, "metrics": {"mcq_neg/world/acc": target, "zeroshot/world/top1": drift}}


def test_the_rule_takes_the_largest_gain_within_the_drift_bound():
    rule = Rule(targets=["mcq_neg/*/acc"], drift=["zeroshot/*/top1"], max_drift=0.03)
    rows = [_row(m, 0.0, 0.20, 0.50) for m in ("t", "v")] + [
        _row("t", 0.5, 0.40, 0.49),      # gain .20, drop .01
        _row("t", 1.0, 0.60, 0.40),      # gain .40 but drop .10: out of bounds
        _row("v", 0.5, 0.45, 0.475),     # gain .25, drop .025: the choice
        _row("v", 1.0, 0.45, 0.46),      # same gain, more drift and larger α
    ]
    chosen = select(rule, rows)
    assert (chosen["tower"], chosen["alpha"]) == ("v", 0.5)
    # with no room for drift, only the base model qualifies
    assert select(Rule(["mcq_neg/*/acc"], ["zeroshot/*/top1"], 0.0), rows)["alpha"] == 0.0
    with pytest.raises(ValueError, match="no metric matches"):
        select(Rule(["nope/*/acc"], [], 0.1), rows)


def test_a_checkpoint_finds_its_run_by_its_record_and_an_old_one_by_its_place(tmp_path):
    """Patching reads the run's patch rule and release its ledger from the run directory the checkpoint
    records; a checkpoint written before that was recorded (or whose record is stale) falls back to RUN two
    levels up from RUN/checkpoints/epoch_N."""
    import json
    run = tmp_path / "run"
    (run / "checkpoints" / "epoch_1").mkdir(parents=True)
    (run / "config.yaml").write_text("recipe: demo\n")

    def ckpt(path, info):
        path.mkdir(parents=True, exist_ok=True)
        (path / models.CONFIG_FILE).write_text(json.dumps({"model_cfg": {}, "negft": info}))
        return path

    moved = ckpt(tmp_path / "elsewhere" / "epoch_1", {"run_dir": str(run)})
    assert models.run_dir_of(moved) == run                                     # the record, wherever it sits
    old = ckpt(run / "checkpoints" / "epoch_1", {"epoch": 1})
    assert models.run_dir_of(old) == run                                       # no record: its place
    stale = ckpt(run / "checkpoints" / "epoch_1", {"run_dir": str(tmp_path / "gone")})
    assert models.run_dir_of(stale) == run
    patched = ckpt(tmp_path / "patch" / "selected", {"patch": {"alpha": 0.5}, "finetuned": str(old)})
    assert models.run_dir_of(patched) == run                                   # the fine-tuned model's run
    assert models.run_dir_of(ckpt(tmp_path / "lone" / "ckpt", {})) is None


def test_gain_and_drift_follow_each_metrics_registered_direction():
    """A better-lower metric gains when it falls (geometry's negated_affirmed_cos: 1 means negation ignored);
    a metric with no better direction cannot be a target."""
    from negft.patching import gain_and_drift
    base = {"geometry/world/negated_affirmed_cos": 0.9, "zeroshot/world/top1": 0.8,
            "mcq_neg/world/chose_negation": 0.3}
    now = {"geometry/world/negated_affirmed_cos": 0.6, "zeroshot/world/top1": 0.75,
           "mcq_neg/world/chose_negation": 0.5}
    gain, drop = gain_and_drift(Rule(["geometry/*/negated_affirmed_cos"], ["zeroshot/*/top1"]), now, base)
    assert gain == pytest.approx(0.3) and drop == pytest.approx(0.05)
    with pytest.raises(ValueError, match="no better direction"):
        gain_and_drift(Rule(["mcq_neg/*/chose_negation"], []), now, base)
