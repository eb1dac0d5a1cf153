"""SugarCrepe++ (Dumpala et al., NeurIPS 2024 Datasets and Benchmarks): per image two true captions that say the
same thing in different words and one hard negative (SugarCrepe's), in five splits: is the model's similarity
driven by meaning or by shared words?

Released layout (Sri-Harsha/scpp @ c083bbf: ``data/<split>.json``, read by ``VLMs/test_Variants_CLIP.py``, the
open_clip evaluation; ``VLMs/data/`` holds the same files): one JSON file per split, ``replace_att.json,
replace_obj.json, replace_rel.json, swap_att.json, swap_obj.json``, each a *list* of rows ``{"id": <int>,
"filename", "caption", "caption2", "negative_caption"}`` (``caption`` is P1, SugarCrepe's caption; ``caption2``
P2, the new positive; ``id`` is not read). ``filename`` is a COCO val2017 file name in a flat folder
``images/`` beside ``data/`` (``VLMs/download_coco_images.sh`` moves val2017's JPEGs there; the evaluation opens
``os.path.join('images/', filename)``). negft reads the same two folders under the dataset's root; the world's
split has them too (its ``images/`` are the world's own).

Metrics (``sugarcrepe_pp/<dataset>/<split>_<metric>``), with s(I, t) the cosine similarity of the image and
caption t, s(t, u) that of two captions' text features, and P1, P2, N a row's captions:

- ``itt`` (image-to-text): N scores below both P1 and P2. ``_official``: the reference's ``cos_p1 > cos_neg and
  cos_p2 > cos_neg`` (strict: a tie is a miss). negft's: the chance of that with tied scores put in random
  order: 0 when a positive scores below N, else 1 / (1 + the number of positives tied with N), so a model that
  scores all three the same gets 1/3, the chance level of picking the negative out of three.
- ``tot`` (text only): s(P1, P2) above both s(P1, N) and s(P2, N). ``_official``: the reference's ``cos_p1p2 >
  cos_p1_neg and cos_p1p2 > cos_p2_neg``; negft's: ties as for ``itt``.
- ``itt_p1``, ``itt_p2``: s(I, P1) > s(I, N), resp. P2 (the reference's "Image-P1-Neg", "Image-P2-Neg"). negft's:
  1/2 on a tie; ``_official``: strict.

- ``<category>_itt_macro``, ``<category>_tot_macro`` (and ``_official``) for replace (replace_att, replace_obj,
  replace_rel), swap (swap_att, swap_obj) and overall (the five): the unweighted mean of the category's split
  scores, as the papers that compare on SugarCrepe++ print them per category (per-example values reweighted as in
  ``negft.probes.sugarcrepe``, so intervals and paired tests work). The reference prints the four per split only.

It keeps every row (no filter):
``_official`` is over the same rows as negft's rule. A caption that is the empty string is a text like any other
(the reference's ``open_clip`` tokenizer reads "" as start and end tokens, and its loop scores the row), under
both rules. ``skipped_rows`` (a count; only when rows were skipped) and ``<prefix>/<split>/rows`` in ``skipped``:
rows left out because they cannot be scored, by reason (not an object, a caption key missing or not a string, the
file name missing or empty, image file not found); the reference stops with an error at each of these.

A split whose file is absent is skipped with its path; an unreadable file (not JSON, not a list) with the
reason; the other splits still run.
"""
from __future__ import annotations

import os
from collections import Counter

import torch

from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult, resolve
from negft.probes.released import bad_object, file_rows, finish, parsed_rows, read_json
from negft.probes.similarity import option_scores
from negft.probes.stats import part_means

SPLITS = ("replace_att", "replace_obj", "replace_rel", "swap_att", "swap_obj")
CATEGORIES = {"replace": ("replace_att", "replace_obj", "replace_rel"), "swap": ("swap_att", "swap_obj"),
              "overall": SPLITS}
CAPTIONS = ("caption", "caption2", "negative_caption")     # P1, P2, N: the order ``run`` encodes them in
KEYS = ("filename", *CAPTIONS)
DATA, IMAGES = "data", "images"        # the folders under the root, as the reference's evaluation reads them


def split_file(dataset: Dataset, split: str):
    return dataset.root / DATA / f"{split}.json"


def _rows(path) -> list:
    """[(row, None)] for a row that can be read, [(None, why)] for one that cannot, or [("file", why)]."""
    data, why = read_json(path, list)
    if data is None:
        return [("file", why)]
    return [(None, bad) if (bad := bad_object(row, KEYS, may_be_empty=CAPTIONS)) else (row, None) for row in data]


def read_split(dataset: Dataset, split: str) -> tuple[list[dict], Counter, str | None]:
    """(rows that can be scored, skipped rows by reason, why the whole file is skipped or None)."""
    parsed, skipped, why = parsed_rows(dataset, split_file(dataset, split), _rows)
    rows = []
    for row, _ in parsed:
        image = resolve(dataset.root / IMAGES, row["filename"])
        if not os.path.isfile(image):
            skipped["image file not found"] += 1
            continue
        rows.append({"id": row.get("id"), "image": image, **{k: row[k] for k in CAPTIONS}})
    return rows, skipped, why


def caption_triples(rows: list[dict]) -> list[str]:
    """Each row's P1, P2 and N, row by row: what ``run`` encodes."""
    return [r[k] for r in rows for k in CAPTIONS]


def texts(dataset: Dataset) -> list[str]:
    return [t for split in SPLITS for t in caption_triples(read_split(dataset, split)[0])]


def rank_credits(top: torch.Tensor, others: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(negft's credit, the reference's credit) that score ``top`` (N,) is above every column of ``others``
    (N, k): the reference's is strict on each; negft's is the chance of it with tied scores in random order."""
    top = top.unsqueeze(1)
    tied = (others == top).sum(1)
    tie_aware = (others <= top).all(1).double() / (1 + tied).double()
    return tie_aware, (others < top).all(1).double()


def credits(image_scores: torch.Tensor, text_scores: torch.Tensor) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """metric -> (negft's credits, the reference's) from s(I, ·) (N, 3) and [s(P1, P2), s(P1, N), s(P2, N)]
    (N, 3), columns in ``CAPTIONS`` order."""
    p1, p2, neg = image_scores.unbind(1)
    return {"itt": rank_credits(-neg, -image_scores[:, :2]),       # N below both: -N above both -P
            "tot": rank_credits(text_scores[:, 0], text_scores[:, 1:]),
            "itt_p1": rank_credits(p1, neg.unsqueeze(1)),
            "itt_p2": rank_credits(p2, neg.unsqueeze(1))}


def text_scores(captions: torch.Tensor) -> torch.Tensor:
    """[s(P1, P2), s(P1, N), s(P2, N)] (N, 3) of text features (N, 3, D) in ``CAPTIONS`` order."""
    p1, p2, neg = captions.unbind(1)
    return torch.cat([option_scores(p1, torch.stack([p2, neg], 1)), option_scores(p2, neg.unsqueeze(1))], 1)


@register("sugarcrepe_pp", texts=texts, version=2, metrics=("<x>_itt", "<x>_tot", "<x>_itt_p1", "<x>_itt_p2",
                                                            "<x>_itt_macro", "<x>_tot_macro"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    prefix = f"sugarcrepe_pp/{dataset.name}"
    n_skipped, records = 0, []
    per_split: dict[str, dict] = {}
    for split in SPLITS:
        rows, n = file_rows(result, f"{prefix}/{split}", read_split(dataset, split), split_file(dataset, split))
        n_skipped += n
        if rows is None:
            continue
        images = ctx.encode_images([r["image"] for r in rows])
        captions = ctx.encode_texts(caption_triples(rows)).view(len(rows), 3, -1)
        image_scores, pair_scores = option_scores(images, captions), text_scores(captions)
        by_metric = credits(image_scores, pair_scores)
        per_split[split] = by_metric
        for metric, both in by_metric.items():
            result.add_rules(f"{prefix}/{split}_{metric}", both, ctx.n_boot)
        records += [{"split": split, "id": r["id"], "image": r["image"], **{k: r[k] for k in CAPTIONS},
                     "image_scores": [round(float(v), 5) for v in image_scores[i]],
                     "text_scores": [round(float(v), 5) for v in pair_scores[i]],
                     **{m: float(c[0][i]) for m, c in by_metric.items()}}
                    for i, r in enumerate(rows)]
    for category, splits in CATEGORIES.items():
        present = [s for s in splits if s in per_split]
        for metric in ("itt", "tot"):
            for which, suffix in ((0, ""), (1, "_official")) if present else ():
                _, macro = part_means([per_split[s][metric][which] for s in present])
                result.add(f"{prefix}/{category}_{metric}_macro{suffix}", macro, ctx.n_boot)
    return finish(result, prefix, n_skipped, records)
