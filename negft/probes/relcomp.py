"""RelComp probe pairs, Winoground-style (Probe-R/C/B paper, section 5 and table 3).

``relcomp.csv`` holds pairs (image_0, image_1, caption_0, caption_1, kind) where caption_k is true of
image_k only; kind is ``relation`` (positions exchanged, predicate swapped) or ``attribute`` (colours
exchanged). Per pair, with s(c, i) the cosine similarity:

- text score: s(c0, i0) > s(c1, i0) and s(c1, i1) > s(c0, i1)  (each image picks its caption)
- image score: s(c0, i0) > s(c0, i1) and s(c1, i1) > s(c1, i0) (each caption picks its image)
- group: all four at once.

Where ours differs from the reference: ties are broken at random in expectation (the reference
counts a tie as a failure), so a model with all-equal scores scores chance (1/4, 1/4, 1/6), not 0.
"""
from __future__ import annotations

import itertools
import os
from collections import Counter

import torch

from negft.probes import register
from negft.probes.base import CROP, Dataset, EvalContext, ProbeResult, csv_texts, read_csv, require, resolve
from negft.probes.released import report_skips
from negft.probes.similarity import grid_scores

# every order in which to break ties among the four scores (c0,i0), (c0,i1), (c1,i0), (c1,i1)
_ORDERS = torch.tensor(list(itertools.permutations(range(4))))


def winoground_scores(s: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-pair expected text / image / group scores of ``s`` (N, 2, 2) = s[caption, image], ties random."""
    v = s.reshape(-1, 1, 4)                      # (N, 1, 4) against the (24, 4) tie-break orders

    def beats(a: int, b: int) -> torch.Tensor:   # (N, 24): a > b, an exact tie going by the order
        return (v[..., a] > v[..., b]) | ((v[..., a] == v[..., b]) & (_ORDERS[:, a] > _ORDERS[:, b]))

    text = (beats(0, 2) & beats(3, 1)).double()
    image = (beats(0, 1) & beats(3, 2)).double()
    return {"text": text.mean(1), "image": image.mean(1), "group": (text * image).mean(1)}


def winoground_official(s: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-pair strict text / image / group scores of ``s`` (N, 2, 2) = s[caption, image], as Winoground's
    ``compute_statistics.py`` and the Probe-R/C/B release (``core/eval_compositional_understanding.py``) score
    them: every comparison ``>``, so a tie counts as a failure (all-equal scores give 0, 0, 0)."""
    text = (s[:, 0, 0] > s[:, 1, 0]) & (s[:, 1, 1] > s[:, 0, 1])
    image = (s[:, 0, 0] > s[:, 0, 1]) & (s[:, 1, 1] > s[:, 1, 0])
    return {"text": text.double(), "image": image.double(), "group": (text & image).double()}


def add_pair_scores(result: ProbeResult, prefix: str, s: torch.Tensor, masks: dict[str, torch.Tensor],
                    n_boot: int) -> dict[str, dict[str, torch.Tensor]]:
    """Winoground's text, image and group scores of ``s`` (N, 2, 2), negft's (``""``) and the reference's
    (``"_official"``), added to ``result`` as ``<prefix>/<score><suffix>`` overall and ``<prefix>/<score>_<part><suffix>``
    for each row mask in ``masks``; returns the scores (suffix -> score -> per-pair values)."""
    scores = {"": winoground_scores(s), "_official": winoground_official(s)}
    for suffix, by_score in scores.items():
        for name, values in by_score.items():
            result.add(f"{prefix}/{name}{suffix}", values, n_boot)
            for part, mask in masks.items():
                result.add(f"{prefix}/{name}_{part}{suffix}", values[mask], n_boot)
    return scores


def _bad_text(row) -> str | None:
    if not isinstance(row, dict):
        return "row is not a record"
    for k in ("image_0", "image_1", "caption_0", "caption_1", "kind"):
        if not isinstance(row.get(k), str) or not row[k].strip():
            return f"'{k}' missing or empty"
    return None


def captions(rows) -> list[str]:
    """Each pair's two captions, in order (Winoground's pairs too)."""
    return [r[k] for r in rows for k in ("caption_0", "caption_1")]


def file_captions(rows) -> list[str]:
    """The captions of a RelComp file's pairs whose fields are all there (a cut or garbled row has none)."""
    return captions([r for r in rows if _bad_text(r) is None])


def pairs(root, rows) -> tuple[list[dict], Counter]:
    """The rows that can be scored, and the others counted by reason (a field missing or empty, an image file
    not found)."""
    good, skipped = [], Counter()
    for r in rows:
        why = _bad_text(r)
        if why is None and not all(os.path.isfile(resolve(root, r[k]).partition(CROP)[0]) for k in ("image_0", "image_1")):
            why = "image file not found"
        if why is None:
            good.append(r)
        else:
            skipped[why] += 1
    return good, skipped


def score_pairs(ctx: EvalContext, dataset: Dataset, filename: str, prefix: str) -> ProbeResult:
    """Text / image / group scores of the pairs in ``filename`` (schema.RELCOMP_CSV_COLUMNS), overall and
    per ``kind``; rows that cannot be scored are left out and counted (``<prefix>/skipped_rows``)."""
    result = ProbeResult()
    path = require(dataset, dataset.root / filename)
    table = read_csv(path)
    rows, skipped = pairs(dataset.root, table)
    report_skips(result, prefix, path, skipped, len(table))
    if not rows:
        result.skipped[prefix] = f"no pair to score in {path}"
        return result
    images = ctx.encode_images([resolve(dataset.root, r[k]) for r in rows for k in ("image_0", "image_1")])
    texts = ctx.encode_texts(captions(rows))
    n = len(rows)
    s = grid_scores(texts.view(n, 2, -1), images.view(n, 2, -1))
    scores = winoground_scores(s)
    for name, values in scores.items():
        result.add(f"{prefix}/{name}", values, ctx.n_boot)
    for kind in sorted({r["kind"] for r in rows}):
        mask = torch.tensor([r["kind"] == kind for r in rows])
        for name, values in scores.items():
            result.add(f"{prefix}/{name}_{kind}", values[mask], ctx.n_boot)
    result.records[prefix] = [{**r, **{k: float(v[i]) for k, v in scores.items()}} for i, r in enumerate(rows)]
    return result


@register("relcomp", texts=csv_texts("relcomp.csv", file_captions), version=2,
          metrics=("text", "image", "group", "text_<x>", "image_<x>", "group_<x>"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    return score_pairs(ctx, dataset, "relcomp.csv", f"relcomp/{dataset.name}")
