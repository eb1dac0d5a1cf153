"""The world written in released benchmark layouts: one module per format, each a ``write(split_dir, main,
zeroshot, seed)`` that turns the world's annotated probe records into that benchmark's files as its authors
released them (ARO's JSON, SugarCrepe's JSON, Winoground's ``examples.jsonl``, ...). The probes read only
released layouts, so ``make demo`` runs exactly the readers a real evaluation runs.

Besides the ``FORMATS`` a world build writes, ``negbench_csv``, ``img2dataset``, ``coco`` and ``visual_genome``
write, on demand, a small example of a released training-data file (world images, planted bad rows) that a
converter in ``negft.convert`` reads: the converters' tests and benches convert them.

A writer draws any randomness from its own generator (``rng(seed, split_dir, name)``), never from the
world's, so adding a format changes no other file of the world.
"""
from __future__ import annotations

import importlib
import zlib
from pathlib import Path

import numpy as np

# the modules a world build writes, in this order
FORMATS: tuple[str, ...] = ("sugarcrepe", "winoground", "probe_rcb", "vlu", "aro", "zeroshot_folder",
                              "image_features", "sugarcrepe_pp", "mmvp_vlm", "crepe", "spec", "valse", "ccneg",
                              "whatsup", "negrefcocog")


def rng(seed: int, split_dir: Path, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(Path(split_dir).name.encode()), zlib.crc32(name.encode())])


def write_all(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    for name in FORMATS:
        importlib.import_module(f"negft.world.formats.{name}").write(Path(split_dir), main, zeroshot, seed)
