"""CREPE (Ma et al., CVPR 2023, "CREPE: Can Vision-Language Foundation Models Reason Compositionally?"): retrieve
an image region's caption from among its hard negatives, by productivity (caption complexity 4 to 12, three kinds
of hard negative) and by systematicity (captions whose compounds a pretraining set has seen, or not).

Released layout (RAIVNLab/CREPE @ 1fa81c4: ``data/prod_hard_negatives.zip``, ``data/syst_hard_negatives.zip``; the
zips are in the repository but were not in the snapshot read, so the layout is the loader's,
``crepe_compo_eval_open_clip.py`` ``gather_params`` and ``crepe_eval_utils.py`` ``BaseCsvDataset``):

- productivity: ``prod_hard_negatives/<type>/prod_vg_hard_negs_<type>_complexity_<n>.csv`` for ``<type>`` in
  atom, swap, negate and ``<n>`` in 4..12 (27 files; the README's ``--input-dir`` is the unzipped folder);
  columns ``image_id, caption, x, y, width, height, hard_negs``.
- systematicity: ``syst_hard_negatives/syst_vg_hard_negs_<seen|unseen>_compounds_in_<set>.csv``, ``<set>`` the
  pretraining set whose vocabulary splits seen from unseen compounds (cc12m, yfcc, laion); columns ``image_id,
  caption, x, y, width, height`` and ``valid_hard_negs_atom``, ``valid_hard_negs_comp``,
  ``valid_hard_negs_combined`` (atom + comp).
- A list cell is the Python literal pandas writes for ``str(list)`` (``"['a red car', 'a blue car']"``, read by
  ``ast.literal_eval``; here ``negft.data.schema.list_cell``, never ``eval``).
- ``image_id`` names a Visual Genome image ``<image_id>.jpg`` looked up in ``VG_100K`` then ``VG_100K_2``
  (``get_image_by_id``); here those folders under the root, or the manifest's ``image_dirs``. The image is
  cropped to the region ``x, y, width, height`` (``TF.crop(image, y, x, height, width)``, PIL's
  ``crop((x, y, x + width, y + height))``) before the transform.

The README: "the systematicity eval set should only be used to evaluate models pretrained on CC12M, YFCC15M or
LAION400M": ``..._in_laion.csv`` splits seen from unseen by LAION-400M's captions, so its ``unseen`` number
measures systematicity only for a model pretrained on LAION-400M (likewise cc12m, yfcc). Every pretraining set's
files found are scored, each under its own name; which one means something is the reader's call. The world's
split writes ``..._in_world.csv``, unseen meaning the world's held-out colour-shape combinations.

Metrics (``crepe/<dataset>/<metric>``), with s(t) the cosine similarity of the cropped image and text t; each
example's options are its caption followed by its hard negatives, as the reference's:

- ``prod_<type>_<n>`` (negft's rule): recall@1 of the caption with ties shared: 1/m when the caption ties m − 1
  negatives at the top score, 0 below (``stats.choice_credit``). ``prod_<type>`` pools the type's nine files
  (a micro mean; the reference reports each file alone).
- ``syst_<set>_<seen|unseen>_<atom|comp|combined>``: the same over the file's column of hard negatives.
- ``..._official``: the reference's ``get_one2many_rank`` and ``R@1``: a hit when index 0 comes first in
  ``torch.argsort(scores, descending=True)`` (here the same call on the same CPU tensor, one row at a time as
  the reference's batch of one). That sort keeps ties in index order on rows of up to 16 options on the CPU
  (measured with torch 2.x), so a tie there goes to the caption, placed first; on longer rows, or a GPU, the
  order of ties is PyTorch's. A row whose list is empty (``[]``) has one option and is a hit, as in the
  reference; negft's rule leaves it out (``skipped``).
- The rest of what the reference's ``get_one2many_metrics`` prints per file, from each row's rank (the caption's
  0-based position in that ``argsort``), all ``_official``: ``<name>_mean_rank_official`` (mean rank + 1),
  ``<name>_rank_std_official`` (the ranks' ``np.std``, over n), ``<name>_median_rank_official`` (``floor(median)
  + 1``), ``<name>_r<k>_official`` for k = 3, 5, 10 (R@1 is ``<name>_official``) and ``<name>_r<k>_std_official``
  for k = 1, 3, 5, 10 (``np.std`` of the 0/1 hits). Their intervals: the bootstrap of the mean, or of the
  statistic itself for a median or a spread (``stats.statistic_ci``). negft's own rule also gives
  ``<name>_r<k>`` (k = 3, 5, 10) and ``<name>_mean_rank`` with tied options in random order (the caption's
  position uniform among its ties), over the rows with a hard negative.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows left out (an empty
  ``image_id`` or caption, a box not of integers or with no area, a list cell that is not a list of strings,
  no hard negative, the image not found); each file with skipped rows has an entry ``<prefix>/<name>/rows``
  in ``skipped`` naming it and counting them by reason. The reference has no filter: it stops at a bad cell or
  a missing image, and scores an empty caption as the text "nan" (pandas), which negft does not.

A file that is absent is skipped with its path, an unreadable one (no such columns) with the reason; the other
files still run. With neither folder present the probe is skipped for the dataset (``DataNotFound``).
"""
from __future__ import annotations

import csv
import functools
import os
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from negft.data.schema import list_cell
from negft.probes import register
from negft.probes.base import DataNotFound, Dataset, EvalContext, ProbeResult, crop_key, missing, parse_once, \
    resolve
from negft.probes.released import count_skips, note_skips, section
from negft.probes.similarity import option_scores
from negft.probes.stats import choice_credit, statistic_ci

PROD_DIR, SYST_DIR = "prod_hard_negatives", "syst_hard_negatives"
TYPES = ("atom", "swap", "negate")
COMPLEXITIES = tuple(range(4, 13))
SYST_SPLITS = ("seen", "unseen")
SYST_NEGATIVES = ("atom", "comp", "combined")        # columns valid_hard_negs_<kind>
PROD_COLUMN = "hard_negs"
BOX = ("x", "y", "width", "height")
IMAGE_DIRS = ("VG_100K", "VG_100K_2")                # get_image_by_id's folders, in its order
SYST_PREFIX, SYST_INFIX = "syst_vg_hard_negs_", "_compounds_in_"
# per file, beside R@1 (the file's own name): get_one2many_metrics' other numbers (``_official``; negft's own rule
# gives r3, r5, r10 and mean_rank too)
RANK_METRICS = ("_mean_rank", "_rank_std", "_median_rank", "_r<k>", "_r<k>_std")


def prod_path(root: Path, kind: str, n: int) -> Path:
    return Path(root) / PROD_DIR / kind / f"prod_vg_hard_negs_{kind}_complexity_{n}.csv"


def syst_path(root: Path, split: str, pretraining: str) -> Path:
    return Path(root) / SYST_DIR / f"{SYST_PREFIX}{split}{SYST_INFIX}{pretraining}.csv"


def pretraining_sets(root: Path) -> list[str]:
    """The pretraining sets the systematicity folder has a file for (``..._compounds_in_<set>.csv``), sorted."""
    found = {p.stem.split(SYST_INFIX, 1)[1] for p in (Path(root) / SYST_DIR).glob(f"{SYST_PREFIX}*{SYST_INFIX}*.csv")}
    return sorted(found)


def tasks(root: Path) -> list[tuple[str, Path, str]]:
    """(metric name, file, hard-negative column) of every task, productivity first."""
    out = [(f"prod_{kind}_{n}", prod_path(root, kind, n), PROD_COLUMN) for kind in TYPES for n in COMPLEXITIES]
    for pretraining in pretraining_sets(root):
        for split in SYST_SPLITS:
            out += [(f"syst_{pretraining}_{split}_{neg}", syst_path(root, split, pretraining),
                     f"valid_hard_negs_{neg}") for neg in SYST_NEGATIVES]
    return out


def _int(cell) -> int | None:
    """An integer cell as pandas reads one ("12", " 12 "), else None."""
    try:
        return int((cell or "").strip())
    except ValueError:
        return None


def _row(r: dict, column: str):
    """(image_id, box, caption, negatives) of a CSV row, or (None, why it cannot be scored)."""
    image_id, caption = (r.get("image_id") or "").strip(), (r.get("caption") or "").strip()
    if not image_id:
        return None, "empty image_id"
    if not caption:
        return None, "empty caption"
    box = [_int(r.get(k)) for k in BOX]
    if None in box:
        return None, "box not integers"
    if box[2] <= 0 or box[3] <= 0:
        return None, "box with no area"
    try:
        negatives = list_cell(r.get(column) or "")
    except ValueError:
        return None, f"'{column}' not a list of strings"
    return (image_id, box, r["caption"], negatives), None


def _parse(column: str, path) -> list:
    """[(row, None) | (None, reason)] of a file, or [("file", reason)] when it lacks a column."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        lacks = [c for c in ("image_id", "caption", *BOX, column) if c not in (reader.fieldnames or ())]
        if lacks:
            return [("file", f"no column {', '.join(lacks)}")]
        return [_row(r, column) for r in reader]


# one parser per column, so parse_once keeps one parse per file and column
PARSERS = {c: functools.partial(_parse, c) for c in (PROD_COLUMN, *(f"valid_hard_negs_{n}" for n in SYST_NEGATIVES))}


def image_dirs(dataset: Dataset) -> list[str]:
    """The folders ``<image_id>.jpg`` is looked up in, in order: the manifest's ``image_dirs`` (relative to the
    root, or absolute), else VG_100K and VG_100K_2 under the root."""
    return [resolve(dataset.root, d) for d in section(dataset, "image_dirs", IMAGE_DIRS)]


def _image(dirs: list[str], image_id: str) -> str | None:
    return next((p for p in (os.path.join(d, f"{image_id}.jpg") for d in dirs) if os.path.isfile(p)), None)


def read_task(dataset: Dataset, path: Path, column: str) -> tuple[list[dict], Counter, str | None]:
    """(examples, skipped rows by reason, why the whole file is skipped or None). An example with no hard
    negative is kept (``negatives`` empty): the reference scores it, negft's rule leaves it out."""
    if not path.exists():
        return [], Counter(), missing(dataset, path)
    parsed = parse_once(path, PARSERS[column])
    if parsed and parsed[0][0] == "file":
        return [], Counter(), f"{path}: {parsed[0][1]}"
    dirs, rows, skipped = image_dirs(dataset), [], Counter()
    for row, why in parsed:
        if row is not None:
            image_id, box, caption, negatives = row
            image = _image(dirs, image_id)
            if image is None:
                row, why = None, "image file not found"
        if row is None:
            skipped[why] += 1
            continue
        x, y, w, h = box
        rows.append({"image_id": image_id, "image": crop_key(image, (x, y, x + w, y + h)), "caption": caption,
                     "negatives": negatives})
    return rows, skipped, None


def options(row: dict) -> list[str]:
    """An example's options, the caption first (the reference's order)."""
    return [row["caption"], *row["negatives"]]


def texts(dataset: Dataset) -> list[str]:
    return [t for _, path, column in tasks(dataset.root) for r in read_task(dataset, path, column)[0]
            for t in options(r)]


def official_hit(scores: torch.Tensor) -> float:
    """The reference's R@1 of one example's scores (K,): index 0 first in ``torch.argsort(descending=True)``."""
    return float(official_rank(scores) == 0)


def official_rank(scores: torch.Tensor) -> int:
    """The reference's ``get_one2many_rank`` of one example's scores (K,): the 0-based position of index 0 (the
    caption) in ``torch.argsort(descending=True)`` of the (1, K) row."""
    return int(torch.where(torch.argsort(scores.view(1, -1), descending=True)[0] == 0)[0][0])


RANKS_AT = (1, 3, 5, 10)                  # get_one2many_metrics' R@k


def tie_ranks(scores: torch.Tensor) -> dict[str, float] | None:
    """negft's rank metrics of one example (K,), the caption first, ties in random order (its position uniform
    among the options it ties): the expected rank and the chance of R@k; None without a hard negative."""
    if len(scores) < 2:
        return None
    above = int((scores[1:] > scores[0]).sum())
    tied = int((scores[1:] == scores[0]).sum())
    out = {"mean_rank": above + tied / 2 + 1}
    out.update({f"r{k}": min(max(k - above, 0), tied + 1) / (tied + 1) for k in RANKS_AT[1:]})
    return out


def add_rank_metrics(result: ProbeResult, key: str, scores: list[torch.Tensor], n_boot: int) -> None:
    """The reference's per-file rank metrics (``get_one2many_metrics``) as ``_official``, and negft's
    ``r<k>`` / ``mean_rank`` with ties in random order."""
    ranks = np.array([official_rank(s) for s in scores], dtype=np.float64)
    result.add(f"{key}_mean_rank_official", ranks + 1, n_boot)
    spread = {"rank_std": (np.std(ranks), ranks, np.std),
              "median_rank": (np.floor(np.median(ranks)) + 1, ranks, lambda a, axis: np.floor(np.median(a, axis)) + 1)}
    for k in RANKS_AT:
        hits = (ranks < k).astype(np.float64)
        if k > 1:
            result.add(f"{key}_r{k}_official", hits, n_boot)
        spread[f"r{k}_std"] = (np.std(hits), hits, np.std)
    for name, (value, values, statistic) in spread.items():
        result.metrics[f"{key}_{name}_official"] = float(value)
        result.ci95[f"{key}_{name}_official"] = list(statistic_ci(values, statistic, n_boot))
    tie = [t for t in map(tie_ranks, scores) if t is not None]
    for name in (tie[0] if tie else ()):
        result.add(f"{key}_{name}", torch.tensor([t[name] for t in tie], dtype=torch.float64), n_boot)


def score(ctx: EvalContext, rows: list[dict]) -> list[torch.Tensor]:
    """Each example's option scores (K,), batched by number of options."""
    out: list[torch.Tensor | None] = [None] * len(rows)
    by_k: dict[int, list[int]] = {}
    for i, r in enumerate(rows):
        by_k.setdefault(len(r["negatives"]) + 1, []).append(i)
    for k, idx in by_k.items():
        images = ctx.encode_images([rows[i]["image"] for i in idx])
        opts = ctx.encode_texts([t for i in idx for t in options(rows[i])]).view(len(idx), k, -1)
        for i, s in zip(idx, option_scores(images, opts)):
            out[i] = s
    return out


def tie_credit(scores: torch.Tensor) -> float | None:
    """negft's recall@1 of one example's scores (K,), the caption first: 1/m when it ties m − 1 others at the
    top; None without a hard negative (K = 1)."""
    if len(scores) < 2:
        return None
    return float(choice_credit(scores.view(1, -1), torch.zeros(1, dtype=torch.long))[0])


@register("crepe", texts=texts, version=2,
          metrics=tuple(f"{t}_<x>{m}" for t in ("prod", "syst") for m in ("", *RANK_METRICS)),
          lower=tuple(f"{t}_<x>{m}" for t in ("prod", "syst") for m in ("_mean_rank", "_median_rank")),
          unordered=tuple(f"{t}_<x>{m}" for t in ("prod", "syst") for m in ("_rank_std", "_r<k>_std")))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    if not (dataset.root / PROD_DIR).is_dir() and not (dataset.root / SYST_DIR).is_dir():
        raise DataNotFound(dataset, dataset.root / PROD_DIR, f" (nor {dataset.root / SYST_DIR})")
    result, prefix = ProbeResult(), f"crepe/{dataset.name}"
    pooled: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] = {kind: [] for kind in TYPES}
    records, n_skipped = [], 0
    for name, path, column in tasks(dataset.root):
        rows, skipped, why = read_task(dataset, path, column)
        if why is not None:
            result.skipped[f"{prefix}/{name}"] = why
            continue
        empty = sum(not r["negatives"] for r in rows)
        skipped_here = skipped + Counter({"no hard negative (a hit under the reference's rule)": empty} if empty
                                         else {})
        n_skipped += note_skips(result, f"{prefix}/{name}", path, skipped_here, len(rows) + sum(skipped.values()))
        if not rows:
            result.skipped[f"{prefix}/{name}"] = f"no row to score in {path}"
            continue
        scores = score(ctx, rows)
        tie = [tie_credit(s) for s in scores]
        tie_aware = torch.tensor([c for c in tie if c is not None], dtype=torch.float64)
        official = torch.tensor([official_hit(s) for s in scores], dtype=torch.float64)
        if len(tie_aware):
            result.add(f"{prefix}/{name}", tie_aware, ctx.n_boot)
        result.add(f"{prefix}/{name}_official", official, ctx.n_boot)
        add_rank_metrics(result, f"{prefix}/{name}", scores, ctx.n_boot)
        if name.startswith("prod_"):
            pooled[name.split("_")[1]].append((tie_aware, official))
        records += [{"task": name, "image_id": r["image_id"], "image": r["image"], "caption": r["caption"],
                     "scores": [round(float(v), 5) for v in s], "credit": c, "official": float(o)}
                    for r, s, c, o in zip(rows, scores, tie, official)]
    for kind, parts in pooled.items():
        if parts:
            tie_aware = torch.cat([p[0] for p in parts])
            if len(tie_aware):
                result.add(f"{prefix}/prod_{kind}", tie_aware, ctx.n_boot)
            result.add(f"{prefix}/prod_{kind}_official", torch.cat([p[1] for p in parts]), ctx.n_boot)
    count_skips(result, prefix, n_skipped)
    if records:
        result.records[prefix] = records
    return result
