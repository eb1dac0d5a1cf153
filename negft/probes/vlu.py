"""Stroop probing of the text tower ("Is BERT blind?", sections 3.2, 4.1-4.3, supplement
B.2), read from the files of the paper's repository (TAU-VAILab/isbertblind; paths in negft.data.layout_vlu).

Stroop probing: embed a prompt with an empty slot, t_m, and the prompt with each completion c, t_c; the
completion whose insertion disturbs the embedding least (largest cos(M(t_m), M(t_c))) is the prediction, and
for concreteness that cosine is the score. Every task runs over several prompts; like the paper we report the
maximum over prompts and also the mean. Intervals are bootstrapped over items (for the best prompt, and for each
item's mean over prompts).

Tasks (``<task>/<dataset>/<metric>``):

- ``vlu_shape``: ShapeIt as released, ``datasets/shape_association.csv`` (``word, gt, options``; options a Python
  list literal, read without ``eval``), prompts from ``configs/shapes.json`` (the repository's ``MASK`` / ``WORD``
  prompts; without the file, the repository's ten). ``vlu_shape_adj``: the same for
  ``datasets/shape_association_adj.csv`` / ``configs/shapes_adj.json`` (circular, rectangular, triangular; the
  paper reports the better of the two).
- ``vlu_color``: colour associations (CTD / NCD lists) in the same choice layout, ``datasets/color_association.csv``
  with ``configs/colors.json`` or the paper's ten colour prompts (supplement B.2).
- ``vlu_concreteness``: |Spearman ρ| between the Stroop score and the human ratings of
  ``Concreteness_ratings_Brysbaert_et_al_BRM.txt`` (Brysbaert et al. 2014 as published: tab-separated, ``Word``,
  ``Conc.M``, ``Dom_Pos``, ``Bigram``), unigram nouns only, as in the paper (``rho``, ``rho_mean``; the
  repository has no concreteness code, so no official rule).

Choice-task metrics, per prompt then over prompts: ``acc`` / ``acc_mean`` (negft): the slot is filled with the
fixed token ``*`` and an item's credit is the share of the argmax that falls on ``gt``, so ties share it and
all-equal scores give 1/options. ``acc_official`` / ``acc_mean_official``: the repository's ``run_on_dataset.py``
("choice" task: ``utils/setup_utils.py`` fills the slot with the empty string, ``utils/evaluation_utils.py``
predicts ``np.argmax(scores)``, the first maximum, so all-equal scores credit the first option;
``extract_stats_for_experiment`` reports the max and the mean of the per-prompt accuracies). They differ in
the slot token and on ties. Rows without a word, with an unreadable option list or a ``gt`` not among its
options are skipped and counted (``<task>/<dataset>/skipped_rows``, only when rows were skipped); a missing
file is skipped with its path.
"""
from __future__ import annotations

import csv
import json
from collections import Counter

import numpy as np
import torch

from negft.data import layout_vlu
from negft.data.schema import list_cell
from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult, parse_once
from negft.probes.released import parsed_rows, report_skips
from negft.probes.similarity import score_matrix

SLOT = "*"                 # negft's filler for the empty slot
OFFICIAL_SLOT = ""         # the repository's (run_on_dataset.py: pad_option='')
# the repository's configs/shapes.json (and shapes_adj.json) prompts
SHAPE_PROMPTS = ("a photo of a MASK shaped WORD", "a photo of a MASK WORD", "a photo of the MASK WORD", "a MASK WORD",
                 "MASK WORD", "an image of a MASK WORD", "a WORD usually has a MASK shape",
                 "WORDs commonly have a MASK shape", "the basic shape of a WORD is MASK",
                 "what is the shape of a WORD? MASK")
# the paper's colour and concreteness prompts (supplement B.2)
COLOR_PROMPTS = ("A picture of a MASK WORD", "A photo of a MASK WORD", "A photo of the MASK WORD", "A MASK WORD",
                 "MASK WORD", "The normal color of a WORD is MASK", "WORD usually has a MASK color",
                 "WORDs have a MASK color", "What is the color of a WORD? MASK", "The natural color of a WORD is MASK")
CONCRETENESS_PROMPTS = ("Alice giving the MASK to Bob", "Bob giving the MASK to Alice", "I see the MASK",
                        "A photo of my MASK", "A close-up photo of a MASK", "A painting of the MASK",
                        "A photo of the MASK", "A photo of a nice MASK", "A drawing of the MASK")
CHOICE_TASKS = {"vlu_shape": (layout_vlu.SHAPE_CSV, layout_vlu.SHAPE_CONFIG, SHAPE_PROMPTS),
                "vlu_shape_adj": (layout_vlu.SHAPE_ADJ_CSV, layout_vlu.SHAPE_ADJ_CONFIG, SHAPE_PROMPTS),
                "vlu_color": (layout_vlu.COLOR_CSV, layout_vlu.COLOR_CONFIG, COLOR_PROMPTS)}
MIN_WORDS = 3              # the concreteness task ranks words: fewer than three make no ranking worth a score


def fill(prompt: str, word: str, slot: str) -> str:
    """The repository's substitution: ``prompt.replace("WORD", word).replace("MASK", slot)``."""
    return prompt.replace(layout_vlu.WORD, word).replace(layout_vlu.MASK, slot)


# ------------------------------------------------------------------ reading


def _choice_rows(path) -> list:
    """[(word, gt, options)] or (None, reason) per row, or [("file", reason)]."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        return [("file", f"unreadable CSV ({type(e).__name__}: {e})", None)]
    if rows and not set(layout_vlu.CHOICE_COLUMNS) <= set(rows[0]):
        return [("file", f"expected columns {', '.join(layout_vlu.CHOICE_COLUMNS)}", None)]
    out = []
    for r in rows:
        try:
            options = list_cell(r["options"] or "")
        except ValueError:
            out.append((None, "options not a list of strings", None))
            continue
        word, gt = (r["word"] or "").strip(), r["gt"]
        if not word:
            out.append((None, "empty word", None))
        elif gt not in options:
            out.append((None, "gt not among the options", None))
        else:
            out.append((word, gt, options))
    return out


def _prompts(path) -> list:
    try:
        prompts = json.loads(open(path, encoding="utf-8").read()).get("prompts")
    except (OSError, ValueError, AttributeError) as e:
        return [("file", f"unreadable config ({type(e).__name__}: {e})")]
    if not isinstance(prompts, list) or not prompts or \
            not all(isinstance(p, str) and layout_vlu.MASK in p for p in prompts):
        return [("file", f"'prompts' is not a list of strings with {layout_vlu.MASK}")]
    return prompts


def read_choice(dataset: Dataset, task: str) -> tuple[list, list[str], Counter, str | None]:
    """(items (word, gt, options), prompts, skipped rows by reason, why the task is skipped or None)."""
    csv_name, config_name, default = CHOICE_TASKS[task]
    path, config = dataset.root / csv_name, dataset.root / config_name
    prompts = list(default)
    if path.exists() and config.exists():
        prompts = list(parse_once(config, _prompts))
        if prompts and isinstance(prompts[0], tuple):
            return [], [], Counter(), f"{config}: {prompts[0][1]}"
    items, skipped, why = parsed_rows(dataset, path, _choice_rows)
    return items, prompts, skipped, why


def _concreteness_rows(path) -> list:
    """[(word, rating)] of the unigram nouns, (None, reason) per row left out, or [("file", reason)]."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        return [("file", f"unreadable ratings ({type(e).__name__}: {e})")]
    if rows and not {"Word", "Conc.M"} <= set(rows[0]):
        return [("file", "expected tab-separated columns Word, Conc.M (Brysbaert et al. 2014)")]
    out = []
    for r in rows:
        word = (r["Word"] or "").strip()
        if r.get("Dom_Pos", "Noun") != "Noun":
            out.append((None, "not a noun (Dom_Pos)"))
        elif str(r.get("Bigram", "0")).strip() not in ("0", "") or not word or " " in word:
            out.append((None, "not a unigram"))
        else:
            try:
                out.append((word, float(r["Conc.M"])))
            except (TypeError, ValueError):
                out.append((None, "Conc.M not a number"))
    return out


def read_concreteness(dataset: Dataset) -> tuple[list, Counter, str | None]:
    """((word, rating) of the unigram nouns, rows left out by reason, why the file is skipped or None)."""
    return parsed_rows(dataset, dataset.root / layout_vlu.CONCRETENESS, _concreteness_rows)


# ------------------------------------------------------------------ texts


def stroop_texts(prompt: str, items: list, slot: str) -> tuple[list[str], list[str]]:
    """(the prompt with the slot per item, the prompt with each option per item, flat)."""
    return ([fill(prompt, w, slot) for w, _, _ in items],
            [fill(prompt, w, c) for w, _, opts in items for c in opts])


def _texts(dataset: Dataset) -> list[str]:
    out = []
    for task in CHOICE_TASKS:
        items, prompts, _, why = read_choice(dataset, task)
        if why is None:
            for prompt in prompts:
                for slot in (SLOT, OFFICIAL_SLOT):
                    masked, filled = stroop_texts(prompt, items, slot)
                    out += masked + filled
    words, _, why = read_concreteness(dataset)
    if why is None and len(words) >= MIN_WORDS:
        pairs = [concreteness_texts(p, [w for w, _ in words]) for p in CONCRETENESS_PROMPTS]
        out += [masked for masked, _ in pairs] + [t for _, filled in pairs for t in filled]
    return out


def concreteness_texts(prompt: str, words: list[str]) -> tuple[str, list[str]]:
    """(the prompt with the slot, the prompt with each word): what ``concreteness`` encodes per prompt."""
    return fill(prompt, "", SLOT), [fill(prompt, "", w) for w in words]


# ------------------------------------------------------------------ scoring


def stroop_scores(ctx: EvalContext, prompt: str, items: list, slot: str) -> list[torch.Tensor]:
    """Per item, cos(M(prompt with the slot), M(prompt with each option))."""
    masked, flat = stroop_texts(prompt, items, slot)
    masked, filled = ctx.encode_texts(masked), ctx.encode_texts(flat)
    out, start = [], 0
    for i, (_, _, opts) in enumerate(items):
        out.append(score_matrix(masked[i:i + 1], filled[start:start + len(opts)])[0])
        start += len(opts)
    return out


def _credit(scores: torch.Tensor, right: int) -> float:
    """Share of the argmax that falls on the right option (ties split)."""
    at_max = (scores >= scores.max()).nonzero().flatten().tolist()
    return (right in at_max) / len(at_max)


def association(ctx, result: ProbeResult, prefix: str, prompts: list[str], items: list) -> None:
    """Accuracy per prompt (negft's and the repository's); the best prompt's and the mean over prompts."""
    rights = [opts.index(gt) for _, gt, opts in items]
    ours, official = [], []
    for prompt in prompts:
        scores = stroop_scores(ctx, prompt, items, SLOT)
        ours.append(np.array([_credit(s, r) for s, r in zip(scores, rights)]))
        scores = stroop_scores(ctx, prompt, items, OFFICIAL_SLOT)
        official.append(np.array([float(int(np.argmax(s.numpy())) == r) for s, r in zip(scores, rights)]))
    for per_prompt, suffix in ((ours, ""), (official, "_official")):
        accs = [c.mean() for c in per_prompt]
        result.add(f"{prefix}/acc{suffix}", per_prompt[int(np.argmax(accs))], ctx.n_boot)
        result.add(f"{prefix}/acc_mean{suffix}", np.mean(per_prompt, axis=0), ctx.n_boot)
    result.records[prefix] = [{"prompt": p, "acc": float(a.mean()), "acc_official": float(o.mean())}
                              for p, a, o in zip(prompts, ours, official)]


def _spearman_abs(x, y) -> float:
    import warnings
    from scipy.stats import spearmanr
    with warnings.catch_warnings():        # constant scores (a model that cannot tell words apart): rho 0
        warnings.simplefilter("ignore")
        rho = spearmanr(x, y).statistic
    return float(abs(rho)) if np.isfinite(rho) else 0.0


def concreteness(ctx, result: ProbeResult, prefix: str, words: list[str], ratings: np.ndarray) -> None:
    scores = []
    for prompt in CONCRETENESS_PROMPTS:
        masked, filled = concreteness_texts(prompt, words)
        masked = ctx.encode_texts([masked])[0]
        scores.append(score_matrix(masked.view(1, -1), ctx.encode_texts(filled))[0].numpy())
    rhos = [_spearman_abs(s, ratings) for s in scores]
    best = int(np.argmax(rhos))
    rng = np.random.default_rng(0)
    boot = [_spearman_abs(scores[best][i], ratings[i]) for i in rng.integers(0, len(words), (ctx.n_boot, len(words)))]
    result.metrics[f"{prefix}/rho"], result.ci95[f"{prefix}/rho"] = rhos[best], list(np.percentile(boot, [2.5, 97.5]))
    result.metrics[f"{prefix}/rho_mean"] = float(np.mean(rhos))
    result.ci95[f"{prefix}/rho_mean"] = [float(min(rhos)), float(max(rhos))]     # the spread over prompts
    result.records[prefix] = [{"prompt": p, "rho": r} for p, r in zip(CONCRETENESS_PROMPTS, rhos)]


@register("vlu", texts=_texts, version=2, metrics={
    "vlu_shape": ("acc", "acc_mean"), "vlu_shape_adj": ("acc", "acc_mean"), "vlu_color": ("acc", "acc_mean"),
    "vlu_concreteness": ("rho", "rho_mean")})
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    for task, (csv_name, _, _) in CHOICE_TASKS.items():
        prefix = f"{task}/{dataset.name}"
        items, prompts, skipped, why = read_choice(dataset, task)
        if why is not None:
            result.skipped[prefix] = why
            continue
        report_skips(result, prefix, dataset.root / csv_name, skipped, sum(skipped.values()) + len(items))
        if not items:
            result.skipped[prefix] = f"no item in {dataset.root / csv_name}"
            continue
        association(ctx, result, prefix, prompts, items)
    prefix = f"vlu_concreteness/{dataset.name}"
    words, skipped, why = read_concreteness(dataset)
    if why is not None:
        result.skipped[prefix] = why
        return result
    # non-nouns and bigrams are left out by design (the paper's unigram nouns), not as bad rows
    bad = Counter({k: v for k, v in skipped.items() if k == "Conc.M not a number"})
    report_skips(result, prefix, dataset.root / layout_vlu.CONCRETENESS, bad, sum(bad.values()) + len(words))
    if len(words) < MIN_WORDS:
        result.skipped[prefix] = f"fewer than {MIN_WORDS} unigram nouns in {dataset.root / layout_vlu.CONCRETENESS}"
        return result
    concreteness(ctx, result, prefix, [w for w, _ in words], np.array([c for _, c in words]))
    return result
