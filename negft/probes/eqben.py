"""EqBen (Wang et al., ICCV 2023, "Equivariant Similarity for Vision-Language Foundation Models"): two images that
differ by a visual-minimal change (video frames, game-engine or diffusion renders) and a caption true of each;
match each caption to its image, Winoground-style.

Released layout: EqBen-mini, the subset the EqBen README releases for evaluating models ("a small EqBen subset",
Wangt-CN/EqBen @ ab6c79a ``README.md``), the ``eqben_vllm.zip`` that linzhiqiu/t2v_metrics @ 6ecb74f
``dataset.py`` (``EqBen_Mini``) downloads and reads:

- ``all_select.json``: a JSON list, one object per example, ``{"image0", "image1", "caption0", "caption1"}``;
- ``images/<path>``: ``image0`` / ``image1`` are paths relative to ``images/`` whose first component names the
  sub-dataset: ``eqbenag``, ``eqbenyoucook2``, ``eqbengebc``, ``eqbenkubric_cnt`` / ``_loc`` / ``_attr``,
  ``eqbensd`` (the names of EqBen's ``evaluate_eqben_locally.py``). YouCook2 frames are ``.npy`` arrays in BGR
  order, opened as the reference opens them (``Image.fromarray(np.load(p)[:, :, [2, 1, 0]], 'RGB')``; t2v_metrics'
  ``image_loader``, EqBen's ``example/eqben_eval_CLIP.py`` ``process_img_npy``).

The full test set's annotation (``ann_json_finegrained_random.json``) is a shuffled list of single image-caption
pairs, scored only with the private index of the CodaLab server; it is not read here.

Metrics (``eqben/<dataset>/<metric>``), with s(c, i) the cosine similarity of caption c and image i:

- ``text``, ``image``, ``group``: Winoground's scores with an exact tie broken at random, in expectation
  (``relcomp.winoground_scores``: a constant model scores 1/4, 1/4, 1/6).
- ``..._official``: EqBen's ``cal_wino_score`` (``evaluate_eqben_locally.py``, the ``eqben`` package's
  ``eqben_acc.py``): text s(c0,i0) > s(c1,i0) and s(c1,i1) > s(c0,i1); image s(c0,i0) > s(c0,i1) and
  s(c1,i1) > s(c1,i0); group both; every comparison strict, so a tie fails.
- ``<score>_<sub-dataset>`` and ``<score>_<sub-dataset>_official``: the same over the examples whose ``image0``
  starts with that sub-dataset's folder (EqBen's per-dataset table; t2v_metrics groups the three Kubric ones); an
  example under another folder counts overall only.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): examples left out (not an
  object, an image path missing or empty, a caption not a string, an image file not found, a ``.npy`` frame that
  is not an (H, W, 3) uint8 array), counted by reason under ``<prefix>/rows`` in ``skipped``. The reference stops
  on each of them. An empty caption is scored, as the reference's tokenizers score "".

The JSON absent: skipped with its path; unreadable (not JSON, not a list): skipped with the reason.
"""
from __future__ import annotations

import os
from collections import Counter

import numpy as np
import torch
from PIL import Image

from negft.probes import register
from negft.probes.base import SUFFIX_OPENERS, DataNotFound, Dataset, EvalContext, ProbeResult, parse_once
from negft.probes.relcomp import add_pair_scores
from negft.probes.released import bad_object, read_json, report_skips
from negft.probes.similarity import grid_scores

FILE, IMAGES = "all_select.json", "images"
KEYS = ("image0", "image1", "caption0", "caption1")
SUBSETS = ("eqbenag", "eqbenyoucook2", "eqbengebc", "eqbenkubric_cnt", "eqbenkubric_loc", "eqbenkubric_attr",
           "eqbensd")


def bad_npy(path: str) -> str | None:
    """Why a ``.npy`` frame cannot be opened as the reference opens it (an (H, W, 3) uint8 array), or None; reads
    only the header."""
    try:
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except (OSError, ValueError) as e:
        return f"unreadable .npy ({type(e).__name__})"
    if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
        return ".npy frame not an (H, W, 3) uint8 array"
    return None


def open_npy(path: str) -> Image.Image:
    """A YouCook2 frame: a BGR uint8 array, as EqBen's loaders turn it into RGB."""
    why = bad_npy(path)
    if why is not None:
        raise ValueError(f"{path}: {why}; EqBen's .npy frames are (H, W, 3) uint8 arrays in BGR order")
    return Image.fromarray(np.ascontiguousarray(np.load(path, allow_pickle=False)[:, :, [2, 1, 0]]), "RGB")


SUFFIX_OPENERS[".npy"] = open_npy


def subset(image0: str) -> str | None:
    """The sub-dataset an example belongs to: ``image0``'s first folder when it is one of EqBen's (``SUBSETS``)."""
    first = image0.split("/")[0]                      # as t2v_metrics' EqBen_Mini splits it
    return first if first in SUBSETS else None


def _parse(path) -> list:
    """[(row, None) | (None, reason)] per example, or [("file", reason)]."""
    data, why = read_json(path, list)
    if data is None:
        return [("file", why)]
    images = os.path.join(os.path.dirname(os.fspath(path)), IMAGES)
    out = []
    for row in data:
        why = bad_object(row, KEYS, "example", may_be_empty=("caption0", "caption1"))
        if why is None:
            paths = [os.path.join(images, row[k]) for k in ("image0", "image1")]
            if not all(os.path.isfile(p) for p in paths):
                why = "image file not found"
            else:
                why = next(filter(None, (bad_npy(p) for p in paths if p.lower().endswith(".npy"))), None)
        if why is not None:
            out.append((None, why))
            continue
        out.append(({"image0": paths[0], "image1": paths[1], "caption0": row["caption0"],
                     "caption1": row["caption1"], "subset": subset(row["image0"])}, None))
    return out


def read(dataset: Dataset) -> tuple[list[dict], Counter]:
    path = dataset.root / FILE
    if not path.exists():
        raise DataNotFound(dataset, path)
    parsed = parse_once(path, _parse)
    if parsed and parsed[0][0] == "file":
        raise ValueError(f"{path}: {parsed[0][1]}")
    return [r for r, _ in parsed if r is not None], Counter(why for r, why in parsed if r is None)


def texts(dataset: Dataset) -> list[str]:
    path = dataset.root / FILE
    if not path.exists():
        return []
    return [r[k] for r, _ in parse_once(path, _parse) if isinstance(r, dict) for k in ("caption0", "caption1")]


@register("eqben", texts=texts, version=1, metrics=(
    "text", "image", "group", "text_<x>", "image_<x>", "group_<x>"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result, prefix = ProbeResult(), f"eqben/{dataset.name}"
    try:
        rows, skipped = read(dataset)
    except ValueError as e:
        result.skipped[prefix] = str(e)
        return result
    report_skips(result, prefix, dataset.root / FILE, skipped, len(rows) + sum(skipped.values()))
    if not rows:
        result.skipped.setdefault(prefix, f"no example to score in {dataset.root / FILE}")
        return result
    n = len(rows)
    images = ctx.encode_images([r[k] for r in rows for k in ("image0", "image1")]).view(n, 2, -1)
    encoded = ctx.encode_texts([r[k] for r in rows for k in ("caption0", "caption1")]).view(n, 2, -1)
    s = grid_scores(encoded, images)
    names = sorted({r["subset"] for r in rows} - {None})
    subsets = {name: torch.tensor([r["subset"] == name for r in rows]) for name in names}
    scores = add_pair_scores(result, prefix, s, subsets, ctx.n_boot)
    result.records[prefix] = [
        {"subset": r["subset"], "caption0": r["caption0"], "caption1": r["caption1"], "image0": r["image0"],
         "image1": r["image1"], "scores": [[round(float(v), 5) for v in row] for row in s[i]],
         **{name: float(v[i]) for name, v in scores[""].items()}}
        for i, r in enumerate(rows)]
    return result
