"""The weights a run starts from, and the world's base model: the result of the ``world-pretrain`` recipe (or
whichever recipe ``model.world_pretrained`` names) on the run's world, found in this order:

1. the cache (``world.cache``/base/<recipe>-s<seed>-<size>-<key>/model), where an earlier run put it;
2. shipped with negft (``negft/world/bases/``), where ``bases.json`` records a base made for exactly this key
   (recipe settings and the shards' bytes): the demo's base, so that a first ``make demo`` does not spend half its
   time pretraining, and so that every machine fine-tunes the same base;
3. trained here, then cached.

A base is kept in fp16 (the shipped one fits the package that way, and a base trained here is rounded the same way,
so one key always means one set of weights); it loads into fp32 parameters."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from negft import models
from negft.cache_lock import cache_lock
from negft.config import Config, load_config, world_dir
from negft.fields import leaves
from negft.io import as_umask_allows, atomic_path, sha256_file
from negft.losses import BLOCK_CFGS, OBJECTIVES
from negft.train.engine import barrier
from negft.train.loop import Placement, resumable, train
from negft.world.generator import ensure_world

SHIPPED = Path(__file__).resolve().parents[1] / "world" / "bases"     # package data


def base_weights(cfg: Config, where: Placement) -> str:
    """The weights a run starts from: ``model.pretrained`` for real data; on the world, ``model.world_pretrained``
    as a local-dir or file, or as a recipe (a name in negft/recipes/ or a .yaml file) whose result is cached
    (``world_base``); "" for random weights."""
    if cfg.data != "world":
        return cfg.model.pretrained
    source = cfg.model.world_pretrained
    is_recipe = source.endswith((".yaml", ".yml")) or not (source.startswith(models.LOCAL_DIR) or Path(source).exists())
    return world_base(cfg, where) if source and is_recipe else source


# the settings that never change a finished base's weights (not config.RUN_KEYS_IGNORED, what a relaunch into the
# same out may change): the recipe's name (the cache directory's name holds
# it), where the run is written and resumed from (and whether it replaces one), what is evaluated, patched or logged,
# and the keys that only stop a run (max_bad_steps, max_skipped, dist_timeout_s); on_world and smoke are applied
# already (their values are counted where they land), and world.cache is a path (the world's seed and size are counted, and its shards' bytes).
# Any other key is counted, a new one too: a key wrongly counted costs one retraining, one wrongly left out a
# stale base
BASE_KEY_IGNORES = ("recipe", "out", "resume", "overwrite", "smoke", "eval", "patch", "log", "on_world",
                    "world.cache", "train.log_every", "train.max_bad_steps", "train.max_skipped", "train.dist_timeout_s")


# settings added after bases were shipped, at the value that does what negft did before them: left out of the key
# there, so the bases keyed before them keep their names (matched on the key's last part for per-stream keys)
KEYED_WHEN_SET = {"redraw_negatives": "none", "optim.decay_all": False}


def _suffix(key: str) -> str:
    return key.rsplit(".", 1)[-1] if key.startswith("streams.") else key


def base_recipe(cfg: Config) -> Config:
    """The recipe ``model.world_pretrained`` names, on ``cfg``'s world."""
    pre = load_config([f"recipe={cfg.model.world_pretrained}", "data=world"])
    pre.world = copy.deepcopy(cfg.world)
    return pre


def base_key(pre: Config, world: Path, shards: str | None = None) -> str:
    """The cache key of a world base: every setting of its resolved recipe that can change its weights (all but
    ``BASE_KEY_IGNORES`` and the ``loss`` blocks its objective does not read: the objective and its blocks, the
    model, streams, optimiser and training settings, the seed, ...) and the bytes of the shards it trains on
    (``shards``: their digest where the caller has it, ``recorded_shards``). A key added to the config enters it by
    itself; a new objective's block does not.

    Bases cached by negft versions that keyed only a list of settings are trained once more (their key
    changed); so is every cached base when a setting that shapes the weights is added."""
    reads = OBJECTIVES[pre.loss.name].blocks() if pre.loss.name in OBJECTIVES else tuple(BLOCK_CFGS)
    unread = [f"loss.{b}" for b in BLOCK_CFGS if b not in reads]
    decides = {k: v for k, v in leaves(dataclasses.asdict(pre)).items()
               if not any(k == i or k.startswith(i + ".") for i in (*BASE_KEY_IGNORES, *unread))
               and KEYED_WHEN_SET.get(_suffix(k), object()) != v}      # at their off value: older keys stay
    decides["shards"] = shards or shards_digest(world, base_splits(pre))
    return hashlib.sha256(json.dumps(decides, sort_keys=True).encode()).hexdigest()[:12]


def base_splits(pre: Config) -> set[str]:
    """The world's training splits a base recipe reads."""
    return {s.world_split for s in pre.streams.values()}


def shards_digest(world: Path, splits) -> str:
    """sha256 over a world's training shards in ``splits``: a generator change that leaves them
    byte-identical (new probe files, say) keeps the base model trained on them."""
    h = hashlib.sha256()
    for split in sorted(splits):
        if not (world / split).is_dir():
            raise FileNotFoundError(f"the world '{world}' has not drawn its '{split}' split: build it first "
                                    "(negft.world.generator.ensure_world)")
        for shard in sorted((world / split).glob("*.tar")):
            h.update(shard.name.encode())
            with open(shard, "rb") as f:
                while chunk := f.read(1 << 22):
                    h.update(chunk)
    return h.hexdigest()


def cache_name(pre: Config, key: str) -> str:
    """The folder name of a world base: its recipe, the world's seed and size, and its key."""
    return f"{Path(pre.recipe).stem}-s{pre.world.seed}-{pre.world.size}-{key}"


def shipped_base(name: str, registry: Path | None = None) -> Path | None:
    """The shipped base folder called ``name`` (a ``local-dir`` layout), if ``registry/bases.json`` lists it and
    its weights' SHA256 is the one recorded there; a listed base whose file was changed is refused loudly."""
    registry = SHIPPED if registry is None else registry
    index = registry / "bases.json"
    if not index.exists():
        return None
    entry = json.loads(index.read_text()).get(name)
    if entry is None:
        return None
    folder = registry / name
    got = sha256_file(folder / models.WEIGHTS_FILE)
    if got != entry["sha256"]:
        raise RuntimeError(f"the shipped base '{folder}' does not match its record in {index} (sha256 {got}, "
                           f"recorded {entry['sha256']}): reinstall negft, or delete the entry to train it here")
    return folder


def recorded_shards(world: Path, splits, registry: Path | None = None) -> str | None:
    """The digest of the training ``splits`` of ``world`` as a shipped base records it, where the world has not
    drawn them: a run that finds its base needs only its own splits (the demo never draws the 10,240 pretraining
    images). A world's shards are fixed by its seed, size and generator version (the world cache's own key), so a
    record of the same three stands for them. None where the world has them (they are read) or no record matches."""
    meta = json.loads((world / "world.json").read_text())
    if set(splits) <= set(meta["shards"]):
        return None
    index = (SHIPPED if registry is None else registry) / "bases.json"
    entries = json.loads(index.read_text()).values() if index.exists() else ()
    same = {"seed": meta["seed"], "size": meta["size"], "generator_version": meta["generator_version"]}
    return next((e["shards"] for e in entries if e.get("world") == same), None)


def round_to_fp16(model_dir: Path) -> None:
    """Store a base's floating-point weights in fp16 (module docstring: one key, one set of weights)."""
    path = model_dir / models.WEIGHTS_FILE
    state = {k: v.to(torch.float16) if v.is_floating_point() else v for k, v in load_file(str(path)).items()}
    save_file(state, str(path))
    as_umask_allows(path)                   # safetensors writes 0600


def world_base(cfg: Config, where: Placement) -> str:
    """``local-dir:`` of the world base that recipe ``model.world_pretrained`` trains on ``cfg``'s world: cached,
    shipped, or trained here and cached (module docstring). A base training that was stopped (SIGTERM, a kill)
    continues from its last complete checkpoint when the same command runs again. Jobs that need the same base at
    once train it once: the first holds the entry's lock, the others wait for it (``negft.cache_lock``)."""
    rank = where.rank
    pre = base_recipe(cfg)
    world = world_dir(cfg)
    recorded = recorded_shards(world, base_splits(pre))
    if recorded is not None and (found := _found(cfg, pre, base_key(pre, world, recorded), rank)):
        return found
    ensure_world(pre, rank, base_splits(pre))       # the splits it trains on, drawn where the world lacks them
    barrier()
    key = base_key(pre, world)
    if found := _found(cfg, pre, key, rank):
        return found
    name = cache_name(pre, key)
    base = Path(cfg.world.cache).expanduser() / "base" / name
    model_dir = base / "model"
    with cache_lock(base, f"the base model {name}", rank, collective=True):
        if not (model_dir / models.WEIGHTS_FILE).exists():      # another job may have cached it while we waited
            if rank == 0:
                print(f"[negft] base model not cached: training recipe={pre.recipe} into {base}", flush=True)
            pre.out = str(base / "run")
            pre.resume = "latest" if resumable(Path(pre.out)) else None
            run_dir = train(pre, base_weights(pre, where), where)       # the same world: cfg's
            if rank == 0:
                last = sorted((run_dir / "checkpoints").glob("epoch_*"), key=lambda p: int(p.name.split("_")[1]))[-1]
                kept = f"its training run '{base / 'run'}' is kept, and the same command caches the model from it"
                with atomic_path(model_dir, directory=True, kept=kept) as staged:
                    shutil.copytree(last, staged, ignore=shutil.ignore_patterns("state"), dirs_exist_ok=True)
                    round_to_fp16(staged)
                print(f"[negft] base model cached: {model_dir}", flush=True)
            barrier()
    return models.LOCAL_DIR + str(model_dir)


def _found(cfg: Config, pre: Config, key: str, rank: int) -> str | None:
    """``local-dir:`` of the base of ``key`` in the cache, else the shipped one, else None."""
    name = cache_name(pre, key)
    model_dir = Path(cfg.world.cache).expanduser() / "base" / name / "model"
    if (model_dir / models.WEIGHTS_FILE).exists():
        return models.LOCAL_DIR + str(model_dir)
    shipped = shipped_base(name)
    if shipped is None:
        return None
    if rank == 0:
        print(f"[negft] base model: the one shipped with negft for recipe={pre.recipe} on this world "
              f"(negft/world/bases/{name}; `python train.py recipe={pre.recipe}` makes it)", flush=True)
    return models.LOCAL_DIR + str(shipped)
