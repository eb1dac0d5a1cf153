"""The world base: shipped with negft where its key matches (recipe settings and shards), trained here where it
does not; kept in fp16 either way."""
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from negft import models
from negft.config import load_config, world_dir
from negft.io import sha256_file
from negft.train import world_base as wb
from negft.world.generator import GENERATOR_VERSION


def _ship(registry: Path, name: str, **record) -> Path:
    """A fake shipped base called ``name`` in ``registry`` (weights that are not a model: only paths are read),
    with ``record`` in its bases.json entry."""
    folder = registry / name
    folder.mkdir(parents=True)
    save_file({"w": torch.zeros(2, dtype=torch.float16)}, str(folder / models.WEIGHTS_FILE))
    (folder / models.CONFIG_FILE).write_text("{}")
    (registry / "bases.json").write_text(json.dumps({name: {"sha256": sha256_file(folder / models.WEIGHTS_FILE),
                                                            **record}}))
    return folder


def _here(cfg) -> wb.Placement:
    """Rank 0 of one, on the test's world (what ``setup`` gives a lone process, without its process group)."""
    return wb.Placement(0, 1, world_dir(cfg))


def _cfg(cache, base_recipe, *more):
    return load_config(["recipe=demo", "data=world", "world.size=tiny", f"world.cache={cache}",
                        f"model.world_pretrained={base_recipe}", *more])


@pytest.fixture
def base_yaml(tmp_path):
    import yaml
    from negft.config import RECIPES
    recipe = yaml.safe_load((RECIPES / "world-pretrain.yaml").read_text())
    recipe["epochs"], recipe["train"] = 1, {"steps_per_epoch": 1, "workers": 0}
    path = tmp_path / "world-pretrain.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_a_shipped_base_with_the_runs_key_is_what_the_run_loads(cache, base_yaml, tmp_path, monkeypatch):
    cfg = _cfg(cache, base_yaml)
    pre = wb.base_recipe(cfg)
    name = wb.cache_name(pre, wb.base_key(pre, world_dir(cfg)))
    folder = _ship(tmp_path / "bases", name)
    monkeypatch.setattr(wb, "SHIPPED", tmp_path / "bases")
    monkeypatch.setattr(wb, "train", lambda *a, **k: pytest.fail("a shipped base was trained again"))
    assert wb.world_base(cfg, _here(cfg)) == models.LOCAL_DIR + str(folder)
    # a shipped file that is not the one recorded is refused, naming both digests
    save_file({"w": torch.ones(2, dtype=torch.float16)}, str(folder / models.WEIGHTS_FILE))
    with pytest.raises(RuntimeError, match="does not match its record"):
        wb.world_base(cfg, _here(cfg))


def test_a_base_found_by_its_record_needs_no_pretraining_split(cache, base_yaml, tmp_path, monkeypatch):
    """The demo's path: its world has not drawn the pretraining split, and the shipped base's record of those
    shards (the same seed, size and generator) finds the base without drawing them. A record of another generator
    does not stand for them: the split is drawn, and the base is found by its shards' bytes."""
    full = _cfg(cache, base_yaml)
    pre = wb.base_recipe(full)
    name = wb.cache_name(pre, wb.base_key(pre, world_dir(full)))
    digest = wb.shards_digest(world_dir(full), wb.base_splits(pre))
    part = tmp_path / "cache" / world_dir(full).name         # the same world, its pretraining split not drawn
    shutil.copytree(world_dir(full), part, ignore=shutil.ignore_patterns("pretrain"))
    meta = json.loads((part / "world.json").read_text())
    del meta["shards"]["pretrain"]
    (part / "world.json").write_text(json.dumps(meta))
    world = {"seed": 0, "size": "tiny", "generator_version": GENERATOR_VERSION}
    folder = _ship(tmp_path / "bases", name, world=world, shards=digest)
    monkeypatch.setattr(wb, "SHIPPED", tmp_path / "bases")
    monkeypatch.setattr(wb, "train", lambda *a, **k: pytest.fail("a shipped base was trained again"))
    cfg = _cfg(tmp_path / "cache", base_yaml)
    assert wb.world_base(cfg, _here(cfg)) == models.LOCAL_DIR + str(folder)
    assert not (part / "pretrain").exists()
    index = tmp_path / "bases" / "bases.json"
    index.write_text(index.read_text().replace(GENERATOR_VERSION, "world-0"))
    assert wb.world_base(cfg, _here(cfg)) == models.LOCAL_DIR + str(folder)
    assert wb.shards_digest(part, {"pretrain"}) == digest          # drawn now, the same bytes


def test_a_changed_pretraining_recipe_trains_its_own_base_and_caches_it_in_fp16(cache, base_yaml, tmp_path,
                                                                              monkeypatch):
    cfg = _cfg(cache, base_yaml)
    pre = wb.base_recipe(cfg)
    _ship(tmp_path / "bases", wb.cache_name(pre, wb.base_key(pre, world_dir(cfg))))
    monkeypatch.setattr(wb, "SHIPPED", tmp_path / "bases")
    base_yaml.write_text(base_yaml.read_text().replace("lr: 0.002", "lr: 0.003"))
    trained = []

    def train(pre, weights, where):
        trained.append(pre.optim.lr)
        epoch = Path(pre.out) / "checkpoints" / "epoch_1"
        epoch.mkdir(parents=True)
        save_file({"w": torch.full((2,), 1 / 3)}, str(epoch / models.WEIGHTS_FILE))
        (epoch / models.CONFIG_FILE).write_text("{}")
        return Path(pre.out)
    monkeypatch.setattr(wb, "train", train)
    got = wb.world_base(_cfg(cache, base_yaml), _here(cfg))
    assert trained == [0.003] and str(tmp_path / "bases") not in got
    weights = load_file(str(Path(got.removeprefix(models.LOCAL_DIR)) / models.WEIGHTS_FILE))["w"]
    assert weights.dtype == torch.float16 and weights[0].item() == torch.tensor(1 / 3).half().item()
    shutil.rmtree(Path(got.removeprefix(models.LOCAL_DIR)).parent)      # the session's cache stays as it was


def test_the_shipped_demo_base_is_the_demo_recipes_base(monkeypatch):
    """bases.json's demo entry: its file is the one recorded, and its key is the key the demo's base recipe has
    today on the world it was trained on (its shards' digest as recorded). A change to world-pretrain.yaml or
    to a setting that shapes a base fails here: ship the base again (scripts/ship_world_base.py), or accept
    that the demo trains its base."""
    entries = json.loads((wb.SHIPPED / "bases.json").read_text())
    [(name, entry)] = [(n, e) for n, e in entries.items() if e["recipe"] == "world-pretrain"
                       and e["world"]["seed"] == 0 and e["world"]["size"] == "demo"]
    # the demo finds it without drawing the pretraining split where the record names today's generator
    # (wb.recorded_shards); after a generator change, check the split's digest (make test-slow) and record it
    assert entry["world"]["generator_version"] == GENERATOR_VERSION
    assert wb.shipped_base(name) == wb.SHIPPED / name
    assert (wb.SHIPPED / name / models.WEIGHTS_FILE).stat().st_size <= 25e6
    cfg = load_config(["recipe=demo"])
    pre = wb.base_recipe(cfg)
    monkeypatch.setattr(wb, "shards_digest", lambda *a: entry["shards"])
    assert wb.cache_name(pre, wb.base_key(pre, world_dir(cfg))) == name


@pytest.mark.slow
def test_the_shipped_demo_bases_record_is_the_demo_worlds_pretraining_shards(tmp_path):
    """What the demo trusts when it does not draw the pretraining split: the record's digest is that of the split
    today's generator draws (10,240 images)."""
    from negft.world.generator import build_world
    [entry] = [e for e in json.loads((wb.SHIPPED / "bases.json").read_text()).values()
               if e["world"] == {"seed": 0, "size": "demo", "generator_version": GENERATOR_VERSION}]
    build_world(tmp_path, seed=0, size="demo", splits=("pretrain",), progress=False)
    assert wb.shards_digest(tmp_path, {"pretrain"}) == entry["shards"]
