"""Zero-shot classification, the drift measure (CLIP-style prompt ensembles).

World: ``zeroshot.csv`` (``filepath, label``) with class names in ``classes.json`` beside it or in
the world's ``world.json``. Ties share credit, so a constant model scores 1/classes.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from negft.data.world_text import with_article
from negft.probes import register
from negft.probes.base import EvalContext, Dataset, ProbeResult, missing, read_csv, resolve
from negft.probes.stats import choice_credit

TEMPLATES = ("a photo of {}.", "a picture of {}.", "a drawing of {}.", "an image showing {}.",
             "{} in the scene.")


def class_names(root: Path) -> list[str] | None:
    for candidate in (root / "classes.json", root.parent / "world.json"):
        if candidate.exists():
            data = json.loads(candidate.read_text())
            return data["classes"] if isinstance(data, dict) else data
    return None


def class_prompts(classes: list[str]) -> list[str]:
    return [t.format(with_article(c)) for c in classes for t in TEMPLATES]


def prompt_texts(filename: str):
    """``texts`` of a probe that scores the files' images against the class prompts."""
    def texts(dataset: Dataset) -> list[str]:
        classes = class_names(dataset.root)
        return class_prompts(classes) if classes is not None and (dataset.root / filename).exists() else []
    return texts


def class_features(ctx: EvalContext, classes: list[str]) -> torch.Tensor:
    """(classes, D) text features: each class's prompt ensemble, averaged and renormalised."""
    prompts = class_prompts(classes)
    return F.normalize(ctx.encode_texts(prompts).view(len(classes), len(TEMPLATES), -1).mean(1), dim=-1)


@register("zeroshot", texts=prompt_texts("zeroshot.csv"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    path = dataset.root / "zeroshot.csv"
    prefix = f"zeroshot/{dataset.name}"
    classes = class_names(dataset.root)
    if not path.exists() or classes is None:
        result.skipped[prefix] = missing(dataset, path)
        return result
    rows = read_csv(path)
    text = class_features(ctx, classes)
    images = ctx.encode_images([resolve(dataset.root, r["filepath"]) for r in rows])
    labels = torch.tensor([int(r["label"]) for r in rows])
    credit = choice_credit(images @ text.T, labels)
    result.add(f"{prefix}/top1", credit, ctx.n_boot)
    result.records[prefix] = [{"filepath": r["filepath"], "label": int(r["label"]), "credit": float(c)}
                              for r, c in zip(rows, credit)]
    return result
