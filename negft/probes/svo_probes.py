"""SVO-Probes (Hendricks and Nematzadeh, Findings of ACL 2021, "Probing Image-Language Transformers for Verb
Understanding"): a sentence, an image it describes and an image that differs from it in the subject, the verb or
the object; the image it describes should score higher.

Released layout (google-deepmind/svo_probes @ 206219e ``README.md``, ``probing_image_text_models.ipynb``): one CSV,
``svo_probes.csv``, whose rows read ``sentence, pos_triplet, neg_triplet, pos_url, neg_url, pos_image_id,
neg_image_id, subj_neg, verb_neg, obj_neg`` (the three last ``True`` / ``False``: which part the negative image
changes). The images are not released, only their URLs (``image_urls.txt``, ``pos_url`` / ``neg_url``): a user
downloads them, and negft reads each as ``svo_images/<image id>.jpg`` beside the CSV (the id the notebook keys a
score by).

Metrics (``svo_probes/<dataset>/<metric>``), with s(image) the cosine similarity of the sentence and the image:

- ``subj_neg``, ``verb_neg``, ``obj_neg`` (negft): per row, 1 when s(positive) > s(negative), 1/2 on an exact tie,
  0 otherwise, over the rows of that negative type; ``acc`` over the three together. The notebook's selection: a
  type's rows are those whose flag is the only one set (``subj_neg & ~verb_neg & ~obj_neg``), and "All" is the
  three selections together.
- ``..._official``: the same rows with a strict ``>`` (a tie is wrong): the dual-encoder form of the notebook's
  ``accuracy``, which reads a match decision per (sentence, image) pair and averages "the positive matches" and
  "the negative does not": with each row's decision taken from its own comparison, both halves are the row's
  ``s(positive) > s(negative)``. FSC-CLIP's evaluation package (vl_compo), whose ``subj_neg`` / ``verb_neg`` /
  ``obj_neg`` columns users compare with, is not public (ytaek-oh/fsc-clip @ 604015d ``README.md``), so its tie
  rule is not known. The notebook keeps one score per (sentence, image) pair and counts a repeated pair once
  (``drop_duplicates``); a pair in two rows has two comparisons here, so the two agree on files without repeated
  pairs (``bench/parity/svo_probes.md``), and here every row counts.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows left out (a sentence
  missing or empty: pandas reads an empty cell as NaN, on which the notebook's ``sentence.lower()`` stops; an
  image id that is not an integer; a flag that is not True / False; not exactly one flag set, which the notebook's
  selection leaves out; an image file not found, whose pair the notebook drops for want of a score), counted by
  reason in ``skipped`` under ``<prefix>/rows``.

The CSV absent: skipped with its path; without one of the columns read: skipped naming them.
"""
from __future__ import annotations

import csv
import os
from collections import Counter

import torch

from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult
from negft.probes.released import read_rows, row_texts, rows_to_score
from negft.probes.similarity import option_scores
from negft.probes.stats import pair_credits

FILE = "svo_probes.csv"
IMAGES = "svo_images"             # <image id>.jpg, downloaded from the release's URLs
TYPES = ("subj_neg", "verb_neg", "obj_neg")
COLUMNS = ("sentence", "pos_image_id", "neg_image_id", *TYPES)
FLAGS = {"true": True, "false": False}     # as pandas reads a bool column (True, TRUE, true; False, ...)


def image_path(root, image_id: int) -> str:
    return os.path.join(root, IMAGES, f"{image_id}.jpg")


def _image_id(value) -> int | None:
    try:
        return int(value.strip())
    except (AttributeError, ValueError):
        return None


def _row(row: dict, root: str) -> tuple[dict | None, str | None]:
    sentence = row.get("sentence")
    if not isinstance(sentence, str) or not sentence.strip():
        return None, "sentence missing or empty (pandas reads it as NaN: the notebook stops at it)"
    ids = [_image_id(row.get(k)) for k in ("pos_image_id", "neg_image_id")]
    if None in ids:
        return None, "an image id is not an integer"
    flags = [FLAGS.get((row.get(t) or "").strip().lower()) for t in TYPES]
    if None in flags:
        return None, "a negative-type flag is not True / False"
    if sum(flags) != 1:
        return None, "not exactly one of subj_neg, verb_neg, obj_neg is True (the notebook's selection)"
    images = [image_path(root, i) for i in ids]
    if not all(os.path.isfile(p) for p in images):
        return None, "image file not found"
    return {"sentence": sentence, "pos": images[0], "neg": images[1], "type": TYPES[flags.index(True)],
            "ids": ids}, None


def _parse(path) -> list:
    """[(row, None) | (None, reason)], or [("file", reason)] when the CSV lacks a column read."""
    try:
        with open(path, newline="", encoding="utf-8-sig") as f:      # a byte-order mark, as pandas reads past it
            reader = csv.DictReader(f)
            absent = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
            if absent:
                return [("file", f"{path} has no column {', '.join(absent)} (expected the release's header: "
                                 f"{', '.join(COLUMNS)}, ...)")]
            root = os.path.dirname(os.fspath(path))
            return [_row(row, root) for row in reader]
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        return [("file", f"{path} is not a readable UTF-8 CSV ({type(e).__name__}: {e})")]


def read(dataset: Dataset) -> tuple[list[dict], Counter]:
    return read_rows(dataset, dataset.root / FILE, _parse)


def texts(dataset: Dataset) -> list[str]:
    return row_texts(dataset.root / FILE, _parse, "sentence")


def pair_scores(ctx: EvalContext, rows: list[dict]) -> torch.Tensor:
    """(N, 2) scores of each sentence against [its positive image, its negative image]."""
    sentences = ctx.encode_texts([r["sentence"] for r in rows])
    images = ctx.encode_images([p for r in rows for p in (r["pos"], r["neg"])]).view(len(rows), 2, -1)
    return option_scores(sentences, images).double()


@register("svo_probes", texts=texts, version=1, metrics=("subj_neg", "verb_neg", "obj_neg", "acc"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result, prefix = ProbeResult(), f"svo_probes/{dataset.name}"
    rows = rows_to_score(result, prefix, lambda: read(dataset), dataset.root / FILE)
    if rows is None:
        return result
    s = pair_scores(ctx, rows)
    credit, official = pair_credits(s[:, 0], s[:, 1])     # the reference's: strict >
    kinds = [r["type"] for r in rows]
    for kind in TYPES:
        mask = torch.tensor([k == kind for k in kinds])
        if mask.any():
            result.add_rules(f"{prefix}/{kind}", (credit[mask], official[mask]), ctx.n_boot)
        else:
            result.skipped[f"{prefix}/{kind}"] = f"no {kind} row to score in {dataset.root / FILE}"
    result.add_rules(f"{prefix}/acc", (credit, official), ctx.n_boot)
    result.records[prefix] = [{"sentence": r["sentence"], "pos_image_id": r["ids"][0], "neg_image_id": r["ids"][1],
                               "type": r["type"], "scores": [round(float(v), 5) for v in row]}
                              for r, row in zip(rows, s)]
    return result
