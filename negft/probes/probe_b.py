"""Probe-B (004_88b1c9c2a7bbadad, section 3.3, equations 7-8, figures 5-6): does recognition lean on the
background (task ``mr``: background replaced, all objects kept) or on the other objects (task ``r``:
background and all objects but one replaced)?

``probe_b.csv`` (schema.PROBE_B_CSV_COLUMNS) gives, per group and filler (black, gray, noise, scene), the
original image x0, x0 with a filler patch on its background (x̃0) and the modified image x̃1, and the class
names present. Every image is scored against every class prompt (the zero-shot prompt ensemble) and:

- ``map`` / ``map_patch`` / ``map_removed``: mean per-image average precision of x0 / x̃0 / x̃1;
- ``gamma``: relative robustness γ = 1 − (AP(x0) − AP(x̃1)) / AP(x0) = AP(x̃1) / AP(x0) (equation 7), and
  ``gamma_patch`` the same against x̃0 (the paper's control for any pasted patch); ``gamma_<filler>`` per filler;
- ``dconf``: mean over the present classes of c(x0) − c(x̃1) (equation 8), c the softmax over the class
  prompts of the model's scaled similarities (Probe-R's confidence).

Where ours differs from the reference: AP counts tied scores as one threshold (scikit-learn's rule), so
all-equal scores give the share of present classes, not a perfect ranking; γ is taken over groups with
AP(x0) > 0 only (the guard). In task ``r`` the one kept object is the only label in all three images.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from negft.data.schema import PROBE_B_FILLERS, PROBE_B_TASKS
from negft.probes import register, register_figure
from negft.probes.base import Dataset, EvalContext, ProbeResult, missing, read_csv, resolve
from negft.probes.stats import bootstrap_ci
from negft.probes.zeroshot import class_features, class_names, prompt_texts


def average_precision(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-row average precision of ``scores`` (N, C) against boolean ``labels`` (N, C); tied scores form
    one threshold, as in ``sklearn.metrics.average_precision_score``. Rows without a label give 0."""
    labels = labels.bool()
    at_or_above = scores.unsqueeze(1) >= scores.unsqueeze(2)           # [n, p, c]: s_c >= s_p
    hits = (at_or_above & labels.unsqueeze(1)).sum(-1).double()       # positives at or above p's score
    precision = hits / at_or_above.sum(-1).double()
    n_pos = labels.sum(-1)
    return (precision * labels).sum(-1) / n_pos.clamp(min=1)


@register("probe_b", texts=prompt_texts("probe_b.csv"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    path = dataset.root / "probe_b.csv"
    classes = class_names(dataset.root)
    if not path.exists() or classes is None:
        for task in PROBE_B_TASKS:
            result.skipped[f"probe_b_{task}/{dataset.name}"] = missing(dataset, path)
        return result
    rows = read_csv(path)
    text = class_features(ctx, classes)
    scale = ctx.logit_scale
    index = {c: k for k, c in enumerate(classes)}
    labels = torch.zeros(len(rows), len(classes), dtype=torch.bool)
    for n, r in enumerate(rows):
        labels[n, [index[c] for c in json.loads(r["labels"])]] = True
    ap, conf = {}, {}
    for column in ("x0", "x0_patch", "x1"):
        s = ctx.encode_images([resolve(dataset.root, r[column]) for r in rows]) @ text.T
        ap[column] = average_precision(s, labels)
        conf[column] = (torch.softmax(scale * s, dim=1) * labels).sum(1) / labels.sum(1)
    for task in PROBE_B_TASKS:
        prefix = f"probe_b_{task}/{dataset.name}"
        mask = torch.tensor([r["task"] == task for r in rows])
        if not mask.any():
            result.skipped[prefix] = f"no rows of task {task!r} in {path}"
            continue
        result.add(f"{prefix}/map", ap["x0"][_first_of_group(rows, task)], ctx.n_boot)
        result.add(f"{prefix}/map_patch", ap["x0_patch"][mask], ctx.n_boot)
        result.add(f"{prefix}/map_removed", ap["x1"][mask], ctx.n_boot)
        guard = mask & (ap["x0"] > 0)
        gamma = ap["x1"] / ap["x0"].clamp(min=1e-12)
        result.add(f"{prefix}/gamma", gamma[guard], ctx.n_boot)
        guard_patch = mask & (ap["x0_patch"] > 0)
        result.add(f"{prefix}/gamma_patch", (ap["x1"] / ap["x0_patch"].clamp(min=1e-12))[guard_patch], ctx.n_boot)
        result.add(f"{prefix}/dconf", (conf["x0"] - conf["x1"])[mask], ctx.n_boot)
        for filler in PROBE_B_FILLERS:
            by = guard & torch.tensor([r["filler"] == filler for r in rows])
            if by.any():
                result.add(f"{prefix}/gamma_{filler}", gamma[by], ctx.n_boot)
        result.records[prefix] = [
            {**rows[n], "ap_x0": float(ap["x0"][n]), "ap_x0_patch": float(ap["x0_patch"][n]),
             "ap_x1": float(ap["x1"][n]), "dconf": float(conf["x0"][n] - conf["x1"][n])}
            for n in np.flatnonzero(mask.numpy())]
    return result


def _first_of_group(rows: list[dict], task: str) -> torch.Tensor:
    """One row per original image of ``task`` (AP(x0) repeats across its fillers)."""
    seen, first = set(), []
    for r in rows:
        first.append(r["task"] == task and r["x0"] not in seen)
        if r["task"] == task:
            seen.add(r["x0"])
    return torch.tensor(first)


TASK_TITLES = {"mr": "Probe-B_MR: background replaced, objects kept",
               "r": "Probe-B_R: background and all other objects replaced"}


def figure(records: list[dict], path) -> None:
    """Figures 5-6: mean AP of x0, x̃0 (filler patch) and x̃1 (background replaced) per filler, 95% intervals."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    columns = (("ap_x0", "x0 original"), ("ap_x0_patch", "x̃0 patch"), ("ap_x1", "x̃1 removed"))
    fillers = [f for f in PROBE_B_FILLERS if any(r["filler"] == f for r in records)]
    fig, ax = plt.subplots(figsize=(1.4 * len(fillers) + 2, 3.6))
    width = 0.8 / len(columns)
    for k, (column, label) in enumerate(columns):
        values = [np.array([r[column] for r in records if r["filler"] == f]) for f in fillers]
        means = [v.mean() for v in values]
        cis = [bootstrap_ci(v) for v in values]
        err = np.array([[m - lo for m, (lo, _) in zip(means, cis)], [hi - m for m, (_, hi) in zip(means, cis)]])
        ax.bar(np.arange(len(fillers)) + (k - 1) * width, means, width, yerr=err, capsize=2, label=label)
    ax.set_xticks(np.arange(len(fillers)), fillers)
    ax.set_ylabel("mean average precision")
    ax.set_ylim(0, 1)
    ax.set_title(TASK_TITLES.get(records[0]["task"], records[0]["task"]), fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    inches = fig.get_figwidth()       # tight_layout's margins, without its extra draw
    fig.subplots_adjust(left=0.7 / inches, right=1 - 0.15 / inches, bottom=0.1, top=0.92)
    fig.savefig(path, dpi=110)
    plt.close(fig)


for _task in PROBE_B_TASKS:
    register_figure(f"probe_b_{_task}")(figure)
