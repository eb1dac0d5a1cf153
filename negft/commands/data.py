"""``negft data ...``: build the embedded world, convert released files, make negatives, check datasets. Each
sub-command's keys are one dataclass: ``WorldKeys``, ``CheckKeys``, and for each converter the one its function's
signature declares (``CONVERTERS``: positional words fill its leading parameters, key=value words its keywords).
"""
from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from negft.commands.keys import fail, key, parse, sections, wants_help, wrap, write_failed
from negft.config import WORLD_SIZES, ConfigError, WorldCfg
from negft.fields import choice

# `negft data SUB ...` whose keys are a converter's parameters (module:function; negft/convert/)
CONVERTERS = {
    "convert negbench-negcap": "negft.convert.negbench:convert_negcap",
    "convert negbench-mcq": "negft.convert.negbench:convert_mcq",
    "convert img2dataset": "negft.convert.img2dataset:convert",
    "convert coco": "negft.convert.coco:convert",
    "convert ccneg": "negft.convert.ccneg:convert",
    "convert negclip-coco": "negft.convert.negclip_coco:convert",
    "convert negationclip-coco": "negft.convert.negationclip_coco:convert",
    "convert ccneg-train": "negft.convert.ccneg_train:convert",
    "convert tripletclip-data": "negft.convert.tripletclip_data:convert",
    "convert ceclip-coco": "negft.convert.ceclip_coco:convert",
    "negate": "negft.convert.negate:negate",
    "relcomp": "negft.convert.relcomp_vg:relcomp",
    "negatives": "negft.convert.negatives:negatives",
    "hard-images": "negft.convert.hard_images:hard_images",
}
README = (("Training on real data", "convert, negate, relcomp, negatives, hard-images, check; $NEGFT_DATA; "
           "negft/data_manifests/"),
          ("The embedded world", "negft data world"))


@dataclass(kw_only=True)
class WorldKeys:
    """The keys of ``negft data world``."""
    out: str = key(doc="the world's folder")
    seed: int = key(WorldCfg.seed, "the world's seed: the same seed draws the same world")
    size: str = choice(WorldCfg.size, WORLD_SIZES, doc="how many scenes (negft/world/generator.py SIZES)")
    workers: Optional[int] = key(None, "processes that draw it; empty: one per core")


@dataclass(kw_only=True)
class CheckKeys:
    """The keys of ``negft data check``."""
    manifest: str = key(doc="a manifest's name (negft/data_manifests/NAME.yaml) or all")
    checksums: bool = key(False, "true: also hash every file against the manifest's sums")
    counts: bool = key(True, "false: skip counting the samples of every shard")


def converter_keys(name: str) -> type:
    """The keys of converter ``name``: its function's parameters, the ones without a default required (its
    docstring says what each means)."""
    fn = _converter(name)
    params = [p for p in inspect.signature(fn).parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return dataclasses.make_dataclass(
        fn.__name__, [(p.name, str, key() if p.default is inspect.Parameter.empty else key(p.default))
                      for p in params], kw_only=True)


def _converter(name: str):
    module, func = CONVERTERS[name].split(":")
    return getattr(importlib.import_module(module), func)


def usage() -> str:
    lines = ["usage:", "  negft data world out=DIR [seed=N] [size=tiny|demo|full] [workers=N]",
             "  negft data check MANIFEST|all [checksums=false] [counts=true]"]
    for name in CONVERTERS:
        try:
            fields = dataclasses.fields(converter_keys(name))
        except (ImportError, AttributeError):
            continue
        words = [f.name.upper() if f.default is dataclasses.MISSING else f"[{f.name}={f.default}]" for f in fields]
        lines.append(f"  negft data {name} {' '.join(words)}")
    return "\n".join(lines)


def help_() -> str:
    """``negft data --help``: the sub-commands and where they are documented."""
    return "\n".join([usage(), "", wrap("keys: each converter's function, which negft/commands/data.py's CONVERTERS "
                                        "names, documents its keys in its docstring.", 0),
                      "README.md sections:", *sections(README)])


def main(argv: list[str]) -> int:
    """``negft data SUB ARGS``: 0 when done (``check``: 1 when a dataset is missing or damaged), 2 for bad input,
    1 for a failed write."""
    if not argv or argv[0] == "help" or wants_help(argv):
        print(help_() if argv else usage())
        return 0 if argv else 2
    from negft.io import WriteError
    name = " ".join(argv[:2]) if argv[0] == "convert" else argv[0]
    words = argv[2:] if argv[0] == "convert" else argv[1:]
    try:
        if argv[0] == "world":
            return world(parse(WorldKeys, words))
        if argv[0] == "check":
            return check(parse(CheckKeys, words, positional=True))
        if name not in CONVERTERS:
            formats = [n.split(" ", 1)[1] for n in CONVERTERS if n.startswith("convert ")]
            if argv[0] == "convert":
                return fail(f"unknown format '{' '.join(argv[1:2])}' for negft data convert. "
                            f"Formats: {', '.join(formats)}")
            return fail(f"unknown data command '{argv[0]}'.\n{usage()}")
        keys = parse(converter_keys(name), words, positional=True)
        result = _converter(name)(**dataclasses.asdict(keys))
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError) as e:
        return fail(str(e))
    except WriteError as e:
        return write_failed(e)
    print(json.dumps({k: result[k] for k in ("out", "counts", "skipped", "images_per_second") if k in result}))
    return 0


def world(keys: WorldKeys) -> int:
    from negft.world.generator import build_world
    meta = build_world(Path(keys.out), seed=keys.seed, size=keys.size, workers=keys.workers)
    print(json.dumps({"out": keys.out, "counts": meta.get("counts"), "images_per_second": meta.get("images_per_second")}))
    return 0


def check(keys: CheckKeys) -> int:
    """Each dataset's problems, or ok; exit 1 when any has one."""
    from negft.data import manifests
    from negft.data.check import check as problems_of
    wanted = manifests.names() if keys.manifest == "all" else [keys.manifest]
    problems = {name: problems_of(name, counts=keys.counts, checksums=keys.checksums) for name in wanted}
    print(f"data root: {manifests.data_root()} (NEGFT_DATA)")
    for name, found in problems.items():
        print(f"{'MISSING' if found else 'ok':8s} {name}")
        for p in found:
            print(f"         - {p}")
    return 1 if any(problems.values()) else 0
