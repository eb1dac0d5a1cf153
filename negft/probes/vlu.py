"""Stroop probing of the text tower ("Is BERT blind?", sections 3.2, 4.1-4.3, supplement B.2).

Stroop probing: embed a prompt with an empty slot, t_m, and the prompt with each completion c, t_c; the
completion whose insertion disturbs the embedding least (largest cos(M(t_m), M(t_c))) is the prediction,
and for concreteness that cosine is the score. Every task runs over several prompts; like the paper we
report the maximum over prompts (``acc``, ``rho``) and, unlike its main table, also the mean (``acc_mean``,
``rho_mean``). Intervals are bootstrapped over items for the best prompt.

- ``vlu_shape``: shape association. World: which shape a context suggests, from the world's own object
  priors (``world.json`` context_priors; the most likely shapes are right). Real: a ShapeIt-style CSV
  ``word,gt,options`` (options separated by ``|``).
- ``vlu_color``: colour association from a CTD / NCD-style CSV ``word,color`` (options: the file's colours).
  The world has no colour priors, so it is skipped there.
- ``vlu_concreteness``: |Spearman ρ| between the Stroop score and human ratings (a Brysbaert-style table
  with columns ``Word``, ``Conc.M`` and, if present, ``Dom_Pos``: nouns only, as in the paper).

The paper fills CLIP's empty slot with an unspecified fixed token; we use ``*``.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from negft.data.world_text import BACKGROUND_PHRASES
from negft.probes import register
from negft.probes.base import EvalContext, Dataset, ProbeResult, missing, read_csv

SLOT = "*"
SHAPE_PROMPTS = ("A photo of a {c} shaped {w}", "A photo of a {c} {w}", "A photo of the {c} {w}", "A {c} {w}",
                 "{c} {w}", "An image of a {c} {w}", "A {w} usually has a {c} shape",
                 "{w}s commonly have a {c} shape", "The basic shape of a {w} is {c}",
                 "What is the shape of a {w}? {c}")
COLOR_PROMPTS = ("A picture of a {c} {w}", "A photo of a {c} {w}", "A photo of the {c} {w}", "A {c} {w}",
                 "{c} {w}", "The normal color of a {w} is {c}", "{w} usually has a {c} color",
                 "{w}s have a {c} color", "What is the color of a {w}? {c}", "The natural color of a {w} is {c}")
CONCRETENESS_PROMPTS = ("Alice giving the {c} to Bob", "Bob giving the {c} to Alice", "I see the {c}",
                        "A photo of my {c}", "A close-up photo of a {c}", "A painting of the {c}",
                        "A photo of the {c}", "A photo of a nice {c}", "A drawing of the {c}")
# the world: which shape does a setting suggest ({w} = a setting phrase such as "in the night sky")
WORLD_SHAPE_PROMPTS = ("a {c} {w}", "a photo of a {c} {w}", "there is a {c} {w}", "a drawing of a {c} {w}",
                       "a picture of a {c} {w}")


def stroop_texts(prompt: str, items: list[str], options: list[list[str]]) -> tuple[list[str], list[str]]:
    """(the prompt with the slot per item, the prompt with each option per item, flat)."""
    return ([prompt.format(w=w, c=SLOT) for w in items],
            [prompt.format(w=w, c=c) for w, opts in zip(items, options) for c in opts])


def stroop_scores(ctx: EvalContext, prompt: str, items: list[str], options: list[list[str]]) -> list[torch.Tensor]:
    """Per item, cos(M(prompt with the slot), M(prompt with each option))."""
    masked, flat = stroop_texts(prompt, items, options)
    masked, filled = ctx.encode_texts(masked), ctx.encode_texts(flat)
    out, start = [], 0
    for i, opts in enumerate(options):
        out.append(filled[start:start + len(opts)] @ masked[i])
        start += len(opts)
    return out


def _credit(scores: torch.Tensor, right: set[int]) -> float:
    """Share of the argmax that falls on a right option (ties split, as elsewhere)."""
    at_max = (scores >= scores.max()).nonzero().flatten().tolist()
    return sum(i in right for i in at_max) / len(at_max)


def association(ctx, result: ProbeResult, prefix: str, prompts, items, options, rights) -> None:
    """Accuracy per prompt; the best prompt's (with its interval) and the mean over prompts."""
    per_prompt = []
    for prompt in prompts:
        scores = stroop_scores(ctx, prompt, items, options)
        per_prompt.append(np.array([_credit(s, r) for s, r in zip(scores, rights)]))
    accs = [c.mean() for c in per_prompt]
    best = int(np.argmax(accs))
    result.add(f"{prefix}/acc", per_prompt[best], ctx.n_boot)
    result.add(f"{prefix}/acc_mean", np.mean(per_prompt, axis=0), ctx.n_boot)
    result.records[prefix] = [{"prompt": p, "acc": float(a)} for p, a in zip(prompts, accs)]


def _spearman_abs(x, y) -> float:
    from scipy.stats import spearmanr
    rho = spearmanr(x, y).statistic
    return float(abs(rho)) if np.isfinite(rho) else 0.0


def concreteness(ctx, result: ProbeResult, prefix: str, words: list[str], ratings: np.ndarray) -> None:
    scores = []
    for prompt in CONCRETENESS_PROMPTS:
        masked = ctx.encode_texts([prompt.format(c=SLOT)])[0]
        scores.append((ctx.encode_texts([prompt.format(c=w) for w in words]) @ masked).numpy())
    rhos = [_spearman_abs(s, ratings) for s in scores]
    best = int(np.argmax(rhos))
    rng = np.random.default_rng(0)
    boot = [_spearman_abs(scores[best][i], ratings[i]) for i in rng.integers(0, len(words), (ctx.n_boot, len(words)))]
    result.metrics[f"{prefix}/rho"], result.ci95[f"{prefix}/rho"] = rhos[best], list(np.percentile(boot, [2.5, 97.5]))
    result.metrics[f"{prefix}/rho_mean"] = float(np.mean(rhos))
    result.ci95[f"{prefix}/rho_mean"] = [float(min(rhos)), float(max(rhos))]     # the spread over prompts
    result.records[prefix] = [{"prompt": p, "rho": r} for p, r in zip(CONCRETENESS_PROMPTS, rhos)]


def _world_items(dataset: Dataset) -> tuple[list[str], list[list[str]], list[set[int]]]:
    """(setting phrases, the shapes as every phrase's options, the most likely shapes' indices per phrase)."""
    meta = json.loads((dataset.root.parent / "world.json").read_text())
    shapes = meta["shapes"]
    items, rights = [], []
    for bg, weights in meta["context_priors"].items():
        top = max(weights.values())
        right = {shapes.index(s) for s, w in weights.items() if w == top}
        for phrase in BACKGROUND_PHRASES[bg]:
            items.append(phrase)
            rights.append(right)
    return items, [shapes] * len(items), rights


def _world(ctx, dataset: Dataset, result: ProbeResult) -> None:
    association(ctx, result, f"vlu_shape/{dataset.name}", WORLD_SHAPE_PROMPTS, *_world_items(dataset))
    result.skipped[f"vlu_color/{dataset.name}"] = "the world has no colour priors to probe"
    result.skipped[f"vlu_concreteness/{dataset.name}"] = "the world has no concreteness ratings"


def _real(ctx, dataset: Dataset, result: ProbeResult) -> None:
    files = {"shape": dataset.root / "shapeit.csv", "color": dataset.root / "color_associations.csv",
             "concreteness": dataset.root / "concreteness.csv"}
    for task, path in files.items():
        prefix = f"vlu_{task}/{dataset.name}"
        if not path.exists():
            result.skipped[prefix] = missing(dataset, path)
            continue
        rows = read_csv(path)
        if task == "shape":
            options = [r["options"].split("|") for r in rows]
            association(ctx, result, prefix, SHAPE_PROMPTS, [r["word"] for r in rows], options,
                        [{o.index(r["gt"])} for o, r in zip(options, rows)])
        elif task == "color":
            colors = sorted({r["color"] for r in rows})
            association(ctx, result, prefix, COLOR_PROMPTS, [r["word"] for r in rows], [colors] * len(rows),
                        [{colors.index(r["color"])} for r in rows])
        else:
            rows = [r for r in rows if r.get("Dom_Pos", "Noun") == "Noun" and " " not in r["Word"].strip()]
            concreteness(ctx, result, prefix, [r["Word"].strip() for r in rows],
                         np.array([float(r["Conc.M"]) for r in rows]))


def _is_world(dataset: Dataset) -> bool:
    return (dataset.root.parent / "world.json").exists() and dataset.name == "world"


def _texts(dataset: Dataset) -> list[str]:
    """The world's texts (real lists are encoded as each prompt asks: a few long calls already)."""
    if not _is_world(dataset):
        return []
    items, options, _ = _world_items(dataset)
    return [t for prompt in WORLD_SHAPE_PROMPTS for part in stroop_texts(prompt, items, options) for t in part]


@register("vlu", texts=_texts)
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    if _is_world(dataset):
        _world(ctx, dataset, result)
    else:
        _real(ctx, dataset, result)
    return result
