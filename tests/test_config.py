"""Recipes merge over typed defaults; bad keys and values exit 2 before anything is written."""
import pytest

from negft.config import RECIPES, ConfigError, load_config
from negft.data import manifests
from tests.conftest import run_here


def test_recipe_and_overrides_merge():
    cfg = load_config(["recipe=negfull", "optim.lr=3e-5", "tower=t", "streams.negmcq.batch_size=8",
                       "--local_rank=1", "max_steps=5"])
    assert cfg.recipe == "negfull" and cfg.optim.lr == 3e-5 and cfg.tower == "t"
    assert cfg.streams["negmcq"].batch_size == 8 and cfg.streams["negcap"].field == "negcap"
    assert cfg.max_steps == 5 and cfg.loss.negfull.alpha == 0.99 and cfg.out == "runs/negfull"


def test_default_recipe_is_demo():
    assert load_config([]).recipe == "demo"


@pytest.mark.parametrize("arg, words", [
    ("optim.lrr=1", ["optim.lrr", "optim.lr"]),
    ("towr=v", ["towr", "tower"]),
    ("tower=x", ["tower", "v, t, vt"]),
    ("train.precision=fp8", ["train.precision", "bf16"]),
    ("epochs=abc", ["epochs"]),
    ("recipe=nope", ["nope", "negfull"]),
    ("streams.nope.batch_size=3", ["nope", "negcap"]),
    ("loss.alpha=1.5", ["loss.alpha"]),
    ("data=web", ["data", "world"]),
    ("resume=/no/such/dir", ["resume", "latest"]),
    ("lr", ["key=value"]),
    ("streams.negcap.task=itm", ["streams.negcap", "relcomp or mcq"]),
    ("streams.negmcq.task=itm", ["negmcq", "not read by loss.name=negfull"]),
    ("streams.negcap.field=relcomp", ["streams.negcap", "caption or negcap"]),
    ("loss.margin=-1", ["loss.margin"]),
    ("loss.negfull.alpha=1.5", ["loss.negfull.alpha", "[0, 1]"]),
    ("loss.name=nope", ["loss.name", "negfull", "relcomp"]),
    ("train.epoch_stream=nope", ["train.epoch_stream", "negcap, negmcq"]),
    # each names the key and the fix
    ("loss.negfull.alpha=-0.1", ["loss.negfull.alpha", "[0, 1]", "loss.negfull.alpha=0"]),
    # each loss term's keys and ranges, declared by the term (negft/losses.py)
    ("loss.negfull.t2i_options=-1", ["loss.negfull.t2i_options", ">= 0", "loss.negfull.t2i_options=0"]),
    ("loss.guard.captions=1", ["loss.guard.captions", "loss.guard.caption"]),
    ("loss.negfull.t2i=abc", ["loss.negfull.t2i", "abc"]),
    ("optim.lr=-1e-5", ["optim.lr", ">= 0", "optim.lr=1e-5"]),
    ("streams.negcap.batch_size=-4", ["streams.negcap.batch_size", ">= 1"]),
    ("epochs=0", ["epochs", ">= 1", "eval.py"]),
    ("max_steps=0", ["max_steps", "null", "eval.py"]),
    ("train.max_skipped=2", ["train.max_skipped", "[0, 1]"]),
    ("train.dist_timeout_s=0", ["train.dist_timeout_s", ">= 1"]),
    ("model.pretrained=/no/such/weights.safetensors", ["model.pretrained", "/no/such/weights.safetensors",
                                                        "local-dir:"]),
    ("model.pretrained=local-dir:/no/such/dir", ["model.pretrained", "/no/such/dir", "open_clip_config.json"]),
    ("streams.negcap.urls=/no/such/shard-{000000..000003}.tar", ["streams.negcap.urls", "4 of 4",
                                                                 "/no/such/shard-000000.tar", "manifest"]),
])
def test_bad_config_names_the_key(arg, words):
    with pytest.raises(ConfigError) as e:
        load_config(["recipe=negfull", arg])
    for w in words:
        assert w in str(e.value)


@pytest.mark.parametrize("old, new", [("loss.alpha", "loss.negfull.alpha"), ("loss.margin", "loss.relcomp.margin"),
                                      ("loss.w_itm", "loss.relcomp.w_itm"), ("loss.w_clip", "loss.relcomp.w_clip")])
def test_the_flat_loss_keys_point_to_their_block(old, new, tmp_path):
    """The keys of before ``loss.name`` fail with the new key as the first guess, on the command line and in a
    recipe."""
    with pytest.raises(ConfigError, match=rf"unknown key '{old}'\. Did you mean: {new}"):
        load_config(["recipe=negfull", f"{old}=0.5"])
    recipe = tmp_path / "flat.yaml"
    recipe.write_text(f"streams:\n  c: {{task: contrastive}}\nloss: {{{old.split('.')[1]}: 0.5}}\n")
    with pytest.raises(ConfigError, match=rf"unknown key '{old}'\. Did you mean: {new}"):
        load_config([f"recipe={recipe}"])


@pytest.mark.parametrize("args, key, reader", [
    (["recipe=relcomp", "loss.negfull.alpha=0.3"], "loss.negfull.alpha", "negfull"),
    (["recipe=negfull", "loss.relcomp.margin=0.3"], "loss.relcomp.margin", "relcomp"),
    (["recipe=negcap", "loss.relcomp={w_itm: 2}"], "loss.relcomp.w_itm", "relcomp"),
    (["recipe=negmcq", "loss.negfull.alpha=0.5"], "loss.negfull.alpha", "negfull"),   # the default value, set
])
def test_a_loss_key_the_chosen_loss_does_not_read_is_refused(args, key, reader):
    with pytest.raises(ConfigError) as e:
        load_config(args)
    assert f"'{key}' is read by loss.name={reader}" in str(e.value)


def test_a_loss_block_set_in_the_recipe_is_refused_under_another_loss(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("streams:\n  r: {task: itm, field: relcomp}\nloss: {name: relcomp, negfull: {alpha: 0.2}}\n")
    with pytest.raises(ConfigError, match=r"'loss.negfull.alpha' is read by loss.name=negfull, not by "
                                          r"loss.name=relcomp"):
        load_config([f"recipe={recipe}"])


@pytest.mark.parametrize("args, words", [
    (["recipe=negfull", "loss.name=clip"], ["stream 'negmcq' (task=mcq) is not read by loss.name=clip",
                                            "loss.name=mcq or negfull"]),
    (["recipe=negfull", "loss.name=mcq"], ["stream 'negcap' (task=contrastive) is not read by loss.name=mcq"]),
    (["recipe=negcap", "loss.name=negfull"], ["loss.name=negfull needs a stream with task=mcq", "negcap"]),
    (["recipe=negcap", "loss.name=relcomp"], ["loss.name=relcomp needs a stream with task=itm"]),
])
def test_streams_the_loss_does_not_read_or_needs_are_named(args, words):
    with pytest.raises(ConfigError) as e:
        load_config(args)
    for w in words:
        assert w in str(e.value)


def test_every_recipe_names_a_loss_that_reads_its_streams_and_its_config_yaml_loads_again(tmp_path):
    from negft.config import to_yaml
    from negft.losses import OBJECTIVES
    for path in sorted(RECIPES.glob("*.yaml")):
        cfg = load_config([f"recipe={path.stem}"])
        assert {s.task for s in cfg.streams.values()} <= set(OBJECTIVES[cfg.loss.name].reads), path.stem
        written = tmp_path / f"{path.stem}.yaml"        # a run's config.yaml: only the block its loss reads
        written.write_text(to_yaml(cfg))
        again = load_config([f"recipe={written}"])
        assert again.loss == cfg.loss and again.streams == cfg.streams


def test_epoch_stream_defaults_to_the_first_stream():
    from negft.config import epoch_stream
    assert epoch_stream(load_config(["recipe=negfull"])) == "negcap"
    assert epoch_stream(load_config(["recipe=negfull", "train.epoch_stream=negmcq"])) == "negmcq"


@pytest.mark.parametrize("loss, unread", [("negfull", "'r' (task=itm)"), ("relcomp", "'q' (task=mcq)")])
def test_mcq_and_itm_streams_cannot_share_a_run(tmp_path, loss, unread):
    """No objective reads both an mcq and an itm stream (negft.losses.OBJECTIVES), so whichever loss a recipe names,
    one of them is refused as unread."""
    recipe = tmp_path / "mixed.yaml"
    recipe.write_text("streams:\n  q: {task: mcq, field: mcq}\n  r: {task: itm, field: relcomp}\n")
    with pytest.raises(ConfigError) as e:
        load_config([f"recipe={recipe}", f"loss.name={loss}"])
    assert f"stream {unread} is not read by loss.name={loss}" in str(e.value)


def test_streams_sharing_a_task_are_concatenated():
    """Several datasets per step with their own batch sizes: one batch per task."""
    import torch
    from negft.train.loop import by_task
    a = {"images": torch.zeros(2, 3, 4, 4), "texts": torch.zeros(2, 5, dtype=torch.long)}
    b = {"images": torch.ones(3, 3, 4, 4), "texts": torch.ones(3, 5, dtype=torch.long)}
    m = {"images": torch.zeros(1, 3, 4, 4), "options": torch.zeros(1, 4, 5), "answers": torch.zeros(1)}
    got = by_task({"web": a, "negcap": b, "negmcq": m}, {"web": "contrastive", "negcap": "contrastive",
                                                          "negmcq": "mcq"})
    assert set(got) == {"contrastive", "mcq"} and got["mcq"] is m
    assert got["contrastive"]["images"].shape[0] == 5 and got["contrastive"]["texts"][:2].sum() == 0


def test_cli_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "run"
    proc = run_here(["train.py", "recipe=demo", f"out={out}", "optim.lrr=1"])
    assert proc.returncode == 2
    assert "optim.lrr" in proc.stderr and "optim.lr" in proc.stderr
    assert not out.exists()


@pytest.mark.parametrize("args, augments", [
    (["data=world"], False),
    (["data=real"], True),
    (["data=world", "model.train_augment=true"], True),
])
def test_train_transform_augments_real_data_only_by_default(args, augments):
    """World objects sit on the patch grid: a random crop would move them off it."""
    import numpy as np
    import torch
    from PIL import Image
    from negft import models
    from negft.train.loop import train_transform

    cfg = load_config(["recipe=demo", *args])
    bundle = models.build("negft-tiny", "")
    image = Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8))
    transform = train_transform(cfg, bundle)
    torch.manual_seed(0)
    outs = [transform(image) for _ in range(4)]
    same = all(torch.equal(outs[0], o) for o in outs[1:])
    assert same != augments


@pytest.mark.parametrize("recipe", sorted(p.stem for p in RECIPES.glob("*.yaml")))
def test_every_recipe_loads_for_real_data_and_for_the_world(recipe):
    """Each recipe is written for its real data and runs on the world with the one override data=world."""
    cfg = load_config([f"recipe={recipe}"])
    assert cfg.streams, recipe
    if cfg.data == "real":
        for name, s in cfg.streams.items():
            assert s.manifest or s.urls, f"{recipe}: stream {name} names no real data"
            assert manifests.path(s.manifest).exists() or s.urls
    world = load_config([f"recipe={recipe}", "data=world"])
    assert world.data == "world"


def test_on_world_applies_only_on_the_world_and_the_command_line_wins():
    real = load_config(["recipe=negfull"])
    world = load_config(["recipe=negfull", "data=world"])
    mine = load_config(["recipe=negfull", "data=world", "optim.lr=5e-5", "tower=vt"])
    assert real.optim.lr == 1e-6 and real.train.precision == "bf16" and real.tower == "vt"
    assert world.optim.lr == 1e-3 and world.train.precision == "fp32" and world.tower == "t"
    assert mine.optim.lr == 5e-5 and mine.train.precision == "fp32" and mine.tower == "vt"


def test_max_steps_and_epochs_both_zero_name_both_keys():
    with pytest.raises(ConfigError) as e:
        load_config(["recipe=demo", "epochs=0", "max_steps=0"])
    assert "'epochs'" in str(e.value) and "'max_steps'" in str(e.value)


def _train_cli(capsys, *args) -> tuple[int, str]:
    """``train.py ARGS`` in this process: a refused recipe returns before any training code is imported."""
    from negft.commands import cli
    code = cli.main(["train", *args])
    return code, capsys.readouterr().err


def test_resume_latest_where_out_holds_no_run_exits_2_and_writes_nothing(tmp_path, capsys):
    for out in (tmp_path / "absent", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        code, err = _train_cli(capsys, "recipe=demo", f"out={out}", "resume=latest")
        assert code == 2 and f"out '{out}' holds no run to resume" in err and "leave resume out" in err
        assert not out.exists() or not any(out.iterdir())


def test_an_out_holding_another_run_is_refused_without_resume_and_with_resume_auto(tmp_path, capsys):
    from negft.config import to_yaml
    from negft.outdir import check_run_dir
    out = tmp_path / "run"
    out.mkdir()
    (out / "config.yaml").write_text(to_yaml(load_config(["recipe=negcap", "data=world", f"out={out}"])))
    (out / "ledger.jsonl").write_text('{"epoch": 0}\n')
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    # a new run: refused whatever it is (tests/test_outputs_kept.py); auto resumes this recipe's run with these
    # settings only
    code, err = _train_cli(capsys, "recipe=demo", f"out={out}")
    assert code == 2 and "already holds a run" in err and "resume=latest" in err and "overwrite=true" in err
    code, err = _train_cli(capsys, "recipe=demo", f"out={out}", "resume=auto")
    assert code == 2 and "holds a run of recipe 'negcap'" in err and "resume=latest" in err and "new out=" in err
    # the same recipe with other settings: the changed keys named
    code, err = _train_cli(capsys, "recipe=negcap", "data=world", f"out={out}", "epochs=7", "train.workers=3",
                           "train.dist_timeout_s=60", "resume=auto")
    assert code == 2 and "epochs: 3 -> 7" in err and "train.workers" not in err and "dist_timeout" not in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    # with resume=latest, or the same settings with resume=auto (a requeue), or overwrite=true: allowed
    check_run_dir(load_config(["recipe=demo", f"out={out}", "resume=latest"]))
    check_run_dir(load_config(["recipe=negcap", "data=world", f"out={out}", "train.workers=3", "resume=auto"]))
    check_run_dir(load_config(["recipe=demo", f"out={out}", "overwrite=true"]))
    # resume=auto where out holds no run: a new run
    check_run_dir(load_config(["recipe=demo", f"out={tmp_path / 'new'}", "resume=auto"]))


def test_the_collective_timeout_stays_out_of_the_cached_base_key():
    """train.dist_timeout_s stops a run and never changes a finished one's weights: a cached base model is found
    whatever it is."""
    from negft.config import world_dir
    from negft.train.world_base import base_key, base_recipe
    cfg = load_config(["recipe=demo"])
    pre = base_recipe(cfg)
    # the shards' digest given: the key's settings are what is tested, not the world this cache has drawn
    plain = base_key(pre, world_dir(cfg), shards="planted")
    pre.train.dist_timeout_s = 30.0
    assert base_key(pre, world_dir(cfg), shards="planted") == plain
    pre.train.grad_accum += 1         # a setting that changes the weights does change it
    assert base_key(pre, world_dir(cfg), shards="planted") != plain


def _config_leaves(node, prefix=""):
    """(dotted key, the object that holds it, its field or dict key) for every leaf of a config object."""
    import dataclasses
    items = ([(f.name, getattr(node, f.name)) for f in dataclasses.fields(node)] if dataclasses.is_dataclass(node)
             else list(node.items()))
    for name, value in items:
        if dataclasses.is_dataclass(value) or (isinstance(value, dict) and value):
            yield from _config_leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", node, name


def _another(value):
    """A value other than ``value``, of its kind."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, list):
        return value + ["x"]
    if isinstance(value, dict):
        return {**value, "x": 1}
    assert value is None, value
    return 1


@pytest.mark.parametrize("recipe", ["base", "demo"])
def test_every_setting_that_shapes_the_base_changes_its_cache_key(recipe, monkeypatch):
    """The world base's cache key hashes every leaf of its resolved recipe but ``BASE_KEY_IGNORES`` and the loss
    blocks its objective does not read: changing any other key (the objective and its blocks among them) changes
    it; changing an ignored one (eval.*, patch.*, out, another objective's block, ...) does not. The leaves are enumerated from the config object, so a key added to the config
    later is covered. ``demo``: the demo's recipe as if it were a base (its loss blocks set)."""
    import dataclasses
    from negft.config import world_dir
    from negft.losses import BLOCK_CFGS, OBJECTIVES
    from negft.train import world_base
    monkeypatch.setattr(world_base, "shards_digest", lambda *a: "shards")
    cfg = load_config(["recipe=demo"])
    pre = world_base.base_recipe(cfg) if recipe == "base" else cfg
    plain = world_base.base_key(pre, world_dir(cfg))
    seen = {"shapes": [], "ignored": []}
    for key, holder, name in _config_leaves(pre):
        is_dict = not dataclasses.is_dataclass(holder)
        old = holder[name] if is_dict else getattr(holder, name)
        if is_dict:
            holder[name] = _another(old)
        else:
            setattr(holder, name, _another(old))
        changed = world_base.base_key(pre, world_dir(cfg)) != plain
        if is_dict:
            holder[name] = old
        else:
            setattr(holder, name, old)
        unread = [f"loss.{b}" for b in BLOCK_CFGS if b not in OBJECTIVES[pre.loss.name].blocks()]
        ignored = any(key == i or key.startswith(i + ".") for i in (*world_base.BASE_KEY_IGNORES, *unread))
        assert changed != ignored, f"{key}: {'ignored but changes' if ignored else 'shapes the base but not'} the key"
        seen["ignored" if ignored else "shapes"].append(key)
    assert world_base.base_key(pre, world_dir(cfg)) == plain
    loss_keys = [k for k in seen["shapes"] if k.startswith("loss.")]
    assert {"loss.name", "loss.guard.caption"} | ({"loss.negfull.t2i_options"} if recipe == "demo" else set()) \
        <= set(loss_keys)
    assert {"out", "eval.split", "eval.suite", "patch.alpha", "train.log_every", "loss.relcomp.margin",
            "loss.ceclip.cmr_weight"} <= set(seen["ignored"])
    assert {"optim.lr", "train.workers", "seed", "model.world_arch"} <= set(seen["shapes"])


def test_synthetic_batches_are_refused_for_terms_that_read_batch_fields():
    """train.synthetic draws random images and tokens and no term's fields: an objective whose terms read some is
    refused before the run (naming them), not a KeyError in its first step; plain contrastive training is not."""
    with pytest.raises(ConfigError, match=r"train.synthetic=true .* loss.name=ceclip's terms read \(ceclip_slots\)"):
        load_config(["recipe=ceclip", "train.synthetic=true"])
    with pytest.raises(ConfigError, match=r"negclip's terms read \(hard_caption, negative_image_caption, "):
        load_config(["recipe=negclip", "train.synthetic=true"])
    assert load_config(["recipe=negcap", "train.synthetic=true"]).train.synthetic
