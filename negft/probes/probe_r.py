"""Probe-R (004_88b1c9c2a7bbadad, section 3.1 and table 2): relational understanding by swapping one part of
a subject-predicate-object prompt.

Per image, the right prompt "the X is R the Y" (a relation that holds) is scored against a swapped one:

- ``probe_r_predicate``: R replaced by a predicate that does not hold between X and Y;
- ``probe_r_object``: the object Y replaced by a shape absent from the scene.

As in the reference, the two prompts go through a 2-way softmax of the scaled similarities: ``acc`` is the
share where the right prompt wins (ties: half) and ``confidence`` its mean probability. The reference runs
at batch size 1 on Visual Genome; ours batches. On the world it draws the prompts from the annotations
(``annotations.jsonl``), one seeded relation per image; real prompts come converted in ``probe_r.csv``
(``data_manifests/probe_rcb.yaml``).
"""
from __future__ import annotations

import json

import numpy as np
import torch

from negft.data import world_text as T
from negft.probes import register
from negft.probes.base import (EvalContext, Dataset, ProbeResult, missing, parse_once, read_csv, read_jsonl,
                               resolve)

PREDICATES = tuple(T.PREDICATE_WORDS)


def prompt(x: str, pred: str, y: str) -> str:
    return f"the {x} is {T.PREDICATE_WORDS[pred]} the {y}"


def samples(root, shapes: list[str]) -> dict[str, list[tuple[str, str, str]]]:
    """kind -> [(image path, right prompt, swapped prompt)]."""
    out = {"predicate": [], "object": []}
    for n, a in enumerate(read_jsonl(root / "annotations.jsonl")):
        objs, rels = a["scene"]["objects"], a["scene"]["relations"]
        if not rels:
            continue
        rng = np.random.default_rng(n)
        i, pred, j = rels[int(rng.integers(len(rels)))]
        x, y = objs[i]["shape"], objs[j]["shape"]
        holds = {p for a_, p, b_ in rels if (a_, b_) == (i, j)}
        wrong = [p for p in PREDICATES if p not in holds]
        absent = [s for s in shapes if s not in {o["shape"] for o in objs}]
        path = resolve(root, a["image_path"])
        out["predicate"].append((path, prompt(x, pred, y), prompt(x, wrong[int(rng.integers(len(wrong)))], y)))
        out["object"].append((path, prompt(x, pred, y), prompt(x, pred, absent[int(rng.integers(len(absent)))])))
    return out


def read_samples(path) -> dict[str, list[tuple[str, str, str]]]:
    """kind -> [(image path, right prompt, swapped prompt)] from a converted real ``probe_r.csv``."""
    out = {"predicate": [], "object": []}
    for r in read_csv(path):
        if r["kind"] not in out:
            raise ValueError(f"{path}: kind {r['kind']!r} is not one of {', '.join(out)}")
        out[r["kind"]].append((resolve(path.parent, r["image_path"]), r["right"], r["swapped"]))
    return out


def _world_samples(annotations):
    root = annotations.parent
    return samples(root, json.loads((root.parent / "world.json").read_text())["shapes"]).items()


def load_groups(dataset: Dataset) -> dict[str, list[tuple[str, str, str]]] | None:
    """World: prompts drawn from ``annotations.jsonl`` (once per version of it); real data: ``probe_r.csv``
    (manifest probe_rcb); None without either."""
    ann, meta, real = dataset.root / "annotations.jsonl", dataset.root.parent / "world.json", dataset.root / "probe_r.csv"
    if real.exists():
        return read_samples(real)
    if ann.exists() and meta.exists():
        return dict(parse_once(ann, _world_samples))
    return None


def _texts(dataset: Dataset) -> list[str]:
    return [t for items in (load_groups(dataset) or {}).values() for _, r, w in items for t in (r, w)]


@register("probe_r", texts=_texts)
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    groups = load_groups(dataset)
    if groups is None:
        for kind in ("predicate", "object"):
            result.skipped[f"probe_r_{kind}/{dataset.name}"] = missing(dataset, dataset.root / "probe_r.csv")
        return result
    scale = ctx.logit_scale
    for kind, items in groups.items():
        if not items:
            continue
        prefix = f"probe_r_{kind}/{dataset.name}"
        images = ctx.encode_images([p for p, _, _ in items])
        texts = ctx.encode_texts([t for _, r, w in items for t in (r, w)]).view(len(items), 2, -1)
        s = torch.einsum("nd,nkd->nk", images, texts)
        prob = torch.softmax(scale * s, dim=1)[:, 0]
        win = (s[:, 0] > s[:, 1]).float() + 0.5 * (s[:, 0] == s[:, 1]).float()
        result.add(f"{prefix}/acc", win, ctx.n_boot)
        result.add(f"{prefix}/confidence", prob, ctx.n_boot)
        result.records[prefix] = [{"image_path": p, "right": r, "swapped": w, "confidence": float(c)}
                                  for (p, r, w), c in zip(items, prob)]
    return result
