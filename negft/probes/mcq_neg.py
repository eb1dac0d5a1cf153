"""MCQ-Neg (NegBench, section 3 and figure 5): pick the one true caption out of four.

Reads NegBench's evaluation CSV (``correct_answer, caption_0..3, correct_answer_template,
image_path``). Accuracy overall and by the right answer's template; and, as in figure 5, which template
the picks land on: ``chose_<template>`` over all questions and ``chose_<template>_on_<answer template>``.
The CSV does not record the options' templates: the world's are recognised exactly from its phrasings, other
captions by their wording (no negation: affirmation; negation plus a contrast such as "but not": hybrid;
else negation). Differences from the reference code, on purpose: scores are cosine similarities,
and ties share credit (1/k) instead of going to index 0, where the reference CSVs always put the
right answer.
"""
from __future__ import annotations


import re

import torch

from negft.data import schema
from negft.data import world_text as T
from negft.probes import register
from negft.probes.base import EvalContext, Dataset, ProbeResult, csv_texts, missing, read_csv, resolve
from negft.probes.stats import choice_credit, choice_shares

FILE = "mcq.csv"


def _pattern(template: str) -> re.Pattern:
    parts = re.split(r"(\{\w+\})", template)
    return re.compile("^" + "".join("(.+?)" if p.startswith("{") else re.escape(p) for p in parts) + "$",
                      re.IGNORECASE)


# most literal text first, so "features {p} but not {q}" is tried before "features {p}"
WORLD_TEMPLATES = [(_pattern(t), kind) for t, kind in sorted(
    ((t, kind) for table in (T.MCQ_TRAIN, T.MCQ_HELD_OUT) for kind, ts in table.items() for t in ts),
    key=lambda tk: -len(re.sub(r"\{\w+\}", "", tk[0])))]
CONTRAST = re.compile(r"\b(but|yet|while|whereas|although)\b|\band (no|not)\b", re.IGNORECASE)


def option_template(text: str) -> str:
    """positive | negative | hybrid (NegBench's names) of one MCQ option."""
    for pattern, kind in WORLD_TEMPLATES:
        if pattern.match(text):
            return kind
    if not T.has_negation(text):
        return "positive"
    return "hybrid" if CONTRAST.search(text) else "negative"


def options(rows) -> list[list[str]]:
    return [[r[f"caption_{j}"] for j in range(schema.N_OPTIONS)] for r in rows]


@register("mcq_neg", texts=csv_texts(FILE, lambda rows: [o for row in options(rows) for o in row]))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    path = dataset.root / FILE
    prefix = f"mcq_neg/{dataset.name}"
    if not path.exists():
        result.skipped[prefix] = missing(dataset, path)
        return result
    rows = read_csv(path)
    opts = options(rows)
    answers = torch.tensor([int(r["correct_answer"]) for r in rows])
    images = ctx.encode_images([resolve(dataset.root, r["image_path"]) for r in rows])
    texts = ctx.encode_texts([o for row in opts for o in row]).view(len(rows), schema.N_OPTIONS, -1)
    scores = torch.einsum("nd,ncd->nc", images, texts)
    credit = choice_credit(scores, answers)
    result.add(f"{prefix}/acc", credit, ctx.n_boot)
    templates = [r["correct_answer_template"] for r in rows]
    for template, label in schema.TEMPLATE_NAMES.items():
        idx = [i for i, t in enumerate(templates) if t == template]
        if idx:
            result.add(f"{prefix}/acc_{label}", credit[idx], ctx.n_boot)
    shares = choice_shares(scores)
    kinds = [[option_template(o) for o in row] for row in opts]
    for kind, label in schema.TEMPLATE_NAMES.items():
        mask = torch.tensor([[k == kind for k in row] for row in kinds], dtype=shares.dtype)
        chose = (shares * mask).sum(1)
        result.add(f"{prefix}/chose_{label}", chose, ctx.n_boot)
        for answer_kind, answer_label in schema.TEMPLATE_NAMES.items():
            idx = [i for i, t in enumerate(templates) if t == answer_kind]
            if idx:
                result.add(f"{prefix}/chose_{label}_on_{answer_label}", chose[idx], ctx.n_boot)
    result.records[prefix] = [
        {"image_path": r["image_path"], "answer": int(a), "template": t, "credit": float(c),
         "scores": [round(float(s), 5) for s in row], "choice_share": [round(float(s), 4) for s in sh],
         "option_templates": k}
        for r, a, t, c, row, sh, k in zip(rows, answers, templates, credit, scores, shares, kinds)]
    return result
