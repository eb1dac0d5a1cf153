"""tower=v|t|vt trains only what it names; the frozen tower comes out bit-identical, and saved whole."""
import pytest
import torch
from safetensors.torch import load_file

from negft import models
from tests.conftest import run_here

QUICK = ["recipe=negfull", "data=world", "world.size=tiny", "eval.suite=zeroshot", "train.workers=0", "epochs=1",
         "train.steps_per_epoch=2", "streams.negcap.batch_size=8", "streams.negmcq.batch_size=8",
         "optim.lr=1e-3", "optim.warmup_steps=1"]


def _random_model(arch, tmp_path_factory):
    torch.manual_seed(0)
    bundle = models.build(arch, "")
    out = tmp_path_factory.mktemp("base") / arch
    models.save(bundle.model, out, bundle.model_cfg, bundle.preprocess_cfg)
    return out


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return _random_model("negft-tiny", tmp_path_factory)


# bf16: DeepSpeed casts the whole model, so frozen weights must be saved from their fp32 snapshot
# model.frozen (NegationCLIP's ln_final) freezes on top of the tower
@pytest.mark.parametrize("tower,zero,logit,precision,frozen", [("v", 0, "false", "bf16", ""),
                                                               ("t", 2, "false", "fp32", "ln_final"),
                                                               ("vt", 1, "true", "fp32", "")])
def test_frozen_tower_is_bit_identical(base, cache, tmp_path, tower, zero, logit, precision, frozen):
    run = tmp_path / "run"
    proc = run_here(["train.py", *QUICK, f"tower={tower}", f"train.zero_stage={zero}", f"train.precision={precision}",
                     f"model.train_logit_scale={logit}", f"model.world_pretrained=local-dir:{base}",
                     f"model.frozen=[{frozen}]", f"out={run}", f"world.cache={cache}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    before = load_file(str(base / models.WEIGHTS_FILE))
    after = load_file(str(run / "checkpoints" / "epoch_1" / models.WEIGHTS_FILE))
    assert before.keys() == after.keys(), "a checkpoint must hold every weight, frozen or not"
    for key in before:
        group = "v" if key.startswith("visual.") else "shared" if key.startswith("logit_") else "t"
        trains = ((group in tower) if group != "shared" else logit == "true") and not (
            frozen and key.startswith(frozen + "."))
        same = torch.equal(before[key], after[key])
        if not trains:
            assert same, f"tower={tower}: frozen '{key}' changed"
    for group in ("v", "t"):
        keys = [k for k in before if (k.startswith("visual.")) == (group == "v") and not k.startswith("logit_")
                and before[k].is_floating_point()]
        changed = any(not torch.equal(before[k], after[k]) for k in keys)
        assert changed == (group in tower), f"tower={tower}: the {group} tower {'did not train' if group in tower else 'trained'}"


def test_grad_checkpointing_trains_the_same_weights(base, cache, tmp_path):
    """train.grad_checkpointing trades compute for memory; the step it takes is the same."""
    weights = []
    for flag in ("false", "true"):
        run = tmp_path / flag
        proc = run_here(["train.py", *QUICK, "tower=vt", "train.precision=fp32", f"train.grad_checkpointing={flag}",
                         f"model.world_pretrained=local-dir:{base}", f"out={run}", f"world.cache={cache}"])
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
        weights.append(load_file(str(run / "checkpoints" / "epoch_1" / models.WEIGHTS_FILE)))
    before = load_file(str(base / models.WEIGHTS_FILE))
    assert not torch.equal(weights[0]["visual.conv1.weight"], before["visual.conv1.weight"])
    for k in weights[0]:
        torch.testing.assert_close(weights[1][k], weights[0][k], rtol=0, atol=1e-6, msg=k)


def test_frozen_conv_tower_keeps_its_batch_norm_statistics(cache, tmp_path, tmp_path_factory):
    """tower=t on a conv image tower: in training mode its batch norms would update their running statistics."""
    base = _random_model("negft-tiny-rn", tmp_path_factory)
    run = tmp_path / "run"
    proc = run_here(["train.py", *QUICK, "tower=t", "eval.suite=mcq_neg", f"model.world_pretrained=local-dir:{base}",
                     f"out={run}", f"world.cache={cache}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    before = load_file(str(base / models.WEIGHTS_FILE))
    after = load_file(str(run / "checkpoints" / "epoch_1" / models.WEIGHTS_FILE))
    stats = [k for k in before if k.startswith("visual.") and "running_" in k]
    assert stats, "negft-tiny-rn has batch norms"
    for key in (k for k in before if k.startswith("visual.")):
        assert torch.equal(before[key], after[key]), f"frozen '{key}' changed"


def test_a_training_conv_tower_keeps_its_batch_norm_statistics_when_asked(cache, tmp_path, tmp_path_factory):
    """model.freeze_norm_stats with tower=vt: the image tower trains, its batch norms' weights too, but their
    running statistics stay the base's; without it, a batch in training mode moves them."""
    base = _random_model("negft-tiny-rn", tmp_path_factory)
    before = load_file(str(base / models.WEIGHTS_FILE))
    proc = run_here(["train.py", *QUICK, "tower=vt", "eval.suite=none", "model.freeze_norm_stats=true",
                     f"model.world_pretrained=local-dir:{base}", f"out={tmp_path / 'run'}", f"world.cache={cache}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    after = load_file(str(tmp_path / "run" / "checkpoints" / "epoch_1" / models.WEIGHTS_FILE))
    stats = [k for k in before if k.startswith("visual.") and ("running_" in k or "num_batches" in k)]
    assert stats and all(torch.equal(before[k], after[k]) for k in stats)
    assert not torch.equal(before["visual.bn1.weight"], after["visual.bn1.weight"])
    assert not torch.equal(before["visual.conv1.weight"], after["visual.conv1.weight"])
    model = models.build("", f"local-dir:{base}").model
    images = torch.randn(4, 3, 64, 64)
    for freeze, moved in ((True, False), (False, True)):
        models.train_mode(model, "vt", freeze)
        mean = model.visual.bn1.running_mean.clone()
        with torch.no_grad():
            model.encode_image(images)
        assert (not torch.equal(mean, model.visual.bn1.running_mean)) == moved
        assert model.visual.training and model.visual.bn1.training == moved


@pytest.mark.parametrize("tower", ["t", "vt"])
def test_bf16_runs_a_conv_tower_and_saves_its_frozen_batch_norm_statistics(cache, tmp_path, tmp_path_factory, tower):
    """bf16 on a ResNet image tower: since 0.19 DeepSpeed casts parameters but not buffers unless asked, and
    batch norm refused bf16 weights with fp32 statistics ("expected scalar type BFloat16 but found Float").
    A frozen tower's statistics are saved from their fp32 snapshot, bit-identical."""
    base = _random_model("negft-tiny-rn", tmp_path_factory)
    run = tmp_path / "run"
    proc = run_here(["train.py", *QUICK, f"tower={tower}", "train.precision=bf16", "train.zero_stage=1",
                     "eval.suite=zeroshot", f"model.world_pretrained=local-dir:{base}", f"out={run}",
                     f"world.cache={cache}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    before = load_file(str(base / models.WEIGHTS_FILE))
    after = load_file(str(run / "checkpoints" / "epoch_1" / models.WEIGHTS_FILE))
    assert before.keys() == after.keys()
    stats = [k for k in before if k.startswith("visual.") and "running_" in k]
    assert stats and all(after[k].dtype == torch.float32 for k in stats)
    visual_same = all(torch.equal(before[k], after[k]) for k in before if k.startswith("visual."))
    assert visual_same == (tower == "t")


@pytest.mark.parametrize("unlocked,trained", [
    (1, {"text_projection"}),
    (2, {"text_projection", "ln_final", "transformer.resblocks.2"}),
    (4, {"text_projection", "ln_final", "transformer.resblocks"}),
    (5, {"text_projection", "ln_final", "transformer.resblocks", "token_embedding", "positional_embedding"}),
])
def test_lock_text_unlocked_layers_trains_the_last_groups_only(unlocked, trained):
    """open_clip's groups of a 3-block text tower: embeddings, block 0, block 1, block 2 + ln_final, projection."""
    bundle = models.build("negft-tiny", "")
    models.set_trainable(bundle.model, "t", train_logit_scale=True, text_unlocked=unlocked)
    for name, p in bundle.model.named_parameters():
        text = models.tower_of(name) == "t"
        expect = name == "logit_scale" or (text and any(name.startswith(t) for t in trained))
        assert p.requires_grad == expect, f"unlocked={unlocked}: '{name}' requires_grad={p.requires_grad}"


def test_lock_text_unlocked_layers_needs_the_text_tower(cache, tmp_path):
    proc = run_here(["train.py", *QUICK, "tower=v", "model.lock_text_unlocked_layers=2", f"out={tmp_path / 'r'}",
                     f"world.cache={cache}"])
    assert proc.returncode == 2 and "model.lock_text_unlocked_layers" in proc.stderr, proc.stderr[-1500:]


def test_frozen_names_a_parameter_or_exits_2_with_the_nearest(base, cache, tmp_path):
    model = models.build("negft-tiny", "").model
    models.set_trainable(model, "t", True, frozen=["ln_final", "text_projection"])
    assert [n for n, p in model.named_parameters() if p.requires_grad and not n.startswith("visual.")] \
        and not any(p.requires_grad for n, p in model.named_parameters()
                    if n.startswith("ln_final.") or n == "text_projection")
    proc = run_here(["train.py", *QUICK, "tower=t", "model.frozen=[ln_finl]", f"model.world_pretrained=local-dir:{base}",
                     f"out={tmp_path / 'run'}", f"world.cache={cache}"])
    assert proc.returncode == 2 and "'ln_finl' names no parameter" in proc.stderr and "ln_final" in proc.stderr
