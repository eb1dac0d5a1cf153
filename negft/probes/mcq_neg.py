"""MCQ-Neg (NegBench, section 3 and figure 5): pick the one true caption of an image (or video) out of 2..N.

Released layout (m1k2zoo/negbench): one CSV per set with ``correct_answer, caption_0 .. caption_{N-1},
correct_answer_template, image_path`` (``benchmarks/src/training/data.py`` ``CsvMCQDataset``; written by
``synthetic_datasets/evaluation/create_mcq.py``; file names in ``datasets.md`` and
``benchmarks/scripts/evaluate_images.sh`` / ``evaluate_videos.sh``): COCO and VOC2007 (template:
``COCO_val_mcq.csv``, ``VOC2007_mcq.csv``; paraphrased: ``COCO_val_mcq_llama3.1_rephrased.csv``,
``VOC2007_mcq_llama3.1_rephrased.csv``), HardNeg-Syn (``synthetic_mcq_llama3.1_rephrased.csv``), MSR-VTT
(``msr_vtt_mcq_rephrased_llama.csv``, ``image_path`` naming a video: ``video_utils/video_dataset.py``
``CsvVideoMCQDataset``; see ``negft.probes.video``). CheXpert's binary MCQ (``chexpert_binary_mcq.csv``,
``chexpert_binary_mcq_control.csv``) has only ``image_path, caption_0, caption_1, correct_answer``
(``data.py`` ``CsvBinaryMCQDataset``). The options are the ``caption_<k>`` columns present, k = 0, 1, ...
(2 or more; NegBench's ``CsvMCQDataset`` reads ``caption_0..3`` and ``CsvBinaryMCQDataset`` ``caption_0, 1``,
which is all its files have); ``correct_answer_template`` ∈ {positive, negative, hybrid} when present. The file is the
manifest's ``probe_files: {mcq_neg: ...}`` (``negft.probes.released``); without one, ``mcq.csv`` (the world's
name).

Metrics (``mcq_neg/<dataset>/<metric>``), scores being the cosine similarity of image and option:

- ``acc`` (negft's rule): a right answer tied with k−1 other options at the top earns 1/k, so a constant
  model scores chance (1/N). ``acc_official``: NegBench's rule, ``benchmarks/src/evaluation/mcq.py``
  ``evaluate_model`` and ``evaluate_binary_mcq_model``: ``torch.argmax(logits, dim=1) == correct_answer``;
  ``torch.argmax`` returns the first maximum, so a tie goes to the lowest index. ``create_mcq.py`` always puts
  the right answer at index 0 (COCO, VOC2007, MSR-VTT), so there every tie is won: a constant model scores
  1.0 officially and 1/N here. They differ only on exact ties.
  Scores come from ``negft.probes.similarity``, so equal options tie exactly; NegBench's own
  ``torch.einsum('bf,nbf->bn')`` splits equal options by float rounding (~1e-8, by column), so on a file with
  duplicate options its number depends on the machine, and ``acc_official`` is its rule on exact scores.
- ``acc_<affirmation|negation|hybrid>`` and ``..._official``: the same over the questions whose right answer
  has that template (NegBench's ``positive_accuracy`` ...), where the CSV has ``correct_answer_template``.
- A question with no right option (``correct_answer`` empty, out of range or not a whole number: pandas reads
  the column as numbers, NaN for an empty or NA cell, and NegBench's argmax never equals such a value): a miss
  in every ``..._official`` (NegBench divides by every row of the file), left out of ``acc`` and
  ``acc_<x>`` (no option can earn its credit); a ``skipped`` entry ``<prefix>/acc`` says how many.
- ``chose_<template>`` (tie-aware share of the pick) and ``chose_<template>_official`` (the argmax pick): how
  often the pick lands on an option of that template, figure 5; ``chose_<template>_on_<answer template>``: the
  same among questions of one answer template. NegBench's ``predictions_by_type`` counts the argmax pick's
  template the same way. Each option's template: the right answer's is ``correct_answer_template``; the
  wrong options' come from their position, as NegBench's ``mcq.py`` ``wrong_answer_to_type`` maps them,
  when the manifest states that map as ``option_templates`` (COCO / VOC2007 / MSR-VTT:
  ``[null, hybrid, positive, negative]``, ``create_mcq.py``'s order; HardNeg-Syn: ``[positive, hybrid, hybrid,
  negative]``, ``is_synthetic``); otherwise (the world, whose options are shuffled, or a set without such a
  map) from their wording: no negation word is an affirmation; a negation with a contrast ("but", "yet",
  "and no", "and without", ", X does not") a hybrid; any other negation a negation.
- ``skipped_rows``: rows left out, with a ``skipped`` entry counting them by reason; NegBench's evaluation fails
  on each of them, so no official number exists for such a file. An option pandas reads as missing: an
  empty cell, or one that is exactly one of pandas' default NA strings (``PANDAS_NA``: "NA", "None", "null",
  "n/a", "nan", ...; quoted or not, not after stripping). ``CsvMCQDataset`` (built without a tokenizer for
  evaluation) returns that NaN as is, ``default_collate`` makes a tensor of it or fails on the strings beside
  it, and the tokenizer's ``ftfy.fix_text`` fails on a float: the text "nan" (``str(caption)``) is only what
  NegBench's *training* path (``get_csv_mcq_dataset``, with a tokenizer) would read. An option of spaces is
  a string to pandas, scored here, as there, as the text the tokenizer cleans it to. A ``correct_answer``
  that is text pandas cannot read as a number (the column becomes strings and ``.to(device)`` fails), an image
  file or video frames not found (``Image.open`` fails). NegBench also fails where ``correct_answer_template``
  is missing or not positive / negative / hybrid (a ``KeyError`` in its tallies); here such a question is
  scored, without a template.
"""
from __future__ import annotations

import re
from collections import Counter

import torch

from negft.data import schema
from negft.probes import register
from negft.probes.base import EvalContext, Dataset, ProbeResult, read_csv
from negft.probes.released import probe_file, section
from negft.probes.stats import choice_credit, choice_shares
from negft.probes.video import locate, scorable
from negft.probes.similarity import option_scores

FILE = "mcq.csv"
# pandas.read_csv's default na_values (pandas >= 2.0, ``pandas._libs.parsers.STR_NA_VALUES``; 1.x lacked
# "None"): a cell that is exactly one of these, quoted or not, is read as NaN. NegBench reads its CSVs with
# pandas. pandas itself is not a dependency of the read path: this set is all of it that matters here.
PANDAS_NA = frozenset({"", "#N/A", "#N/A N/A", "#NA", "-1.#IND", "-1.#QNAN", "-NaN", "-nan", "1.#IND", "1.#QNAN",
                       "<NA>", "N/A", "NA", "NULL", "NaN", "None", "n/a", "nan", "null"})
REQUIRED = ("correct_answer", "caption_0", "caption_1", "image_path")
NEGATION = re.compile(r"\b(no|not|without|absent|none|nothing|never|lacking|lacks|missing|nowhere|neither|nor|"
                      r"free of)\b|n't", re.IGNORECASE)
CONTRAST = re.compile(r"\b(but|yet|while|whereas|although|though|except)\b|\band (no|not|without|never)\b"
                      r"|,[^,]*\b(does|do|did|is|are|was|were)(n't| not)[.!]?$", re.IGNORECASE)


def option_template(text: str) -> str:
    """positive | negative | hybrid (NegBench's names) of one option, from its wording."""
    if not NEGATION.search(text):
        return "positive"
    return "hybrid" if CONTRAST.search(text.strip()) else "negative"


def option_columns(fields) -> list[str]:
    """``caption_0``, ``caption_1``, ... as far as the header has them."""
    fields, out = set(fields or ()), []
    while f"caption_{len(out)}" in fields:
        out.append(f"caption_{len(out)}")
    return out


def options(rows) -> list[list[str]]:
    """The options of raw CSV rows (``analysis`` reads the world's ``mcq.csv`` with it)."""
    return [[r[c] for c in option_columns(r.keys())] for r in rows]


def missing(cell) -> bool:
    """A cell pandas reads as NaN (or a short row's absent one)."""
    return cell is None or cell in PANDAS_NA


def _answer(cell, n: int) -> tuple[int | None, str | None]:
    """(the option index or None when no option is right, the skip reason or None) of a ``correct_answer``
    cell, as pandas reads it: NA → NaN, else a number (surrounding spaces allowed) or text."""
    if missing(cell):
        return None, None
    try:
        x = float(cell) if "_" not in cell else float("nan")
    except ValueError:
        x = float("nan")
    if x != x:
        return None, "correct_answer not a number"
    return (int(x) if x.is_integer() and 0 <= x < n else None), None


def load(dataset: Dataset) -> dict:
    """The scorable questions of the dataset's MCQ file: {path, why (the file cannot be read), questions (in file
    order), rows (those with a right option), skipped (reason -> count), total}; each question {image_path,
    options, answer (None: no option is right), template, visual}."""
    path, why = probe_file(dataset, "mcq_neg", FILE)
    out = {"path": path, "why": why, "questions": [], "rows": [], "skipped": Counter(), "total": 0}
    if path is None:
        return out
    table = read_csv(path)
    header = list(table[0]) if table else []
    lacks = [c for c in REQUIRED if c not in header]
    if table and lacks:
        out["why"] = f"{path}: lacks column(s) {', '.join(lacks)}; it has {', '.join(header)}"
        return out
    columns = option_columns(header)
    items = locate(dataset, [r.get("image_path") for r in table])
    for r, item in zip(table, items):
        options = [r.get(c) for c in columns]
        answer, reason = _answer(r.get("correct_answer"), len(columns))
        if any(o is None or o == "" for o in options):
            reason = "empty option"
        elif any(missing(o) for o in options):
            reason = "option pandas reads as NaN (NA, None, null, ...)"
        elif reason is None and isinstance(item, str):
            reason = item
        if reason is None:
            template = r.get("correct_answer_template")
            out["questions"].append({"image_path": r["image_path"], "options": options, "answer": answer,
                                     "template": template if template in schema.TEMPLATE_NAMES else None,
                                     "visual": item})
        else:
            out["skipped"][reason] += 1
    out["rows"] = [q for q in out["questions"] if q["answer"] is not None]
    out["total"] = len(table)
    return out


def option_texts(rows: list[dict]) -> list[str]:
    """Every question's options, question by question: what ``run`` (and ``analysis``) encode."""
    return [o for r in rows for o in r["options"]]


def _texts(dataset: Dataset) -> list[str]:
    return option_texts(load(dataset)["questions"])


def option_templates(dataset: Dataset, rows: list[dict]) -> list[list[str]]:
    """Each option's template: the answer's from ``correct_answer_template``, the others from the manifest's
    positional ``option_templates`` (NegBench's ``wrong_answer_to_type``) where it names one, else the wording."""
    positional = section(dataset, "option_templates") or []
    out = []
    for r in rows:
        kinds = []
        for j, text in enumerate(r["options"]):
            if j == r["answer"] and r["template"]:
                kinds.append(r["template"])
            elif j < len(positional) and positional[j] in schema.TEMPLATE_NAMES:
                kinds.append(positional[j])
            else:
                kinds.append(option_template(text))
        out.append(kinds)
    return out


@register("mcq_neg", texts=_texts, version=2, metrics=("acc", "acc_<x>", "chose_<x>", "chose_<x>_on_<x>"),
          unordered=("chose_<x>", "chose_<x>_on_<x>"))    # shares of the picks
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    prefix = f"mcq_neg/{dataset.name}"
    data = load(dataset)
    found = scorable(ctx, dataset, {**data, "rows": data["questions"]}, result, prefix, "question")
    if found is None:
        return result
    images, rows = found
    n, width = len(rows), len(rows[0]["options"])     # one header: every row has the same options
    texts = ctx.encode_texts(option_texts(rows)).view(n, width, -1)
    scores = option_scores(images, texts)
    answered = [i for i, r in enumerate(rows) if r["answer"] is not None]
    answers = torch.tensor([-1 if r["answer"] is None else r["answer"] for r in rows])     # -1: none is right
    credit = torch.full((n,), float("nan"))
    credit[answered] = choice_credit(scores[answered], answers[answered])
    picks = scores.argmax(1)                        # torch.argmax: the first maximum, NegBench's pick
    official = (picks == answers).float()
    shares = choice_shares(scores)
    if answered:
        result.add(f"{prefix}/acc", credit[answered], ctx.n_boot)
    result.add(f"{prefix}/acc_official", official, ctx.n_boot)
    if len(answered) < n:
        result.skipped[f"{prefix}/acc"] = (
            f"{n - len(answered)} of {n} questions have no right option (correct_answer empty, out of range or not "
            f"a whole number in {data['path']}): left out of acc and acc_<x>, misses in acc_official as NegBench "
            f"counts them")
    templates = [r["template"] for r in rows]
    for template, label in schema.TEMPLATE_NAMES.items():
        idx = [i for i, t in enumerate(templates) if t == template]
        scored = [i for i in idx if rows[i]["answer"] is not None]
        if scored:
            result.add(f"{prefix}/acc_{label}", credit[scored], ctx.n_boot)
        if idx:
            result.add(f"{prefix}/acc_{label}_official", official[idx], ctx.n_boot)
    kinds = option_templates(dataset, rows)
    for kind, label in schema.TEMPLATE_NAMES.items():
        mask = torch.tensor([[k == kind for k in ks] for ks in kinds], dtype=shares.dtype)
        chose = (shares * mask).sum(1)
        result.add(f"{prefix}/chose_{label}", chose, ctx.n_boot)
        result.add(f"{prefix}/chose_{label}_official", mask.gather(1, picks.view(-1, 1)).squeeze(1), ctx.n_boot)
        for answer_kind, answer_label in schema.TEMPLATE_NAMES.items():
            idx = [i for i, t in enumerate(templates) if t == answer_kind]
            if idx:
                result.add(f"{prefix}/chose_{label}_on_{answer_label}", chose[idx], ctx.n_boot)
    result.records[prefix] = [
        {"image_path": r["image_path"], "answer": r["answer"], "template": r["template"],
         "credit": None if r["answer"] is None else float(c),
         "pick": int(p), "scores": [round(float(x), 5) for x in sc],
         "choice_share": [round(float(x), 4) for x in sh], "option_templates": k}
        for r, c, p, sc, sh, k in zip(rows, credit, picks, scores, shares, kinds)]
    return result
