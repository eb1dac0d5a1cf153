"""Winoground (Thrush et al., CVPR 2022): two images and two captions with the same words in a different order;
match each caption to its image.

Released layout (facebook/winoground on Hugging Face, as its dataset card describes it: "The captions and tags
are located in ``data/examples.jsonl`` and the images are located in ``data/images.zip``"; read as
``os.path.join("data/images", example[key]) + ".png"`` by public evaluation code, and
ajd12342/why-winoground-hard README: "Place ``examples.jsonl`` and the extracted directory ``images`` inside
``dataset``"): ``examples.jsonl``, one JSON object a line with ``id, caption_0, caption_1, image_0, image_1,
tag, secondary_tag, num_main_preds, collapsed_tag``; ``image_k`` is a file stem (``ex_0_img_0``) of
``images/<stem>.png`` beside it. Here the dataset's root holds ``examples.jsonl`` and ``images/``
(data_manifests/winoground.yaml); a name that already has an extension is used as it is.

Metrics (``winoground/<dataset>/<metric>``), with s(c, i) the cosine similarity of caption c and image i:

- ``text``: s(c0, i0) > s(c1, i0) and s(c1, i1) > s(c0, i1) (each image picks its caption);
  ``image``: s(c0, i0) > s(c0, i1) and s(c1, i1) > s(c1, i0) (each caption picks its image);
  ``group``: both. negft's rule: an exact tie is broken at random, and the score is the expected value over the
  24 orders of the four scores (``relcomp.winoground_scores``), so a constant model scores Winoground's chance
  levels, text 1/4, image 1/4, group 1/6 (the four scores in random order: each of text and image is two
  independent halves, 1/2 · 1/2; group needs s(c0,i0) and s(c1,i1) to be the two largest, 2!·2!/4! = 1/6).
  Half credit per tied comparison with the conjunction as a product would give the same 1/4 for text and
  image but 1/16 for group, below chance, since the four comparisons of the group share their scores.
- ``text_official``, ``image_official``, ``group_official``: the same inequalities strict, as Winoground's
  ``statistics/compute_statistics.py`` (``text_correct`` / ``image_correct`` / ``group_correct``) and the
  paper define them: a tie fails, so a constant model scores 0. They differ only on exact ties.
- ``<score>_<tag>`` and ``<score>_<tag>_official`` for each ``collapsed_tag`` present (``object``,
  ``relation``, ``both``), the paper's linguistic breakdown (compute_statistics.py ``filter_examples``).
- ``skipped_rows`` (only when lines were skipped; a count, not a per-example metric): lines left out (not JSON,
  not an object, a caption or image name missing, an image file not found); ``skipped`` then has an entry
  ``<prefix>/rows`` saying how many and why.
"""
from __future__ import annotations

import json
import os
import re
from collections import Counter

import torch

from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult, parse_once, require, resolve
from negft.probes.relcomp import captions, winoground_official, winoground_scores
from negft.probes.released import bad_object, cut_short
from negft.probes.similarity import grid_scores

FILE = "examples.jsonl"
IMAGES = "images"
KEYS = ("caption_0", "caption_1", "image_0", "image_1")


def _lines(path) -> list:
    """Each line parsed, or None where it is not JSON."""
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append(None)
    return out


def image_path(dataset: Dataset, name: str) -> str:
    """``images/<name>.png`` under the root (the release's stems), or ``images/<name>`` if it has an extension."""
    return resolve(dataset.root, os.path.join(IMAGES, name if os.path.splitext(name)[1] else f"{name}.png"))


def _bad(row) -> str | None:
    return "line is not JSON" if row is None else bad_object(row, KEYS, "line")


def read_examples(dataset: Dataset) -> tuple[list[dict], Counter]:
    """(examples that can be scored, skipped lines by reason); the file must exist."""
    rows, skipped = [], Counter()
    for row in parse_once(dataset.root / FILE, _lines):
        why = _bad(row)
        if why is None:
            images = [image_path(dataset, row[k]) for k in ("image_0", "image_1")]
            if not all(os.path.isfile(p) for p in images):
                why = "image file not found"
        if why is not None:
            skipped[why] += 1
            continue
        tag = row.get("collapsed_tag")
        rows.append({"id": row.get("id"), "caption_0": row["caption_0"], "caption_1": row["caption_1"],
                     "image_0": images[0], "image_1": images[1],
                     "collapsed_tag": _tag(tag)})
    return rows, skipped


def _tag(tag) -> str | None:
    """A ``collapsed_tag`` as a metric-name part: ``Object`` -> ``object``; None when absent or empty."""
    name = re.sub(r"[^a-z0-9]+", "_", tag.lower()).strip("_") if isinstance(tag, str) else ""
    return name or None


def texts(dataset: Dataset) -> list[str]:
    if not (dataset.root / FILE).exists():
        return []
    return captions(read_examples(dataset)[0])


@register("winoground", texts=texts)
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    prefix = f"winoground/{dataset.name}"
    path = require(dataset, dataset.root / FILE)
    rows, skipped = read_examples(dataset)
    n_skipped = sum(skipped.values())
    if n_skipped:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        result.skipped[f"{prefix}/rows"] = (f"{n_skipped} of {len(rows) + n_skipped} lines skipped in {path} "
                                            f"({reasons}){cut_short(path)}")
        result.metrics[f"{prefix}/skipped_rows"] = float(n_skipped)      # a count, not a per-example metric
        result.ci95[f"{prefix}/skipped_rows"] = [float(n_skipped), float(n_skipped)]
    if not rows:
        result.skipped.setdefault(prefix, f"no example to score in {path}")
        return result
    n = len(rows)
    images = ctx.encode_images([r[k] for r in rows for k in ("image_0", "image_1")]).view(n, 2, -1)
    encoded = ctx.encode_texts(captions(rows)).view(n, 2, -1)
    s = grid_scores(encoded, images)
    scores = {"": winoground_scores(s), "_official": winoground_official(s)}
    tags = [r["collapsed_tag"] for r in rows]
    for suffix, by_score in scores.items():
        for name, values in by_score.items():
            result.add(f"{prefix}/{name}{suffix}", values, ctx.n_boot)
            for tag in sorted({t for t in tags if t}):
                mask = torch.tensor([t == tag for t in tags])
                result.add(f"{prefix}/{name}_{tag}{suffix}", values[mask], ctx.n_boot)
    result.records[prefix] = [
        {"id": r["id"], "collapsed_tag": r["collapsed_tag"], "caption_0": r["caption_0"], "caption_1": r["caption_1"],
         "image_0": r["image_0"], "image_1": r["image_1"],
         "scores": [[round(float(v), 5) for v in row] for row in s[i]],
         **{name: float(v[i]) for name, v in scores[""].items()}}
        for i, r in enumerate(rows)]
    return result
