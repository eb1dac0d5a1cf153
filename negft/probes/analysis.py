"""Scalable performance analysis (the paper of that name, sections 3.2-3.5): which features of an example go
with the model scoring it well?

For every pair example we take P (the caption with its positive), N (the same caption with its negative) and
D = P − N, the relative alignment score, then correlate each with each feature: a two-sided Welch t-test for a
binary feature (effect: difference of means, with a bootstrap interval), Pearson's r for a numeric one (with
its Fisher interval). Features with p < 0.05 are marked; the records hold the full table ranked by |effect|,
``figure`` draws the significant effects on D, and the ledger keeps each feature's effect on D.

Pairs on the world:

- ``relcomp``: image pairs (caption_k with image_k positive, the other image negative). Features: the pair's
  kind is a relation (binary), the predicate is horizontal (binary), objects in the scene, words in the
  caption, mean word frequency (Zipf, ``wordfreq``).
- ``mcq``: text pairs from MCQ-Neg (the image with its right option, against its best-scoring wrong one).
  Features: the right answer's template is negation / hybrid (binary), objects in the scene, words in the
  right option, its mean word frequency.

The image features (objects in the scene; the RelComp relation is horizontal) come from the dataset's
``image_features.csv`` (``image_path`` + one numeric column per feature; the world writes one from its
annotations); a dataset without it keeps the text features only.

Differences from the paper: Welch's test instead of Student's (unequal variances are the rule here), and the
features are the world's annotations and the captions' own words, not LIWC / WordNet (which do not install
offline).
"""
from __future__ import annotations

import functools

import numpy as np
import torch

from negft.probes import TEXTS, mcq_neg, register, register_figure, relcomp
from negft.probes.base import DataNotFound, EvalContext, Dataset, ProbeResult, read_csv, resolve
from negft.text import has_negation
from negft.probes.stats import resampled_means
from negft.probes.video import encode_rows
from negft.probes.similarity import grid_scores, option_scores

ALPHA = 0.05


@functools.lru_cache(maxsize=None)
def _word_zipf(word: str) -> float:
    from wordfreq import zipf_frequency
    return zipf_frequency(word, "en")


@functools.lru_cache(maxsize=1 << 16)     # the same captions after every epoch
def _zipf(text: str) -> float:
    words = [w.strip(",.?!").lower() for w in text.split()]
    return float(np.mean([_word_zipf(w) for w in words if w]))


def correlate(scores: dict[str, np.ndarray], features: dict[str, np.ndarray], n_boot: int) -> list[dict]:
    """One row per (score, feature): kind, effect, its 95% interval, p, significant. For a binary feature the
    scores share their resamples (one draw of each group per feature)."""
    from scipy import stats
    rows = []
    for fname, f in features.items():
        binary = set(np.unique(f)) <= {0.0, 1.0}
        if binary:
            S = np.stack(list(scores.values()), axis=1)          # (examples, scores)
            A, B = S[f == 1], S[f == 0]
            if len(A) < 2 or len(B) < 2:
                continue
            boot = resampled_means(A, n_boot, seed=0) - resampled_means(B, n_boot, seed=1)    # (n_boot, scores)
            cis = np.percentile(boot, [2.5, 97.5], axis=0).T
            p_values = stats.ttest_ind(A, B, equal_var=False).pvalue
        for j, (sname, s) in enumerate(scores.items()):
            if binary:
                effect, p = float(A[:, j].mean() - B[:, j].mean()), float(p_values[j])
                ci = [float(x) for x in cis[j]]
                kind = "binary (difference of means, Welch t-test)"
            else:
                if np.std(f) == 0 or np.std(s) == 0:
                    continue
                res = stats.pearsonr(f, s)
                effect, p = float(res.statistic), float(res.pvalue)
                ci = [float(x) for x in res.confidence_interval()]
                kind = "numeric (Pearson r)"
            rows.append({"score": sname, "feature": fname, "kind": kind, "effect": effect, "ci95": ci,
                         "p": p, "significant": bool(p < ALPHA), "n": int(len(s))})
    return sorted(rows, key=lambda r: (r["score"], -abs(r["effect"])))


def _relcomp_pairs(ctx, dataset, ann):
    root = dataset.root
    rows, _ = relcomp.pairs(root, read_csv(root / "relcomp.csv"))      # the relcomp probe counts the others
    if not rows:
        return np.zeros(0), np.zeros(0), {}
    images = ctx.encode_images([resolve(root, r[k]) for r in rows for k in ("image_0", "image_1")]).view(len(rows), 2, -1)
    texts = ctx.encode_texts(relcomp.captions(rows)).view(len(rows), 2, -1)
    s = grid_scores(texts, images)          # s[n, caption t, image i]
    P = torch.cat([s[:, 0, 0], s[:, 1, 1]]).numpy()
    N = torch.cat([s[:, 0, 1], s[:, 1, 0]]).numpy()
    feats = {"kind_relation": [], "caption_words": [], "word_frequency": []}
    if ann is not None:
        feats.update(horizontal=[], objects=[])
    for t in (0, 1):
        for r in rows:
            feats["kind_relation"].append(float(r["kind"] == "relation"))
            if ann is not None:
                a = ann[r["image_0"]]
                feats["horizontal"].append(float(a["horizontal"]))
                feats["objects"].append(float(a["objects"]))
            feats["caption_words"].append(float(len(r[f"caption_{t}"].split())))
            feats["word_frequency"].append(_zipf(r[f"caption_{t}"]))
    return P, N, feats


def _mcq_pairs(ctx, dataset, ann):
    """The questions ``mcq_neg`` scores (its reader: the dataset's released file, frame-averaged videos)."""
    rows = mcq_neg.load(dataset)["rows"]
    images, kept, _ = encode_rows(ctx, dataset, [r["visual"] for r in rows])    # mcq_neg counts the others
    rows = [r for r, k in zip(rows, kept) if k]
    if not rows:
        return np.zeros(0), np.zeros(0), {}
    n = len(rows[0]["options"])
    texts = ctx.encode_texts(mcq_neg.option_texts(rows)).view(len(rows), n, -1)
    s = option_scores(images, texts)
    right = torch.tensor([r["answer"] for r in rows])
    P = s.gather(1, right.view(-1, 1)).squeeze(1)
    N = s.scatter(1, right.view(-1, 1), float("-inf")).max(1).values
    answers = [r["options"][r["answer"]] for r in rows]
    feats = {
        "answer_negation": [float(r["template"] == "negative") for r in rows],
        "answer_hybrid": [float(r["template"] == "hybrid") for r in rows],
        "answer_has_negation_word": [float(has_negation(a)) for a in answers],
        "caption_words": [float(len(a.split())) for a in answers],
        "word_frequency": [_zipf(a) for a in answers],
    }
    if ann is not None:
        feats["objects"] = [float(ann[r["image_path"]]["objects"]) for r in rows]
    return P.numpy(), N.numpy(), feats


def _annotations(path) -> dict:
    """image_path -> its features that ``image_features.csv`` gives as numbers (an empty or garbled cell is left
    out, and a builder that needs it raises KeyError)."""
    out = {}
    for a in read_csv(path):
        values = {}
        for k in ("horizontal", "objects"):
            try:
                values[k] = float(a[k])
            except (KeyError, TypeError, ValueError):
                pass
        if isinstance(a.get("image_path"), str):
            out[a["image_path"]] = values
    return out


def _texts(dataset: Dataset) -> list[str]:
    """The pairs' texts: those the relcomp and mcq_neg probes declare."""
    return TEXTS["relcomp"](dataset) + TEXTS["mcq_neg"](dataset)


@register("analysis", texts=_texts, version=2, unordered=("D_<x>",),    # D_<feature>: an effect on D
          metrics={"analysis_mcq": ("D", "D_<x>"), "analysis_relcomp": ("D", "D_<x>")})
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    ann_path = dataset.root / "image_features.csv"
    sources = {"relcomp": (dataset.root / "relcomp.csv").exists(), "mcq": bool(mcq_neg.load(dataset)["rows"])}
    if not any(sources.values()):
        raise DataNotFound(dataset, dataset.root / "relcomp.csv", " (nor an MCQ file)")
    ann = _annotations(ann_path) if ann_path.exists() else None
    table = []
    for source, build in (("relcomp", _relcomp_pairs), ("mcq", _mcq_pairs)):
        if not sources[source]:
            continue
        try:
            P, N, feats = build(ctx, dataset, ann)
        except KeyError as e:           # an image that image_features.csv does not describe (or garbles)
            result.skipped[f"analysis_{source}/{dataset.name}/image_features"] = (
                f"{ann_path} has no usable row for {e}: its features are left out")
            P, N, feats = build(ctx, dataset, None)
        if not len(P):
            continue
        rows = correlate({"P": P, "N": N, "D": P - N}, {k: np.asarray(v) for k, v in feats.items()}, ctx.n_boot)
        for r in rows:
            r["pairs"] = source
            if r["score"] == "D":
                key = f"analysis_{source}/{dataset.name}/D_{r['feature']}"
                result.metrics[key], result.ci95[key] = r["effect"], r["ci95"]
        result.add(f"analysis_{source}/{dataset.name}/D", P - N, ctx.n_boot)
        table += rows
    result.records[f"analysis/{dataset.name}"] = table
    return result


@register_figure("analysis")
def figure(records: list[dict], path) -> None:
    """The significant effects on D, one bar per (pairs, feature), with their intervals."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in records if r["score"] == "D"]
    rows.sort(key=lambda r: r["effect"])
    fig, ax = plt.subplots(figsize=(6, 0.3 * len(rows) + 1.2))
    y = np.arange(len(rows))
    eff = [r["effect"] for r in rows]
    err = np.array([[r["effect"] - r["ci95"][0], r["ci95"][1] - r["effect"]] for r in rows]).T
    colors = ["tab:blue" if r["significant"] else "lightgray" for r in rows]
    ax.barh(y, eff, xerr=err, color=colors)
    labels = [f"{r['pairs']}: {r['feature']}" for r in rows]
    ax.set_yticks(y, labels, fontsize=7)
    ax.axvline(0, color="k", lw=0.5)
    ax.set_title("effect on D = P − N (blue: p < 0.05; binary: Δ mean, numeric: Pearson r)", fontsize=8)
    # margins for the longest label (about 0.06 inch per 7-point character) instead of tight_layout's extra draw
    height = fig.get_figheight()
    fig.subplots_adjust(left=min(0.7, (0.2 + 0.062 * max(map(len, labels), default=0)) / 6), right=0.97,
                        bottom=0.45 / height, top=1 - 0.35 / height)
    fig.savefig(path, dpi=120)
    plt.close(fig)

