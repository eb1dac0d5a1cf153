"""SPEC (Peng et al., CVPR 2024, "Synthesize, Diagnose, and Optimize: Towards Fine-Grained Vision-Language
Understanding"): groups of images that differ in one concept (size, position, existence, count) and the captions
that say each; match each image to its caption (I2T) and each caption to its image (T2I), in six subsets.

Released layout (wjpoom/SPEC @ ad982a4: ``spec/dataset.py`` ``Image2TextDataset`` / ``Text2ImageDataset`` /
``get_data``, ``spec/eval.py``; the data itself is ``data.zip`` on Hugging Face, wjpoom/SPEC, not in the
repository): one folder per subset under the data root, ``absolute_size, relative_size, absolute_spatial,
relative_spatial, existence, count``, each with

- ``image2text.json``: a JSON list of ``{"query": image path, "keys": [candidate captions], "label": index of the
  true caption}``;
- ``text2image.json``: a JSON list of ``{"query": caption, "keys": [candidate image paths], "label": index of the
  true image}``;

image paths relative to the subset's folder (``os.path.join(subset_root, ...)``).

Metrics (``spec/<dataset>/<metric>``), with s the cosine similarity of image and text:

- ``<subset>_i2t`` / ``<subset>_t2i`` (negft's rule): the mean over rows of the true candidate's credit among the
  row's candidates, 1/m when it ties m − 1 others at the top (``stats.choice_credit``), as fractions.
- ``i2t`` / ``t2i``: the unweighted mean of the subsets' numbers (per-example values reweighted by n / (k ·
  n_subset), so the interval resamples examples), as ``eval.py``'s "average all subset".
- ``..._official``: ``spec/models/clip_wrapper.py``: ``argmax`` of ``einsum('BD,BLD->BL')`` equals ``label``;
  ``torch.argmax`` returns the first maximum, so a tie goes to the lower index (scored here on exact ties,
  ``negft.probes.similarity``: a float32 einsum may break them by column). SPEC prints percentages; these are
  fractions. A ``label`` that names no candidate is a miss there (the reference's rule) and left out by negft's.
- A caption that is "" (an I2T candidate, a T2I query) is scored as any text, under both rules: the reference's
  open_clip tokenizer reads "" as start and end tokens, and it has no filter. An image path "" names the subset's
  folder, no file: such a row is skipped (the reference stops at it, ``Image.open`` of a folder).
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows left out (not an
  object; ``query`` not a string; ``keys`` not a non-empty list of strings; ``label`` not an integer; an image
  file not found), counted by reason in ``skipped`` under ``<prefix>/<subset>_<direction>/rows``; a label out of
  range is counted there too. The reference has no filter: it stops with an error at such a row (but the label
  out of range, a miss there), and at a batch whose rows have different numbers of candidates (``torch.stack``);
  negft scores each row with its own.

A subset whose file is absent is skipped with its path, an unreadable one (not JSON, not a list) with the reason;
the others still run.
"""
from __future__ import annotations

import os
from collections import Counter

import torch

from negft.probes import register
from negft.probes.base import DataNotFound, Dataset, EvalContext, ProbeResult, resolve
from negft.probes.released import count_skips, note_skips, parsed_rows, read_json
from negft.probes.similarity import option_scores
from negft.probes.stats import choice_credit

SUBSETS = ("absolute_size", "relative_size", "absolute_spatial", "relative_spatial", "existence", "count")
FILES = {"i2t": "image2text.json", "t2i": "text2image.json"}


def _bad(row) -> str | None:
    """Why a row cannot be scored, or None (its label may still be out of range)."""
    if not isinstance(row, dict):
        return "row is not an object"
    if not isinstance(row.get("query"), str):         # "" too: a caption the reference scores, a path no image
        return "'query' missing or not a string"
    keys = row.get("keys")
    if not isinstance(keys, list) or not keys or not all(isinstance(k, str) for k in keys):
        return "'keys' not a non-empty list of strings"
    if isinstance(row.get("label"), bool) or not isinstance(row.get("label"), int):
        return "'label' not an integer"
    return None


def _parse(path) -> list:
    """[(row, None) | (None, reason)] of a file, or [("file", reason)] when it is not a JSON list."""
    data, why = read_json(path, list)
    if data is None:
        return [("file", why)]
    return [(row, None) if _bad(row) is None else (None, _bad(row)) for row in data]


def read(dataset: Dataset, subset: str, direction: str) -> tuple[list[dict], Counter, str | None]:
    """(rows with their image paths resolved, skipped rows by reason, why the whole file is skipped or None)."""
    folder = dataset.root / subset
    good, skipped, why = parsed_rows(dataset, folder / FILES[direction], _parse)
    if why is not None:
        return [], skipped, why
    rows = []
    for row, _ in good:
        images = [row["query"]] if direction == "i2t" else row["keys"]
        paths = [resolve(str(folder), p) for p in images]
        if not all(os.path.isfile(p) for p in paths):
            skipped["image file not found"] += 1
            continue
        texts_ = row["keys"] if direction == "i2t" else [row["query"]]
        rows.append({"query": row["query"], "images": paths, "texts": texts_, "label": row["label"],
                     "candidates": len(row["keys"])})
    return rows, skipped, None


def texts(dataset: Dataset) -> list[str]:
    return [t for s in SUBSETS for d in FILES for r in read(dataset, s, d)[0] for t in r["texts"]]


def scores(ctx: EvalContext, rows: list[dict], direction: str) -> list[torch.Tensor]:
    """Each row's candidate scores (K,), batched by K: an image against its captions (i2t), a caption against its
    images (t2i)."""
    out: list = [None] * len(rows)
    by_k: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_k.setdefault(r["candidates"], []).append(i)
    for k, idx in by_k.items():
        images = ctx.encode_images([p for i in idx for p in rows[i]["images"]])
        texts_ = ctx.encode_texts([t for i in idx for t in rows[i]["texts"]])
        query, keys = (images, texts_) if direction == "i2t" else (texts_, images)
        for i, s in zip(idx, option_scores(query, keys.view(len(idx), k, -1))):
            out[i] = s
    return out


def credits(row_scores: list[torch.Tensor], labels: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(negft's tie-aware credit of the rows whose label names a candidate, SPEC's ``argmax == label`` of all)."""
    tie_aware = [float(choice_credit(s.view(1, -1), torch.tensor([y]))[0])
                 for s, y in zip(row_scores, labels) if 0 <= y < len(s)]
    official = [float(int(torch.argmax(s)) == y) for s, y in zip(row_scores, labels)]
    return torch.tensor(tie_aware, dtype=torch.float64), torch.tensor(official, dtype=torch.float64)


@register("spec", texts=texts, version=2, metrics=("<x>_i2t", "<x>_t2i", "i2t", "t2i"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    if not any((dataset.root / s).is_dir() for s in SUBSETS):
        raise DataNotFound(dataset, dataset.root / SUBSETS[0], f" (nor {', '.join(SUBSETS[1:])})")
    result, prefix = ProbeResult(), f"spec/{dataset.name}"
    per_subset: dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]] = {d: {} for d in FILES}
    records, n_skipped = [], 0
    for subset in SUBSETS:
        for direction, file in FILES.items():
            name, path = f"{subset}_{direction}", dataset.root / subset / file
            rows, skipped, why = read(dataset, subset, direction)
            if why is not None:
                result.skipped[f"{prefix}/{name}"] = why
                continue
            out_of_range = sum(not 0 <= r["label"] < r["candidates"] for r in rows)
            here = skipped + Counter({"label names no candidate (a miss under the reference's rule)": out_of_range}
                                     if out_of_range else {})
            n_skipped += note_skips(result, f"{prefix}/{name}", path, here, len(rows) + sum(skipped.values()))
            if not rows:
                result.skipped[f"{prefix}/{name}"] = f"no row to score in {path}"
                continue
            row_scores = scores(ctx, rows, direction)
            tie_aware, official = credits(row_scores, [r["label"] for r in rows])
            if len(tie_aware):
                result.add(f"{prefix}/{name}", tie_aware, ctx.n_boot)
            result.add(f"{prefix}/{name}_official", official, ctx.n_boot)
            per_subset[direction][subset] = (tie_aware, official)
            records += [{"subset": subset, "direction": direction, "query": r["query"], "label": r["label"],
                         "scores": [round(float(v), 5) for v in s]} for r, s in zip(rows, row_scores)]
    for direction, parts in per_subset.items():
        for which, suffix in ((0, ""), (1, "_official")):
            present = [p[which] for p in parts.values() if len(p[which])]
            if present:
                pooled = torch.cat(present)
                weights = torch.cat([torch.full((len(p),), len(pooled) / (len(present) * len(p)),
                                                dtype=torch.float64) for p in present])
                result.add(f"{prefix}/{direction}{suffix}", pooled * weights, ctx.n_boot)
    count_skips(result, prefix, n_skipped)
    if records:
        result.records[prefix] = records
    return result
