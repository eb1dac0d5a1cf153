"""The world written in released benchmark layouts: one module per format, each a ``write(split_dir, main,
zeroshot, seed)`` that turns the world's annotated probe records into that benchmark's files as its authors
released them (ARO's JSON, SugarCrepe's JSON, Winoground's ``examples.jsonl``, ...). The probes read only
released layouts, so ``make demo`` runs exactly the readers a real evaluation runs.

Besides the ``FORMATS`` a world build writes, ``negbench_csv``, ``img2dataset``, ``coco``, ``visual_genome`` and
``negationclip_coco``, ``negclip_coco``, ``ccneg_train`` and ``tripletclip_data`` write, on demand, a small example of
a released training-data file (world images, planted bad rows) that a converter in ``negft.convert`` reads: the
converters' tests and benches convert them.

A writer draws any randomness from its own generator (``rng(seed, split_dir, name)``), never from the
world's, so adding a format changes no other file of the world.
"""
from __future__ import annotations

import importlib
import io
import os
import shutil
import zlib
from pathlib import Path

import numpy as np
from PIL import Image

# the modules a world build writes, in this order
FORMATS: tuple[str, ...] = ("sugarcrepe", "winoground", "probe_rcb", "vlu", "aro", "zeroshot_folder",
                              "image_features", "sugarcrepe_pp", "mmvp_vlm", "crepe", "spec", "valse", "ccneg",
                              "whatsup", "negrefcocog", "svo_probes", "vl_checklist", "imagecode", "eqben")


# formats written from a split's first SAMPLE probe images only (the tiny world has fewer, so all of its): every
# format's files are scored after every epoch of every run on the world, and the eight benchmarks added with
# world-12 in full (1,500 images a split on the demo world) took the demo's evaluations from 43 to 88 seconds at
# epoch 0 and from 11 to 20-27 s after each epoch; SugarCrepe's seven splits are the largest text set of the rest.
# 250 images (an example each) keep a headline number within about ±6 points (95% interval). ARO keeps every
# image: its VG-Attribution macro average needs 25 rows per attribute pair.
SAMPLED = ("sugarcrepe", "sugarcrepe_pp", "mmvp_vlm", "crepe", "valse", "ccneg", "whatsup", "negrefcocog",
           "svo_probes", "vl_checklist", "imagecode", "eqben")
SAMPLE = 250


def rng(seed: int, split_dir: Path, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(Path(split_dir).name.encode()), zlib.crc32(name.encode())])


def link(split_dir: Path, target: str, link: str) -> None:
    """``link`` (relative to ``split_dir``) pointing at the world file ``target`` (relative too): a relative
    symbolic link, so that a released layout's names cost no copy and the pixels stay the world's; a copy where
    links are not possible."""
    dst = split_dir / link
    if dst.exists() or dst.is_symlink():
        return
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.symlink(os.path.relpath(split_dir / target, dst.parent), dst)
    except OSError:
        shutil.copyfile(split_dir / target, dst)


def copy_as_jpeg(source: Path, out: Path) -> None:
    """A world image saved as the JPEG a released layout names (quality 95, RGB), its folders made."""
    out.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    Image.open(source).convert("RGB").save(buf, format="JPEG", quality=95)
    out.write_bytes(buf.getvalue())


def write_all(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    for name in FORMATS:
        records = main[:SAMPLE] if name in SAMPLED else main
        importlib.import_module(f"negft.world.formats.{name}").write(Path(split_dir), records, zeroshot, seed)
