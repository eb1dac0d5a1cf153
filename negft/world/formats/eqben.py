"""The world's RelComp pairs as EqBen-mini, in its released layout (``eqben_vllm.zip``: ``all_select.json`` and
``images/``; see ``negft.probes.eqben``): at the top of the split folder, as under the manifest's root
(``$NEGFT_DATA/eqben/``),

- ``all_select.json``: a list of ``{"image0", "image1", "caption0", "caption1"}``, one per pair (a probe image and
  its copy with two related objects' positions or colours exchanged: a visual-minimal change; caption k is true of
  image k only);
- ``images/<sub-dataset>/<k>_<0|1>.<ext>``: the pair's images, the sub-datasets taken in turn (``SUBSETS``):
  JPEG copies (the light release's format), and for ``eqbenyoucook2`` uint8 arrays in BGR order (``.npy``), as
  that sub-dataset's frames are released. Below the sub-dataset folder the names are the world's own: the reader
  uses only the first folder.

No randomness.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from negft.probes.eqben import FILE, IMAGES, SUBSETS

NPY_SUBSET = "eqbenyoucook2"


def _write_image(source: Path, out: Path) -> None:
    """A JPEG copy, or a BGR ``.npy`` array for a name ending ``.npy``; written atomically."""
    out.parent.mkdir(parents=True, exist_ok=True)
    rgb = Image.open(source).convert("RGB")
    buf = io.BytesIO()
    if out.suffix == ".npy":
        np.save(buf, np.asarray(rgb)[:, :, [2, 1, 0]].copy())
    else:
        rgb.save(buf, format="JPEG", quality=95)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(out)


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    split_dir = Path(split_dir)
    rows = []
    for rec in main:
        pair = rec.get("relcomp")
        if not pair:
            continue
        subset = SUBSETS[len(rows) % len(SUBSETS)]
        ext = "npy" if subset == NPY_SUBSET else "jpg"
        names = [f"{subset}/{len(rows):06d}_{k}.{ext}" for k in (0, 1)]
        for source, name in zip((rec["image_path"], pair["image_1"]), names):
            _write_image(split_dir / source, split_dir / IMAGES / name)
        rows.append({"image0": names[0], "image1": names[1], "caption0": pair["caption_0"],
                     "caption1": pair["caption_1"]})
    tmp = split_dir / (FILE + ".tmp")
    tmp.write_text(json.dumps(rows, indent=2) + "\n", encoding="utf-8")
    tmp.replace(split_dir / FILE)
