"""Caption-embedding geometry (NegBench section 4.1, figure 6a): does the text tower keep "X" and "no X" apart?

For every class, affirmative and negated template captions are embedded by the text tower alone. Metrics:

- ``negation_separation``: mean silhouette (cosine) of the affirmed / negated split over all captions,
  in [−1, 1]; near or below 0 means negated captions sit among affirmative ones (CLIP's shortcut:
  the negation word is ignored);
- ``object_separation``: mean silhouette of the split by class over all captions (how much the object
  still organises the space; ConCLIP's collapse of every negated caption to one point lowers it);
- ``negated_object_separation``: the same among the negated captions alone: near 0 when every "no X" sits at
  one point whatever X is (the collapse the paper shows for ConCLIP, figure 6a);
- ``negated_affirmed_cos``: mean cosine between a negated caption and the same template's affirmative one
  for the same class (1: negation ignored).

The per-caption 2-D PCA coordinates are the records, and ``figure`` draws them as the paper's figure 6a.
Differences from the paper: our own 12 + 12 templates (the paper's 24 + 24 are in an appendix we do not
have), and numeric scores, where the paper shows only the projection.
"""
from __future__ import annotations

import numpy as np
import torch

from negft.text import with_article
from negft.probes import register, register_figure
from negft.probes.base import DataNotFound, EvalContext, Dataset, ProbeResult
from negft.probes.zeroshot import class_names

AFFIRMED = ("a photo of {}.", "there is {} in the image.", "this picture shows {}.", "{} is visible here.",
            "an image that contains {}.", "a scene with {}.", "i can see {}.", "{}.",
            "a drawing of {}.", "this image has {} in it.", "the photo features {}.", "look, {}!")
NEGATED = ("a photo of no {n}.", "there is no {n} in the image.", "this picture does not show {}.",
           "{} is not visible here.", "an image that contains no {n}.", "a scene without {}.",
           "i cannot see {}.", "not {}.", "a drawing with no {n}.", "this image has no {n} in it.",
           "the photo does not feature {}.", "look, no {n}!")


def captions(classes: list[str]) -> list[tuple[str, int, bool, int]]:
    """(caption, class index, negated, template index) for every class and template."""
    out = []
    for c, name in enumerate(classes):
        for t, (aff, neg) in enumerate(zip(AFFIRMED, NEGATED)):
            out.append((aff.format(with_article(name)), c, False, t))
            out.append((neg.format(with_article(name), n=name), c, True, t))
    return out


def caption_texts(caps: list[tuple]) -> list[str]:
    """The texts of ``captions``: what ``run`` encodes."""
    return [c for c, *_ in caps]


def _texts(dataset: Dataset) -> list[str]:
    classes = class_names(dataset)
    return caption_texts(captions(classes)) if classes is not None else []


@register("geometry", texts=_texts, version=1, lower=("negated_affirmed_cos",), metrics=(
    "negation_separation", "object_separation", "negated_object_separation", "negated_affirmed_cos"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    from sklearn.decomposition import PCA
    from sklearn.metrics import silhouette_samples
    result = ProbeResult()
    prefix = f"geometry/{dataset.name}"
    classes = class_names(dataset)
    if classes is None:
        raise DataNotFound(dataset, dataset.root / "classes.json")
    caps = captions(classes)
    emb = ctx.encode_texts(caption_texts(caps)).numpy()
    negated = np.array([n for _, _, n, _ in caps])
    objects = np.array([o for _, o, _, _ in caps])
    result.add(f"{prefix}/negation_separation", silhouette_samples(emb, negated, metric="cosine"), ctx.n_boot)
    result.add(f"{prefix}/object_separation", silhouette_samples(emb, objects, metric="cosine"), ctx.n_boot)
    result.add(f"{prefix}/negated_object_separation",
               silhouette_samples(emb[negated], objects[negated], metric="cosine"), ctx.n_boot)
    pairs = torch.from_numpy(emb).view(len(classes), len(AFFIRMED), 2, -1)
    result.add(f"{prefix}/negated_affirmed_cos", (pairs[:, :, 0] * pairs[:, :, 1]).sum(-1).flatten(), ctx.n_boot)
    xy = PCA(n_components=2, random_state=0).fit_transform(emb)
    result.records[prefix] = [{"caption": c, "class": classes[o], "negated": bool(n), "template": t,
                               "pc1": round(float(x), 5), "pc2": round(float(y), 5)}
                              for (c, o, n, t), (x, y) in zip(caps, xy)]
    return result


@register_figure("geometry")
def figure(records: list[dict], path) -> None:
    """Figure 6a: the PCA of affirmed (circles) and negated (crosses) captions, one colour per class."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = sorted({r["class"] for r in records})
    cmap = plt.get_cmap("tab20")
    fig, ax = plt.subplots(figsize=(6, 5))
    for i, name in enumerate(names):
        for negated, marker in ((False, "o"), (True, "x")):
            pts = [(r["pc1"], r["pc2"]) for r in records if r["class"] == name and r["negated"] == negated]
            ax.scatter(*zip(*pts), marker=marker, color=cmap(i % 20), s=18,
                       label=name if not negated else None)
    ax.set_title("caption embeddings, PCA (o: affirmed, x: negated)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    fig.subplots_adjust(left=0.1, right=0.97, bottom=0.07, top=0.94)      # tight_layout's, without its extra draw
    fig.savefig(path, dpi=120)
    plt.close(fig)
