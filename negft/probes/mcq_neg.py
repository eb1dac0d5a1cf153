"""MCQ-Neg (NegBench, section 3 and figure 5): pick the one true caption out of four.

Reads NegBench's evaluation CSV (``correct_answer, caption_0..3, correct_answer_template,
image_path``). Differences from the reference code, on purpose: scores are cosine similarities,
and ties share credit (1/k) instead of going to index 0, where the reference CSVs always put the
right answer.
"""
from __future__ import annotations

from pathlib import Path

import torch

from negft.data import schema
from negft.probes import register
from negft.probes.base import EvalContext, Dataset, ProbeResult, missing, read_csv
from negft.probes.stats import choice_credit, choice_shares

FILE = "mcq.csv"


def _resolve(root: Path, image_path: str) -> str:
    p = Path(image_path)
    return str(p if p.is_absolute() else root / p)


@register("mcq_neg")
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    path = dataset.root / FILE
    prefix = f"mcq_neg/{dataset.name}"
    if not path.exists():
        result.skipped[prefix] = missing(dataset, path)
        return result
    rows = read_csv(path)
    options = [[r[f"caption_{j}"] for j in range(schema.N_OPTIONS)] for r in rows]
    answers = torch.tensor([int(r["correct_answer"]) for r in rows])
    images = ctx.encode_images([_resolve(dataset.root, r["image_path"]) for r in rows])
    texts = ctx.encode_texts([o for opts in options for o in opts]).view(len(rows), schema.N_OPTIONS, -1)
    scores = torch.einsum("nd,ncd->nc", images, texts)
    credit = choice_credit(scores, answers)
    result.add(f"{prefix}/acc", credit, ctx.n_boot)
    templates = [r["correct_answer_template"] for r in rows]
    for template, label in schema.TEMPLATE_NAMES.items():
        idx = [i for i, t in enumerate(templates) if t == template]
        if idx:
            result.add(f"{prefix}/acc_{label}", credit[idx], ctx.n_boot)
    shares = choice_shares(scores)
    result.records[prefix] = [
        {"image_path": r["image_path"], "answer": int(a), "template": t, "credit": float(c),
         "scores": [round(float(s), 5) for s in row], "choice_share": [round(float(s), 4) for s in sh]}
        for r, a, t, c, row, sh in zip(rows, answers, templates, credit, scores, shares)]
    return result
