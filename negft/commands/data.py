"""``negft data ...``: build the embedded world, convert released files, make negatives, check datasets. Each
sub-command's keys are one dataclass: ``WorldKeys``, ``CheckKeys``, and each converter's in
``negft.commands.convert_keys`` (positional words fill its required keys in order, key=value words the others).
"""
from __future__ import annotations

import dataclasses
import importlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from negft.commands.convert_keys import CONVERTERS
from negft.commands.keys import (BAD_INPUT, fail, help_text, key, outcome, parse, required, sections, synopsis,
                                 wants_help, wrap)
from negft.config import WORLD_SIZES, ConfigError, WorldCfg
from negft.fields import choice

README = (("Training on real data", "convert, negate, relcomp, negatives, hard-images, check; $NEGFT_DATA; "
           "negft/data_manifests/"),
          ("The embedded world", "negft data world"))


@dataclass(kw_only=True)
class WorldKeys:
    """Build the embedded world: its scenes drawn from the seed, its splits and probe files."""
    out: str = key(doc="the world's folder")
    seed: int = key(WorldCfg.seed, "the world's seed: the same seed draws the same world")
    size: str = choice(WorldCfg.size, WORLD_SIZES, doc="how many scenes (negft/world/generator.py SIZES)")
    workers: Optional[int] = key(None, "processes that draw it; empty: one per core")


@dataclass(kw_only=True)
class CheckKeys:
    """Check that a dataset of negft/data_manifests/ is in place under $NEGFT_DATA, whole and counted."""
    manifest: str = key(doc="a manifest's name (negft/data_manifests/NAME.yaml) or all")
    checksums: bool = key(False, "true: also hash every file against the manifest's sums")
    counts: bool = key(True, "false: skip counting the samples of every shard")


def converter_keys(name: str) -> type:
    """The keys of converter ``name`` (``negft.commands.convert_keys``)."""
    return CONVERTERS[name][1]


def _converter(name: str):
    module, func = CONVERTERS[name][0].split(":")
    return getattr(importlib.import_module(module), func)


def formats() -> list[str]:
    return [n.split(" ", 1)[1] for n in CONVERTERS if n.startswith("convert ")]


def synopses() -> list[tuple[str, str]]:
    """``negft``'s lines for ``negft data``."""
    makers = [n for n in CONVERTERS if not n.startswith("convert ")]
    return [(synopsis("negft data world", WorldKeys, ("seed", "size")), "build the embedded world"),
            ("negft data convert FORMAT ... out=DIR", f"released files -> shards; FORMAT: {', '.join(formats())}"),
            (f"negft data {' | '.join(makers)} ...", "NegCap/NegMCQ, RelComp, hard captions, hard images"),
            (synopsis("negft data check", CheckKeys, positional=True), "a dataset's presence and counts")]


def usage() -> str:
    lines = ["usage:", f"  {synopsis('negft data world', WorldKeys)}",
             f"  {synopsis('negft data check', CheckKeys, positional=True)}"]
    lines += [f"  {synopsis(f'negft data {name}', cls, positional=True)}" for name, (_, cls) in CONVERTERS.items()]
    return "\n".join(lines)


def help_() -> str:
    """``negft data --help``: the sub-commands and where they are documented."""
    return "\n".join([usage(), "", wrap("negft data SUB --help (negft data convert FORMAT --help): its keys, their "
                                        "defaults and what each means.", 0),
                      "README.md sections:", *sections(README)])


def sub_help(name: str) -> str:
    """``negft data SUB --help``: the keys of one sub-command."""
    cls = {"world": WorldKeys, "check": CheckKeys}.get(name) or converter_keys(name)
    what = (cls.__doc__ or "").strip()
    module = CONVERTERS[name][0].split(":")[0].replace(".", "/") + ".py" if name in CONVERTERS else ""
    where = f"negft/commands/convert_keys.py ({cls.__name__}), {module}" if module else "negft/commands/data.py"
    return help_text(synopsis(f"negft data {name}", cls, positional=name != "world"),
                     f"{what} Required keys may be given as bare words, in this order.", cls, README, where)


def _sub(argv: list[str]) -> tuple[str, list[str]]:
    """(the sub-command's name, its words): ``convert FORMAT`` is one name."""
    return (" ".join(argv[:2]), argv[2:]) if argv[0] == "convert" else (argv[0], argv[1:])


def main(argv: list[str]) -> int:
    """``negft data SUB ARGS``: 0 when done (``check``: 1 when a dataset is missing or damaged), 2 for bad input,
    1 for a failed write."""
    if not argv or argv[0] == "help":
        print(help_() if argv else usage())
        return 0 if argv else 2
    name, words = _sub(argv)
    known = name in ("world", "check") or name in CONVERTERS
    if wants_help(argv):
        print(sub_help(name) if known else help_())
        return 0
    if not known:
        if argv[0] == "convert":
            return fail(f"unknown format '{' '.join(argv[1:2])}' for negft data convert. Formats: "
                        f"{', '.join(formats())}")
        return fail(f"unknown data command '{argv[0]}'.\n{usage()}")
    try:
        if name in ("world", "check"):
            keys = parse(WorldKeys if name == "world" else CheckKeys, words, positional=name == "check")
        else:
            keys = parse(converter_keys(name), words, positional=True)
    except ConfigError as e:
        return fail(str(e))
    if name == "world":
        return outcome(lambda: world(keys), lambda line: line)
    if name == "check":
        try:
            return check(keys)
        except BAD_INPUT as e:
            return fail(str(e))
    return outcome(lambda: _converter(name)(**given(keys)),
                   lambda result: json.dumps({k: result[k] for k in ("out", "counts", "skipped", "images_per_second")
                                              if k in result}))


def given(keys) -> dict:
    """A converter's arguments: its required keys and those the command line set to other than the default (the
    rest its function's own defaults, so that the command its manifest records names only what was changed)."""
    return {f.name: getattr(keys, f.name) for f in dataclasses.fields(keys)
            if required(f) or getattr(keys, f.name) != f.default}


def world(keys: WorldKeys) -> str:
    from negft.world.generator import build_world
    meta = build_world(Path(keys.out), seed=keys.seed, size=keys.size, workers=keys.workers)
    return json.dumps({"out": keys.out, "counts": meta.get("counts"),
                       "images_per_second": meta.get("images_per_second")})


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
