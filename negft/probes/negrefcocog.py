"""NegRefCOCOg (the NegationCLIP paper's referring-expression benchmark with negation, over RefCOCOg): crop each
candidate box of an image, score every crop against the expression, and pick the best box.

Released layout (parkquasar/NegationCLIP @ 6f858ee ``NegRefCOCOg/NegRefCOCOg.json`` and
``NegRefCOCOg/negrefcocog_eval.py``): one JSON list of ``{"image", "phrase", "ref_bbox", "bbox_list"}``;
``image`` a COCO train2014 file name (``COCO_train2014_000000374391.jpg``) resolved against a separate image folder
(``--image_dir``, default ``./coco_images/train2014``); ``phrase`` the expression ("a green umbrella with no one
under it"); boxes ``[x, y, w, h]`` in pixels (floats); ``ref_bbox`` the right box, also listed in ``bbox_list``
(first in all 440 released rows, each with two boxes). Here the JSON sits in the dataset's root and the image
folder is the manifest's ``images`` key (``train2014``, relative to the root, or absolute), as SugarCrepe's
(``negft.probes.sugarcrepe.image_root``); a dataset without a manifest (the world's split) resolves ``image``
against its root.

Each box is scored on the image cropped to it, ``image.crop((x, y, x + w, y + h))`` as the reference crops it (no
padding, no blur), encoded under the crop's own cache key (``base.crop_key``); s(b) is the cosine similarity of
the crop of box b and the expression (``negft.probes.similarity``: equal crops score equal).

Metrics (``negrefcocog/<dataset>/<metric>``):

- ``acc`` (negft): the share of the maximal boxes that are the right box (1/k when it ties k − 1 others), over
  the rows whose ``ref_bbox`` is among ``bbox_list``.
- ``acc_official``: the reference's ``accuracy``: ``bbox_list[np.argmax(similarities)] == ref_bbox`` (the first
  maximal box, so a tie goes to the box listed first, the right one in the release; a box equal to ``ref_bbox``
  counts wherever it is listed), over every row scored, a row whose ``ref_bbox`` is not listed counting as wrong.
- A ``phrase`` that is "" is scored as any text, under both rules: the reference's ``clip.tokenize([""])`` reads
  it as start and end tokens, and its loop has no filter.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows left out (not an
  object; ``image`` missing or empty; ``phrase`` missing or not a string; a box not four finite numbers or
  without area; ``bbox_list`` empty; the image file not found); ``skipped`` has an entry ``<prefix>/rows``
  naming the file and counting them by reason, and an entry ``<prefix>/acc`` counting the rows ``acc`` leaves out
  (``ref_bbox`` not listed). The reference reads no such row (it stops with an error).

An absent file skips the probe with its path; an unreadable one (not JSON, not a list) with the reason.
"""
from __future__ import annotations

import math
import os
from collections import Counter
from numbers import Real

import torch

from negft.probes import register
from negft.probes.aro import first_max
from negft.probes.base import Dataset, EvalContext, ProbeResult, crop_key, require, resolve
from negft.probes.released import parsed_rows, read_json, report_skips
from negft.probes.similarity import option_scores
from negft.probes.sugarcrepe import image_root

FILE = "NegRefCOCOg.json"


def _box(value) -> list | None:
    """A released box ``[x, y, w, h]`` as it is, or None when it is not four finite numbers with an area."""
    if not (isinstance(value, list) and len(value) == 4 and
            all(isinstance(v, Real) and not isinstance(v, bool) and math.isfinite(v) for v in value)):
        return None
    return value if value[2] > 0 and value[3] > 0 else None


def _row(row, images: str) -> tuple[dict | None, str | None]:
    if not isinstance(row, dict):
        return None, "row is not an object"
    if not isinstance(row.get("image"), str) or not row["image"].strip():
        return None, "'image' missing or not a non-empty string"
    if not isinstance(row.get("phrase"), str):          # "" is a text the reference scores
        return None, "'phrase' missing or not a string"
    boxes = row.get("bbox_list")
    if not isinstance(boxes, list) or not boxes:
        return None, "'bbox_list' missing or empty"
    if _box(row.get("ref_bbox")) is None or any(_box(b) is None for b in boxes):
        return None, "a box is not [x, y, w, h] of finite numbers with an area"
    image = resolve(images, row["image"])
    if not os.path.isfile(image):
        return None, "image file not found"
    return {"image": image, "image_name": row["image"], "phrase": row["phrase"], "boxes": boxes,
            "right": [b == row["ref_bbox"] for b in boxes]}, None


def _parse(path, images: str) -> list:
    data, why = read_json(path, list)
    if data is None:
        return [("file", why)]
    return [(out,) if bad is None else (None, bad) for out, bad in (_row(row, images) for row in data)]


_PARSERS: dict = {}      # image folder -> the parser of a file whose images are there (parse_once keys by it)


def _parse_with_images(images: str):
    if images not in _PARSERS:
        _PARSERS[images] = lambda path: _parse(path, images)
    return _PARSERS[images]


def read(dataset: Dataset) -> tuple[list[dict], Counter, str | None]:
    """(rows that can be scored, rows skipped by reason, why the file is skipped or None)."""
    path = require(dataset, dataset.root / FILE)
    rows, skipped, why = parsed_rows(dataset, path, _parse_with_images(image_root(dataset)))
    return [row for row, in rows], skipped, why


def texts(dataset: Dataset) -> list[str]:
    path = dataset.root / FILE
    return [r["phrase"] for r in read(dataset)[0]] if path.exists() else []


def crop(path: str, box: list) -> str:
    """The cache key of ``path`` cropped as the reference crops it: ``(x, y, x + w, y + h)``."""
    x, y, w, h = box
    return crop_key(path, (x, y, x + w, y + h))


def scores_by_size(ctx: EvalContext, rows: list[dict]) -> list[torch.Tensor]:
    """Each row's (K,) scores of its boxes' crops against its phrase; rows with as many boxes scored together."""
    phrases = ctx.encode_texts([r["phrase"] for r in rows])
    out: list = [None] * len(rows)
    for k in sorted({len(r["boxes"]) for r in rows}):
        idx = [i for i, r in enumerate(rows) if len(r["boxes"]) == k]
        crops = ctx.encode_images([crop(rows[i]["image"], b) for i in idx for b in rows[i]["boxes"]])
        scores = option_scores(phrases[idx], crops.view(len(idx), k, -1)).double()
        for i, s in zip(idx, scores):
            out[i] = s
    return out


@register("negrefcocog", texts=texts, version=2, metrics=("acc",))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    prefix = f"negrefcocog/{dataset.name}"
    rows, skipped, why = read(dataset)
    if why is not None:
        result.skipped[prefix] = why
        return result
    report_skips(result, prefix, dataset.root / FILE, skipped, len(rows) + sum(skipped.values()))
    if not rows:
        result.skipped.setdefault(prefix, f"no row to score in {dataset.root / FILE}")
        return result
    credit, official, records = [], [], []
    for r, s in zip(rows, scores_by_size(ctx, rows)):
        right = torch.tensor(r["right"])
        at_max = s >= s.max()
        official.append(float(right[first_max(s[None])[0].bool()].item()))
        if right.any():
            credit.append(float((at_max & right).sum() / at_max.sum()))
        records.append({"image": r["image_name"], "phrase": r["phrase"], "boxes": r["boxes"],
                        "scores": [round(float(v), 5) for v in s], "right": r["right"]})
    unlisted = len(rows) - len(credit)
    if unlisted:
        result.skipped[f"{prefix}/acc"] = (f"{unlisted} of {len(rows)} rows left out of acc: ref_bbox is not among "
                                           "bbox_list (acc_official counts them as wrong, as the reference does)")
    if credit:
        result.add(f"{prefix}/acc", torch.tensor(credit, dtype=torch.float64), ctx.n_boot)
    result.add(f"{prefix}/acc_official", torch.tensor(official, dtype=torch.float64), ctx.n_boot)
    result.records[prefix] = records
    return result
