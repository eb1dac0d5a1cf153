"""SugarCrepe (Hsieh et al., NeurIPS 2023 Datasets and Benchmarks): pick the true caption of an image over one
hard negative that differs from it by a small compositional change, in seven splits.

Released layout (RAIVNLab/sugar-crepe ``data/*.json`` and ``main_eval.py``; the same files and keys are read by
LAION-AI/CLIP_benchmark ``clip_benchmark/datasets/sugar_crepe.py``): one JSON file per split,
``add_obj.json, add_att.json, replace_obj.json, replace_att.json, replace_rel.json, swap_obj.json,
swap_att.json``, each a dict ``{"<id>": {"filename", "caption", "negative_caption"}}`` (ids "0", "1", ... as
strings; CLIP_benchmark notes they may be non-contiguous); ``filename`` is a COCO val2017 file name resolved
against a separate image folder (``main_eval.py --coco_image_root``; CLIP_benchmark puts it at
``<root>/val2017``). Here the JSON files sit in the dataset's root and the image folder is the manifest's
``images`` key (negft/data_manifests/sugarcrepe.yaml: ``val2017``, relative to the root, or an absolute path); a
dataset without a manifest (the world's split) has it at ``val2017/`` beside the JSON files, CLIP_benchmark's
place, so ``clip_benchmark eval --dataset sugar_crepe/<split> --dataset_root <split folder>`` reads the world's.

Metrics (``sugarcrepe/<dataset>/<metric>``), with s(t) the cosine similarity of the image and text t:

- ``<split>`` (negft's rule): 1 when s(caption) > s(negative_caption), 1/2 on an exact tie, 0 otherwise, so a
  model that cannot tell them apart (equal scores) scores chance, 0.5.
- ``<split>_official``: SugarCrepe's rule, ``main_eval.py`` ``text_retrieval``: ``1 if pos_score > neg_score
  else 0`` (strict: a tie counts as wrong, so equal scores give 0). They differ only on exact ties.
  (CLIP_benchmark's ``image_caption_selection.py`` scores the same files by ``argmax == 0`` over
  ``[caption, negative_caption]``, which gives a tie to the caption: equal scores give 1. Not reported.)
- ``add_micro``, ``replace_micro``, ``swap_micro``, ``overall_micro`` (and ``..._official``): the mean over all
  examples of the category's splits (add: add_obj, add_att; replace: replace_obj, replace_att, replace_rel;
  swap: swap_obj, swap_att; overall: all seven), each example weighing the same.
- ``add_macro``, ``replace_macro``, ``swap_macro``, ``overall_macro`` (and ``..._official``): the unweighted mean
  of the category's split scores. Per-example values are the credits reweighted by n / (k · n_split) (n examples,
  k splits present), whose mean is the macro mean, so the interval and paired tests work as for any metric.
  SugarCrepe's code reports the seven split accuracies only; which average its paper's category figures use is
  not stated in the code, so both are given.
- ``swap_obj_same_words``, ``swap_att_same_words`` (and ``..._official``): the swap split's examples whose
  negative has exactly the caption's words (the same words, counted, case and punctuation aside), and
  ``..._new_words`` the others. A bag-of-words text encoder gives the first group exact ties (chance under negft's
  rule, 0 under SugarCrepe's), so a swap score mixes order sensitivity with how many of the split's negatives the
  generator rephrased; reported apart where a group has examples.
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows left out (not a dict,
  a key missing or not a non-empty string, image file not found); each split with skipped rows also has an
  entry ``<prefix>/<split>/rows`` in ``skipped`` naming the file and counting them by reason.

A split whose file is absent is skipped with its path; an unreadable file (not JSON, not a dict of rows) is
skipped with the reason; the other splits still run.
"""
from __future__ import annotations

import json
import re
from collections import Counter

import torch

from negft.probes import register
from negft.probes.released import bad_object, file_rows, finish, keyed_rows
from negft.probes.base import Dataset, EvalContext, ProbeResult, resolve
from negft.probes.similarity import caption_pair_scores
from negft.probes.stats import pair_credits, part_means

SPLITS = ("add_obj", "add_att", "replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att")
CATEGORIES = {"add": ("add_obj", "add_att"), "replace": ("replace_obj", "replace_att", "replace_rel"),
              "swap": ("swap_obj", "swap_att"), "overall": SPLITS}
KEYS = ("filename", "caption", "negative_caption")
IMAGES_KEY = "images"          # the manifest key naming the image folder (COCO val2017)
IMAGES = "val2017"             # the folder beside the JSON files, as CLIP_benchmark places it (``<root>/val2017``)


def _json_rows(path) -> list:
    """[(id, row)] of a split file, or [(None, reason)] when the file is not a JSON dict."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return [(None, f"unreadable JSON ({type(e).__name__}: {e})")]
    if not isinstance(data, dict):
        return [(None, f"expected a JSON object of id -> row, found {type(data).__name__}")]
    return list(data.items())


def image_root(dataset: Dataset, default: str = "") -> str:
    """The folder ``filename`` is resolved against: the manifest's ``images`` (relative to the root or
    absolute), else ``default`` under the root (the root itself when empty)."""
    sub = default
    if dataset.manifest:
        from negft.data import manifests
        try:
            sub = str(manifests.load(dataset.manifest).get(IMAGES_KEY) or default)
        except FileNotFoundError:
            pass
    return resolve(dataset.root, sub) if sub else str(dataset.root)


def _bad(row) -> str | None:
    """Why a row cannot be scored, or None."""
    return bad_object(row, KEYS)


def read_split(dataset: Dataset, split: str) -> tuple[list[dict], Counter, str | None]:
    """(rows that can be scored, skipped rows by reason, why the whole file is skipped or None)."""
    return keyed_rows(dataset, dataset.root / f"{split}.json", _json_rows, _bad, image_root(dataset, IMAGES),
                      "filename", lambda key, row, image: {"id": key, "image": image, "caption": row["caption"],
                                                           "negative_caption": row["negative_caption"]})


def same_words(a: str, b: str) -> bool:
    """Whether two captions have the same words, each as often (order, case and punctuation aside)."""
    return Counter(re.findall(r"\w+", a.lower())) == Counter(re.findall(r"\w+", b.lower()))


def caption_pairs(rows: list[dict]) -> list[str]:
    """Each row's caption and negative caption, row by row: what ``run`` encodes."""
    return [t for r in rows for t in (r["caption"], r["negative_caption"])]


def texts(dataset: Dataset) -> list[str]:
    return [t for split in SPLITS for t in caption_pairs(read_split(dataset, split)[0])]


@register("sugarcrepe", texts=texts, version=3, metrics=(
    "add_obj", "add_att", "replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att", "<x>_micro",
    "<x>_macro", "<x>_same_words", "<x>_new_words"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result, prefix = ProbeResult(), f"sugarcrepe/{dataset.name}"
    per_split: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    records, n_skipped = [], 0
    for split in SPLITS:
        rows, n = file_rows(result, f"{prefix}/{split}", read_split(dataset, split), dataset.root / f"{split}.json")
        n_skipped += n
        if rows is None:
            continue
        pos, neg = caption_pair_scores(ctx, [r["image"] for r in rows], caption_pairs(rows))
        tie_aware, official = per_split[split] = pair_credits(pos, neg)     # SugarCrepe's: strict >
        result.add_rules(f"{prefix}/{split}", per_split[split], ctx.n_boot)
        if split in CATEGORIES["swap"]:
            same = torch.tensor([same_words(r["caption"], r["negative_caption"]) for r in rows])
            for group, mask in (("same_words", same), ("new_words", ~same)):
                if mask.any():
                    result.add_rules(f"{prefix}/{split}_{group}", (tie_aware[mask], official[mask]), ctx.n_boot)
        records += [{"split": split, "id": r["id"], "image": r["image"], "caption": r["caption"],
                     "negative_caption": r["negative_caption"], "pos": round(float(p), 5),
                     "neg": round(float(q), 5), "credit": float(c)}
                    for r, p, q, c in zip(rows, pos, neg, tie_aware)]
    for category, splits in CATEGORIES.items():
        present = [s for s in splits if s in per_split]
        if not present:
            continue
        for which, suffix in ((0, ""), (1, "_official")):
            micro, macro = part_means([per_split[s][which] for s in present])
            result.add(f"{prefix}/{category}_micro{suffix}", micro, ctx.n_boot)
            result.add(f"{prefix}/{category}_macro{suffix}", macro, ctx.n_boot)
    return finish(result, prefix, n_skipped, records)

