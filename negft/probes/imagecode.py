"""ImageCoDe (Krojer et al., ACL 2022, "Image Retrieval from Contextual Descriptions"): a description of one image of
a set of ten near-identical ones (video frames, or static pictures of one scene); pick the described image.

Released layout (McGill-NLP/imagecode @ 609f076 ``README.md``, ``data/valid_data.json``,
``baselines/clip/zero_shot.py``): beside each other,

- ``valid_data.json``: ``{"<set folder>": {"<image index>": "<description>", ...}, ...}`` (the labelled split;
  ``test_data_unlabeled.json`` has no answers, ``train_data.json`` is for training);
- ``image-sets/<set folder>/img<N>.jpg``: the ten images of a set (``image-sets.zip`` from Zenodo unpacks to
  ``image-sets/``); a video set's N is the frame number (``img0``, ``img7``, ...), so an image index is the
  position in the set's files ordered by N, as the reference orders them. A set folder named ``open-images-...``
  holds static pictures, any other video frames.

Metrics (``imagecode/<dataset>/<metric>``), with s(image) the cosine similarity of the description and an image:

- ``videos``, ``static``, ``acc`` (negft): the credit of the described image among its set, 1/k when it ties
  k − 1 others at the top, over the video sets' descriptions, the static ones', and all.
- ``..._official``: ``zero_shot.py``'s "VIDEO ACC", "IMG ACC" and "OVERALL ACC": the first image of
  ``(-similarities).argsort()`` is the described one. An exact tie goes to the first of the tied images in frame
  order, as NumPy up to 1.24 sorts ten values (by insertion: stable). The reference's own tie order is not fixed:
  NumPy 2 sorts with SIMD kernels that do not keep ties in order (NumPy 2.4 on an AVX2 CPU gave a tie of the ninth
  and tenth images to the tenth), and its batched float32 image encoding can put byte-identical images a few ulps
  apart (``bench/parity/imagecode.md``); negft scores exact ties exactly (``negft.probes.similarity``). FSC-CLIP
  reports ``videos`` and ``static``.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): descriptions left out (a set
  folder absent or holding no ``img<N>.jpg``, on which the reference stops; an image index that is not an integer
  or names no image of the set, where it stops too; a description that is not a string), counted by reason in
  ``skipped`` under ``<prefix>/rows``. An empty description is scored, as the reference's ``clip.tokenize`` scores
  it (the reference strips each description; so does negft).

The JSON absent: skipped with its path; unreadable (not JSON, not an object): skipped with the reason.
"""
from __future__ import annotations

import os
import re
from collections import Counter

import torch

from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult
from negft.probes.released import read_json, read_rows, row_texts, rows_to_score
from negft.probes.similarity import option_scores
from negft.probes.stats import choice_credit

FILE, IMAGES = "valid_data.json", "image-sets"
STATIC = "open-images"          # a set folder whose name holds it: static pictures (zero_shot.py's test)
IMAGE_NAME = re.compile(r"img(\d+)\.jpg\Z")


def set_images(folder: str) -> list[str]:
    """The set's ``img<N>.jpg`` files ordered by N, the reference's order (another ``.jpg`` in the folder stops it)."""
    try:
        names = [n for n in os.listdir(folder) if IMAGE_NAME.match(n)]
    except OSError:
        return []
    return [os.path.join(folder, n) for n in sorted(names, key=lambda n: int(IMAGE_NAME.match(n).group(1)))]


def _parse(path) -> list:
    """[(row, None) | (None, reason)] per description, or [("file", reason)]."""
    data, why = read_json(path, dict)
    if data is None:
        return [("file", f"{path}: {why}")]
    root = os.path.join(os.path.dirname(os.fspath(path)), IMAGES)
    out = []
    for folder, described in data.items():
        if not isinstance(described, dict):
            out.append((None, "a set's value is not an object {image index: description}"))
            continue
        images = set_images(os.path.join(root, folder))
        for index, text in described.items():
            if not images:
                out.append((None, "set folder absent or without img<N>.jpg files"))
            elif not isinstance(text, str):
                out.append((None, "description is not a string"))
            elif not (isinstance(index, str) and index.strip().isdigit() and int(index) < len(images)):
                out.append((None, "image index not an integer naming an image of the set"))
            else:
                out.append(({"set": folder, "images": images, "target": int(index), "text": text.strip(),
                             "static": STATIC in folder}, None))
    return out


def read(dataset: Dataset) -> tuple[list[dict], Counter]:
    return read_rows(dataset, dataset.root / FILE, _parse)


def texts(dataset: Dataset) -> list[str]:
    return row_texts(dataset.root / FILE, _parse, "text")


def first_max(scores: torch.Tensor) -> torch.Tensor:
    """The first position of each row's maximum: the reference's argsort under NumPy up to 1.24, whose sort of ten
    values keeps ties in file order."""
    return (scores == scores.max(dim=1, keepdim=True).values).float().argmax(dim=1)


@register("imagecode", texts=texts, version=1, metrics=("videos", "static", "acc"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result, prefix = ProbeResult(), f"imagecode/{dataset.name}"
    rows = rows_to_score(result, prefix, lambda: read(dataset), dataset.root / FILE, "description")
    if rows is None:
        return result
    credit, official = torch.zeros(len(rows), dtype=torch.float64), torch.zeros(len(rows), dtype=torch.float64)
    by_size: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_size.setdefault(len(r["images"]), []).append(i)
    records: list = [None] * len(rows)
    for k, idx in by_size.items():
        images = ctx.encode_images([p for i in idx for p in rows[i]["images"]]).view(len(idx), k, -1)
        descriptions = ctx.encode_texts([rows[i]["text"] for i in idx])
        s = option_scores(descriptions, images).double()
        target = torch.tensor([rows[i]["target"] for i in idx])
        credit[idx] = choice_credit(s, target).double()
        official[idx] = (first_max(s) == target).double()
        for j, i in enumerate(idx):
            records[i] = {"set": rows[i]["set"], "target": rows[i]["target"], "description": rows[i]["text"],
                          "scores": [round(float(v), 5) for v in s[j]]}
    static = torch.tensor([r["static"] for r in rows])
    for name, mask in (("videos", ~static), ("static", static), ("acc", torch.ones(len(rows), dtype=torch.bool))):
        if mask.any():
            result.add_rules(f"{prefix}/{name}", (credit[mask], official[mask]), ctx.n_boot)
        else:
            result.skipped[f"{prefix}/{name}"] = f"no {name} set described in {dataset.root / FILE}"
    result.records[prefix] = records
    return result
