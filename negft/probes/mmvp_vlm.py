"""MMVP-VLM (Tong et al., CVPR 2024, "Eyes Wide Shut?"): pairs of images that CLIP embeds alike though they differ
in one visual detail, each with a short statement true of it; a pair counts only when each statement picks its
own image. Nine visual patterns, 15 pairs each in the release.

Released layout (MMVP/MMVP_VLM on Hugging Face; not in the GitHub repository, so it is taken from the reference's
loader, tsb0601/MMVP @ 7635005: ``scripts/evaluate_vlm.py``): ``Questions.csv``, a header row and then rows of
three fields ``Question ID, Type, Statement``, read by position; the two images of a pair are
``MLLM_VLM Images/<Type>/<Question ID>.jpg`` (the script's folder name, with a space; the repository's README
draws the tree as ``MMVP_VLM_Images/``, which no code reads). Types, as the folders are named: Orientation,
Presence, State, Quantity, Spatial, Color, Structural Character, Text, Camera Perspective (question ids 1-30,
31-60, ... 241-270 in that order). Pairs are consecutive rows: the first and second row after the header, the
third and fourth, ...; a last row without a partner is dropped. Both images are looked up in the folder of the
pair's first row's Type.

Scoring, with s(t, i) the cosine similarity of image i and the text ``"a photo of " + Statement`` (the reference's
prompt):

- ``<type>`` (the Type in lower case, ``_`` for spaces: ``orientation``, ``camera_perspective``, ...) and
  ``<type>_official``: the share of the Type's pairs that count.
  ``_official``, the reference's rule: a statement "predicts" image 1 when ``softmax(logit_scale · [s(t, 1),
  s(t, 2)])[0] > 0.5``, i.e. s(t, 1) > s(t, 2) (but for scores within ~1e-8, which that float32 softmax rounds
  to 0.5), else image 2 (a tie goes to image 2); its answer is image 1 when its Question ID is odd, else
  image 2; a pair counts when both statements predict their answer. negft's rule:
  each statement's credit is 1 when its own image (its row's) scores higher than the other, 1/2 on a tie, 0
  otherwise, and a pair's credit is the product: ties broken at random in expectation, so a model that cannot
  tell the images apart scores 1/4, not the 0 the reference gives. The two agree where there is no tie and the
  first statement of every pair has an odd Question ID (the release: 1, 3, ... 269).
- ``average`` (and ``_official``): the unweighted mean of the Types' scores (per-pair values reweighted as for
  SugarCrepe's macro average, so the interval and paired tests work). The reference returns the nine pattern
  accuracies only, in percent; with 15 pairs per pattern this mean is also the share of all pairs.

Where negft's reading differs from the script's on other files: the script assigns a pair to a pattern by its
position (pairs 1-15 the first pattern, ...) and divides each count by the number of pairs // 9; negft groups
pairs by their Type and divides by the Type's own count. On the release (135 pairs in Type order) the two are the
same; on a file with other counts the script's numbers are not accuracies (and past 135 pairs it stops with an
IndexError).

An empty Statement is scored as the reference scores it, under both rules: its prompt is ``"a photo of "``. An
empty Type is read as the script reads it, the pair's images directly in ``MLLM_VLM Images/`` (``os.path.join``
skips the empty part), its pattern named ``untyped``.

Rows that cannot be scored are skipped, with the pair they belong to, and counted by reason in ``skipped_rows`` (a
count, only when rows were skipped) and ``<prefix>/rows`` in ``skipped``: not three fields, a Question ID that is
not an integer, the two rows of a pair with different Types, an image file not found, and the last row without a
partner (the script drops that one too; it stops with an error at the others, but for a pair whose rows name
different Types, which it scores with both images from the first row's Type folder where they exist there). A
missing ``Questions.csv`` skips the dataset with its path.
"""
from __future__ import annotations

import csv
import os
import re
from collections import Counter

import torch

from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult, parse_once, require, resolve
from negft.probes.released import report_skips
from negft.probes.similarity import grid_scores
from negft.probes.stats import pair_credits

FILE = "Questions.csv"
IMAGES = "MLLM_VLM Images"
PROMPT = "a photo of "          # the reference's prefix to every statement
PARTNER = "the other row of its pair cannot be scored"


def _csv_rows(path) -> list[list[str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.reader(f))[1:]       # the header, skipped by position as the reference does


def _row(fields: list[str]) -> tuple[dict | None, str | None]:
    """(the row's question id, type and statement, or None; why it cannot be scored)."""
    if len(fields) != 3:
        return None, f"expected 3 fields, found {len(fields)}"
    qid, qtype, statement = fields             # as they are: the reference uses them unchanged
    try:
        qid = int(qid)
    except ValueError:
        return None, "Question ID not an integer"
    return {"qid": qid, "type": qtype, "statement": statement}, None


def _pair(dataset: Dataset, first: list[str], second: list[str]) -> tuple[dict | None, list[str]]:
    """(the pair of two consecutive rows, or None; why each of its rows cannot be scored, [] when both can)."""
    rows = [_row(first), _row(second)]
    whys = [why for _, why in rows]
    if any(whys):
        return None, [why or PARTNER for why in whys]
    (a, _), (b, _) = rows
    if a["type"] != b["type"]:
        return None, ["the rows of a pair name different Types"] * 2
    images = [resolve(dataset.root, os.path.join(IMAGES, a["type"], f"{r['qid']}.jpg")) for r in (a, b)]
    found = [os.path.isfile(p) for p in images]
    if not all(found):
        return None, [PARTNER if ok else "image file not found" for ok in found]
    return {"type": a["type"], "qids": (a["qid"], b["qid"]), "statements": (a["statement"], b["statement"]),
            "images": images}, []


def read_pairs(dataset: Dataset) -> tuple[list[dict], Counter]:
    """(pairs that can be scored, skipped rows by reason); ``Questions.csv`` must exist."""
    rows = parse_once(dataset.root / FILE, _csv_rows)
    pairs, skipped = [], Counter()
    for k in range(0, len(rows) - 1, 2):
        pair, whys = _pair(dataset, rows[k], rows[k + 1])
        skipped.update(whys)
        if pair is not None:
            pairs.append(pair)
    if len(rows) % 2:
        skipped["last row without a partner"] += 1
    return pairs, skipped


def prompts(pairs: list[dict]) -> list[str]:
    """Each pair's two prompted statements, pair by pair: what ``run`` encodes."""
    return [PROMPT + s for p in pairs for s in p["statements"]]


def texts(dataset: Dataset) -> list[str]:
    return prompts(read_pairs(dataset)[0]) if (dataset.root / FILE).exists() else []


def pattern(qtype: str) -> str:
    """A Type as a metric-name part: ``Camera Perspective`` -> ``camera_perspective``."""
    return re.sub(r"[^a-z0-9]+", "_", qtype.lower()).strip("_") or "untyped"


def credits(s: torch.Tensor, qids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(negft's credit, the reference's) per pair from s[n, statement, image] (N, 2, 2) and the pairs' question
    ids (N, 2)."""
    own, other = s.diagonal(dim1=1, dim2=2), s.flip(2).diagonal(dim1=1, dim2=2)
    tie_aware = pair_credits(own, other)[0].prod(1)
    picks_first = s[:, :, 0] > s[:, :, 1]
    answer_first = qids % 2 == 1
    return tie_aware, (picks_first == answer_first).all(1).double()


@register("mmvp_vlm", texts=texts, version=2, metrics=("<x>", "average"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    prefix = f"mmvp_vlm/{dataset.name}"
    path = require(dataset, dataset.root / FILE)
    pairs, skipped = read_pairs(dataset)
    report_skips(result, prefix, path, skipped, len(pairs) * 2 + sum(skipped.values()))
    if not pairs:
        result.skipped.setdefault(prefix, f"no pair to score in {path}")
        return result
    n = len(pairs)
    images = ctx.encode_images([i for p in pairs for i in p["images"]]).view(n, 2, -1)
    statements = ctx.encode_texts(prompts(pairs)).view(n, 2, -1)
    s = grid_scores(statements, images)
    by_rule = dict(zip(("", "_official"), credits(s, torch.tensor([p["qids"] for p in pairs]))))
    types = [pattern(p["type"]) for p in pairs]
    groups = {t: torch.tensor([x == t for x in types]) for t in dict.fromkeys(types)}
    for suffix, values in by_rule.items():
        for name, mask in groups.items():
            result.add(f"{prefix}/{name}{suffix}", values[mask], ctx.n_boot)
        weights = torch.stack([mask.double() * n / (len(groups) * mask.sum()) for mask in groups.values()]).sum(0)
        result.add(f"{prefix}/average{suffix}", values * weights, ctx.n_boot)
    result.records[prefix] = [
        {"type": p["type"], "qids": list(p["qids"]), "statements": list(p["statements"]), "images": p["images"],
         "scores": [[round(float(v), 5) for v in row] for row in s[i]], "credit": float(by_rule[""][i]),
         "official": float(by_rule["_official"][i])}
        for i, p in enumerate(pairs)]
    return result
