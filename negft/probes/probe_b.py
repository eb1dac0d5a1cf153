"""Probe-B (the Probe-R/C/B paper, section 3.3, equations 7-8, figures 5-6): does recognition lean on the
background (task ``mr``, Probe-B_MR: background replaced, all objects kept) or on the other objects (task ``r``,
Probe-B_R: background and all objects but one replaced)? Read from the release's files.

Released layout (DeepLearningRobustnessStudies/UnderstandingVisualTextModels, ``core/eval_context_understanding.py``
(MR), ``core/eval_cooccurence_understanding.py`` (R), ``README.md`` and ``new_datasets/README.md``; paths in
negft.data.layout_rcb), for each filler ``black, gray, noise, scene``:

- MR: ``data/context/background_context_dataset.json``, a list of ``{annotations: {class: [COCO annotations]},
  image: "COCO_val2014_<id>.jpg", image_id}``; x0 the original ``data/coco/val2014/<image>``, x̃0 the patched
  ``data/coco/val2014_random_patch_dataset/<fill>/<image>``, x̃1 the background-removed
  ``data/coco/val2014_background_removed_dataset/segmentation_mask/<fill>/<image>``; labels: the annotated classes.
- R: ``data/context/object_context_dataset.json``, a list of ``{image_id, object, other_objects, path}``; x0 the
  background-removed image with all objects (the release's ``--root_image_orig_dir`` for R is
  ``val2014_background_removed_dataset/segmentation_mask/<fill>``), x̃0 the patched image, x̃1 the one-object image
  ``val2014_background_removed_and_cooccurrence_dataset/segmentation_mask/<fill>/<object>_COCO_val2014_<id>.jpg``;
  the classes scored are all but ``other_objects`` (the release drops their prompts), the label is ``object``,
  and the class ``apple`` is left out as the release leaves it out.
- ``data/context/prompt_classes.csv`` (columns ``class, prompt``): one prompt per class, the class prompts.

Images named ``.jpg`` by the release may be ``.png`` of the same stem. As in the release, a row is kept only where
its images exist (the release lists the patch folder); rows left out, and malformed rows, are counted
(``probe_b_<task>/<dataset>/skipped_rows``, only when rows were skipped, and ``skipped``); a filler whose
folder is absent is skipped with its path; a file that cannot be read is skipped with its reason.

Metrics ``probe_b_<task>/<dataset>/<metric>``, with s the cosine of an image with each class prompt and c the
softmax over the classes of ``logit_scale · s`` (the release's confidence):

- ``map`` / ``map_patch`` / ``map_removed``: mean per-image AP of x0 (each original image once) / x̃0 / x̃1, negft's
  AP: tied scores form one threshold (scikit-learn's rule), so all-equal scores give the share of labelled
  classes. ``map_official`` / ``map_patch_official`` / ``map_removed_official``: the release's
  ``average_precision`` on c (float32): classes ranked by ``numpy.argsort(c)[::-1]``, so ties are ordered by
  numpy's sort (for all-equal scores: the last classes first) and the AP depends on where the labels sit. (MR:
  the release's ``gt_ap``, ``patch_ap``, ``mod_ap``; the R script computes no AP.) They differ only on ties;
  negft's rule keeps a model that cannot tell classes apart from scoring by the order of the class list.
- ``gamma``: relative robustness γ = 1 − (AP(x0) − AP(x̃1)) / AP(x0) = AP(x̃1) / AP(x0) (equation 7), over rows
  with AP(x0) > 0 (negft's guard); ``gamma_patch`` the same against x̃0; ``gamma_<filler>`` per filler.
  ``gamma_official`` (and ``_patch``, ``_<filler>``): MR, the release's ``relative_robustness_gt_mod_ap`` (its AP,
  no guard) and ``relative_robustness_patch_mod_ap``; R, the release's ``rel_robustness_gt_mod_change_conf``,
  1 − (c0 − c1) / c0 on the object's confidence (the R script's γ is on confidence, not AP) and
  ``rel_robustness_patch_mod_change_conf``.
- ``dconf``: mean over the labelled classes of c(x0) − c(x̃1) (equation 8; the release's ``change_gt_mod_conf`` /
  ``gt_mod_change_conf``, no tie rule involved, so no ``_official``).
- R only: ``acc`` / ``acc_removed``: top-1 of the object among the scored classes on x0 / x̃1, ties sharing the
  credit; ``acc_official`` / ``acc_removed_official``: the release's ``np.argmax(c) == object`` (the first
  maximum wins, so all-equal scores credit the first class only): ``gt_single_object_acc``,
  ``mod_single_object_acc``.
"""
from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np
import torch

from negft.data import layout_rcb
from negft.probes import register, register_figure
from negft.probes.base import Dataset, EvalContext, ProbeResult, missing, parse_once
from negft.probes.released import read_json, report_skips
from negft.probes.stats import bootstrap_ci, choice_credit
from negft.probes.similarity import score_matrix

TASKS = ("mr", "r")
ROLE = {"x0": "original image", "x0_patch": "patched image", "x1": "modified image"}
FILES = {"mr": layout_rcb.PROBE_B_MR_FILE, "r": layout_rcb.PROBE_B_R_FILE}


def average_precision(scores: torch.Tensor, labels: torch.Tensor, chunk: int = 2048) -> torch.Tensor:
    """Per-row average precision of ``scores`` (N, C) against boolean ``labels`` (N, C); tied scores form
    one threshold, as in ``sklearn.metrics.average_precision_score``. Rows without a label give 0. Rows are
    taken ``chunk`` at a time (the comparison is C x C per row)."""
    if len(scores) > chunk:
        return torch.cat([average_precision(scores[i:i + chunk], labels[i:i + chunk], chunk)
                          for i in range(0, len(scores), chunk)])
    labels = labels.bool()
    at_or_above = scores.unsqueeze(1) >= scores.unsqueeze(2)           # [n, p, c]: s_c >= s_p
    hits = (at_or_above & labels.unsqueeze(1)).sum(-1).double()       # positives at or above p's score
    precision = hits / at_or_above.sum(-1).double()
    n_pos = labels.sum(-1)
    return (precision * labels).sum(-1) / n_pos.clamp(min=1)


def release_average_precision(target: np.ndarray, output: np.ndarray) -> np.ndarray:
    """Per-row AP as the release's ``average_precision(target, output)`` computes it, for rows of ``output``
    (N, C) against 0/1 ``target`` (N, C): classes in the order ``output.argsort()[::-1]`` (numpy's default sort,
    row by row), precision at each labelled rank summed and divided by (labels + 1e-8)."""
    order = np.argsort(output, axis=-1)[:, ::-1]
    hit = np.take_along_axis(target, order, axis=-1) == 1
    count = np.cumsum(hit, axis=-1)
    precision = np.where(hit, count, 0) / np.arange(1, output.shape[1] + 1)
    return precision.sum(-1) / (count[:, -1] + 1e-8)


# ------------------------------------------------------------------ reading


def _classes(path) -> list:
    """[(class, prompt)] of prompt_classes.csv, or [("file", reason)]."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as e:
        return [("file", f"unreadable CSV ({type(e).__name__}: {e})")]
    if not rows or not {"class", "prompt"} <= set(rows[0]):
        return [("file", "expected columns class, prompt")]
    return [(r["class"], r["prompt"]) for r in rows if r["class"] and r["prompt"]]


def read_classes(dataset: Dataset) -> tuple[list[tuple[str, str]], str | None]:
    path = dataset.root / layout_rcb.PROMPT_CLASSES
    if not path.exists():
        return [], missing(dataset, path)
    parsed = parse_once(path, _classes)
    if parsed and parsed[0][0] == "file":
        return [], f"{path}: {parsed[0][1]}"
    if not parsed:
        return [], f"{path}: no class"
    return list(parsed), None


def _fill_folders(root: Path, task: str, fill: str) -> dict[str, Path]:
    """Where x0, x̃0 and x̃1 of ``task`` are for filler ``fill`` (the release's --root_image_*_dir of each script)."""
    if task == "mr":
        return {"x0": root / layout_rcb.COCO_IMAGES, "x0_patch": root / layout_rcb.patch_dir(fill),
                "x1": root / layout_rcb.background_removed_dir(fill)}
    return {"x0": root / layout_rcb.background_removed_dir(fill), "x0_patch": root / layout_rcb.patch_dir(fill),
            "x1": root / layout_rcb.one_object_dir(fill)}


def _rows_of(task: str):
    def parse(path) -> list:
        """[("row", fill, row dict)], [("skip", fill, reason)], [("fill", fill, folder)] for a filler whose
        folder is absent, or [("file", reason)]; images resolved once per version of the file."""
        root = layout_rcb.release_root(path)
        data, why = read_json(path, list)
        if why:
            return [("file", why)]
        out = []
        for fill in layout_rcb.PROBE_B_FILLERS:
            folders = _fill_folders(root, task, fill)
            if not folders["x0_patch"].is_dir():
                out.append(("fill", fill, str(folders["x0_patch"])))
                continue
            names = {k: layout_rcb.listing(v) for k, v in folders.items()}
            for a in data:
                row, why = _row(task, a, folders, names)
                out.append(("row", fill, row) if why is None else ("skip", fill, why))
        return out
    return parse


_PARSERS = {task: _rows_of(task) for task in TASKS}


def _row(task: str, a, folders: dict, names: dict) -> tuple[dict | None, str | None]:
    if not isinstance(a, dict) or isinstance(a.get("image_id"), bool) or not isinstance(a.get("image_id"), (int, str)):
        return None, "row is not an object with an image_id"
    name = layout_rcb.coco_name(a["image_id"])
    if task == "mr":
        labels = a.get("annotations")
        if not isinstance(labels, dict) or not labels:
            return None, "'annotations' missing or empty"
        images = {"x0": name, "x0_patch": name, "x1": name}
        row = {"labels": sorted(labels)}
    else:
        obj, others = a.get("object"), a.get("other_objects", [])
        if not isinstance(obj, str) or not obj or not isinstance(others, list):
            return None, "'object' / 'other_objects' missing"
        if obj == layout_rcb.R_EXCLUDED_CLASS:
            return None, f"object '{layout_rcb.R_EXCLUDED_CLASS}' (the release leaves it out)"
        images = {"x0": name, "x0_patch": name, "x1": layout_rcb.one_object_name(obj, a["image_id"])}
        row = {"labels": [obj], "others": [o for o in others if isinstance(o, str)]}
    for key, file in images.items():
        found = layout_rcb.find_image(folders[key], file, names[key])
        if found is None:
            return None, f"{ROLE[key]} not found"
        row[key] = layout_rcb.image_key(found)
    row["image_id"] = a["image_id"]
    return row, None


def read_task(dataset: Dataset, task: str, classes: list[str]) -> tuple[dict, Counter, dict, str | None]:
    """({fill: rows}, skipped rows by reason, {fill: why skipped}, why the whole file is skipped or None)."""
    path = dataset.root / FILES[task]
    if not path.exists():
        return {}, Counter(), {}, missing(dataset, path)
    parsed = parse_once(path, _PARSERS[task])
    if parsed and parsed[0][0] == "file":
        return {}, Counter(), {}, f"{path}: {parsed[0][1]}"
    known = set(classes) - ({layout_rcb.R_EXCLUDED_CLASS} if task == "r" else set())
    rows, skipped, fills = {}, Counter(), {}
    for kind, fill, payload in parsed:
        if kind == "fill":
            fills[fill] = missing(dataset, Path(payload))
        elif kind == "skip":
            skipped[payload] += 1
        elif not set(payload["labels"]) <= known:
            skipped["class not in prompt_classes.csv"] += 1
        else:
            rows.setdefault(fill, []).append(payload)
    return rows, skipped, fills, None


def has_task_file(dataset: Dataset) -> bool:
    return any((dataset.root / FILES[t]).exists() for t in TASKS)


def prompts(classes: list[tuple[str, str]]) -> list[str]:
    """The class prompts, class by class: what ``run`` encodes."""
    return [p for _, p in classes]


def _texts(dataset: Dataset) -> list[str]:
    classes, why = read_classes(dataset)
    return prompts(classes) if has_task_file(dataset) and why is None else []


# ------------------------------------------------------------------ scoring


@register("probe_b", texts=_texts, version=2, lower=("dconf",), metrics={    # dconf: confidence lost unaided
    "probe_b_mr": ("map", "map_patch", "map_removed", "gamma", "gamma_<x>", "dconf"),
    "probe_b_r": ("acc", "acc_removed", "map", "map_patch", "map_removed", "gamma", "gamma_<x>", "dconf")})
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    classes, why = read_classes(dataset)
    if not has_task_file(dataset):
        for task in TASKS:
            result.skipped[f"probe_b_{task}/{dataset.name}"] = missing(dataset, dataset.root / FILES[task])
        return result
    if why is not None:
        for task in TASKS:
            path = dataset.root / FILES[task]
            result.skipped[f"probe_b_{task}/{dataset.name}"] = why if path.exists() else missing(dataset, path)
        return result
    names = [c for c, _ in classes]
    text = ctx.encode_texts(prompts(classes))
    for task in TASKS:
        prefix = f"probe_b_{task}/{dataset.name}"
        by_fill, skipped, fills, why = read_task(dataset, task, names)
        if why is not None:
            result.skipped[prefix] = why
            continue
        for fill, reason in fills.items():
            result.skipped[f"{prefix}/{fill}"] = reason
        rows = [dict(r, filler=fill) for fill in layout_rcb.PROBE_B_FILLERS for r in by_fill.get(fill, [])]
        report_skips(result, prefix, dataset.root / FILES[task], skipped, sum(skipped.values()) + len(rows))
        if not rows:
            result.skipped[prefix] = f"no row to score in {dataset.root / FILES[task]}"
            continue
        _score(ctx, result, prefix, task, rows, names, text)
    return result


def _score(ctx: EvalContext, result: ProbeResult, prefix: str, task: str, rows: list[dict], names: list[str],
           text: torch.Tensor) -> None:
    index = {c: k for k, c in enumerate(names)}
    n, scale = len(rows), ctx.logit_scale
    labels = torch.zeros(n, len(names), dtype=torch.bool)
    scored = torch.ones(n, len(names), dtype=torch.bool)        # the classes each row is scored over
    for k, r in enumerate(rows):
        labels[k, [index[c] for c in r["labels"]]] = True
        if task == "r":
            scored[k, [index[c] for c in r["others"] if c in index]] = False
            if layout_rcb.R_EXCLUDED_CLASS in index:
                scored[k, index[layout_rcb.R_EXCLUDED_CLASS]] = False
    ap, ap_official, conf, cos = {}, {}, {}, {}
    for column in ("x0", "x0_patch", "x1"):
        s = score_matrix(ctx.encode_images([r[column] for r in rows]), text)
        s = s.masked_fill(~scored, float("-inf"))
        cos[column] = s
        prob = torch.softmax((scale * s).float(), dim=1)
        ap[column] = average_precision(s, labels)
        ap_official[column] = torch.from_numpy(release_average_precision(labels.numpy().astype(np.float32),
                                                                        prob.numpy())).double()
        conf[column] = (prob * labels).sum(1).double() / labels.sum(1)
    add = lambda key, values: result.add(f"{prefix}/{key}", values, ctx.n_boot)
    once = _first_of_group(rows) if task == "mr" else torch.ones(n, dtype=torch.bool)
    add("map", ap["x0"][once])
    add("map_patch", ap["x0_patch"])
    add("map_removed", ap["x1"])
    guard, guard_patch = ap["x0"] > 0, ap["x0_patch"] > 0
    gamma = ap["x1"] / ap["x0"].clamp(min=1e-12)
    add("gamma", gamma[guard])
    add("gamma_patch", (ap["x1"] / ap["x0_patch"].clamp(min=1e-12))[guard_patch])
    add("dconf", conf["x0"] - conf["x1"])
    if task == "mr":
        add("map_official", ap_official["x0"][once])
        add("map_patch_official", ap_official["x0_patch"])
        add("map_removed_official", ap_official["x1"])
        gamma_official = 1 - (ap_official["x0"] - ap_official["x1"]) / ap_official["x0"]
        add("gamma_patch_official", 1 - (ap_official["x0_patch"] - ap_official["x1"]) / ap_official["x0_patch"])
    else:
        gamma_official = 1 - (conf["x0"] - conf["x1"]) / conf["x0"]
        add("gamma_patch_official", 1 - (conf["x0_patch"] - conf["x1"]) / conf["x0_patch"])
        target = labels.float().argmax(1)
        for column, key in (("x0", "acc"), ("x1", "acc_removed")):
            add(key, choice_credit(cos[column], target))
            first_max = torch.from_numpy(np.argmax(torch.softmax((scale * cos[column]).float(), 1).numpy(), axis=1))
            add(f"{key}_official", (first_max == target).double())
    add("gamma_official", gamma_official)
    for fill in layout_rcb.PROBE_B_FILLERS:
        by = torch.tensor([r["filler"] == fill for r in rows])
        if by.any():
            add(f"gamma_{fill}", gamma[guard & by])
            add(f"gamma_{fill}_official", gamma_official[by])
    result.records[prefix] = [
        {"task": task, "filler": r["filler"], "image_id": r["image_id"], "x0": r["x0"], "x0_patch": r["x0_patch"],
         "x1": r["x1"], "labels": r["labels"], "ap_x0": float(ap["x0"][k]), "ap_x0_patch": float(ap["x0_patch"][k]),
         "ap_x1": float(ap["x1"][k]), "dconf": float(conf["x0"][k] - conf["x1"][k])}
        for k, r in enumerate(rows)]


def _first_of_group(rows: list[dict]) -> torch.Tensor:
    """One row per original image (AP(x0) repeats across its fillers)."""
    seen, first = set(), []
    for r in rows:
        first.append(r["x0"] not in seen)
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
    fillers = [f for f in layout_rcb.PROBE_B_FILLERS if any(r["filler"] == f for r in records)]
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


for _task in TASKS:
    register_figure(f"probe_b_{_task}")(figure)
