"""Zero-shot classification, the drift measure: ImageNet-1k val, ImageNet-V2, or any classification set in the
folder layout, scored as open_clip and LAION-AI/CLIP_benchmark score them.

Released layouts read (a *folder set*: one folder of class folders of images, plus optional class names and
prompt templates):

- ImageNet-1k val, ``val/<wnid>/*.JPEG`` (50,000 images in 1,000 folders): torchvision ``ImageNet`` /
  ``ImageFolder``'s layout, which CLIP_benchmark reads (``clip_benchmark/datasets/builder.py``:
  ``imagenet1k`` via ``ImageNet(split="val")``, ``imagenet1k-unverified`` via ``ImageFolder(root/val)``).
  Class i is the i-th wnid in sorted order (ImageFolder's order), which is the order of open_clip's
  ``IMAGENET_CLASSNAMES`` (OpenAI's names; CLIP_benchmark's ``en_classnames.json`` ``imagenet1k`` is the same
  list, and its ``all_imagenet_wordnet_ids``, ``negft/probes/imagenet_wnids.py``, is sorted and indexes it).
  Prompts: ``OPENAI_IMAGENET_TEMPLATES`` (80; CLIP_benchmark's ``en_zeroshot_classification_templates.json``
  ``imagenet1k`` is the same list).
- ImageNet-V2 (``imagenetv2-matched-frequency-format-val/<class index>/<hash>.jpeg``, 10,000 images): folders
  named by class index (CLIP_benchmark ``datasets/imagenetv2.py``: ``label = int(parent folder name)``), with
  ImageNet's class names and templates.
- Any other folder set, as CLIP_benchmark's ``wds`` datasets carry their metadata
  (``builder.py`` ``build_wds_dataset``): ``classnames.txt`` (one name per line, line i = class i) and
  ``zeroshot_classification_templates.txt`` (one template per line, ``{c}`` standing for the class name)
  beside the class folders; without them the folder names are the class names (ImageFolder's ``classes``) and
  the templates OpenAI's (CLIP_benchmark's default, ``default_dataset_for_templates = "imagenet1k"``).

A dataset's manifest describes its set under ``zeroshot:`` (every key optional):
``images`` (the folder of class folders, relative to the root; default the root itself), ``classes``
(``imagenet`` | a file of names under the root; default ``classnames.txt`` if present, else ImageNet's names
when every folder is an ImageNet wnid, else the folder names), ``templates`` (``openai`` | ``simple`` (open_clip's
``SIMPLE_IMAGENET_TEMPLATES``) | a file under the root; default ``zeroshot_classification_templates.txt`` if
present, else ``openai``), ``labels`` (``wnid``: the folder's index among the 1,000 sorted ImageNet wnids;
``index``: the folder name is the class index; ``sorted``: the i-th folder in sorted order is class i;
default ``wnid`` when every folder is a wnid and there are 1,000 classes, ``index`` when every folder name is a
number, else ``sorted``). Adding a set is a manifest (``probes: [zeroshot]``) and, if its folders are not
ImageNet's, a ``classnames.txt``. A dataset without a manifest (the world's split) reads its set from
``zeroshot/`` under its root: the world writes its zero-shot images there by class index, with its class
names and prompts (``negft/world/formats/zeroshot_folder.py``).

Images are every file with an image extension under a class folder (torchvision's list, any case, recursively
and in sorted order as ImageFolder walks them). Each class's text feature is open_clip's
``build_zero_shot_classifier`` (and CLIP_benchmark's ``zero_shot_classifier``): the mean of its prompts'
L2-normalised features, normalised again; prompts are encoded through the evaluation's text cache.

Metrics (``zeroshot/<dataset>/<metric>``), logits being image · class feature:

- ``top1``, ``top5`` (negft's rule): the right class's expected hit under a random tie-break (a class tied with
  k others at the cut shares the remaining places), so a constant model scores 1/C and 5/C.
- ``top1_official``, ``top5_official``: open_clip's ``zero_shot_classifier``-based ``accuracy`` and
  CLIP_benchmark's ``metrics/zeroshot_classification.py`` ``accuracy``: the right class among
  ``logits.topk(k)``. ``torch.topk`` leaves the order of tied logits unspecified, so ties go here to the lower
  class index, as ``torch.argmax`` (its top-1 prediction) breaks them; they differ from ours only on exact ties.
- ``mean_per_class_recall`` and ``..._official``: CLIP_benchmark's ``balanced_accuracy_score(target,
  logits.argmax(1))``, the mean over the classes present of their top-1 recall; per-example values are the
  top-1 credits weighted by n / (classes present × images of the class), whose mean it is.
- ``top5`` is not reported with fewer than 5 classes (CLIP_benchmark reports NaN there).
- ``skipped_rows``: files under class folders that are not images, or in a folder that names no class.

CLIP_benchmark's webdataset suite (``negft/probes/clip_benchmark_wds.py``: a manifest with ``layout:
clip_benchmark_wds`` stands for every such dataset folder under its root) is scored here too, as ``clip_benchmark
eval`` scores it (``metrics/zeroshot_classification.py``, ``metrics/zeroshot_retrieval.py``):

- a classification dataset: the metrics above (``top1_official`` is its ``acc1``, ``top5_official`` its ``acc5``,
  ``mean_per_class_recall_official`` its ``mean_per_class_recall``). A label outside the class names is a miss
  in each ``_official`` metric and a class of its own in the mean per-class recall (``balanced_accuracy_score``
  counts every label present), as CLIP_benchmark counts it; negft's metrics leave such samples out (``skipped``).
- a retrieval dataset (``zeroshot_retrieval/<dataset>/<metric>``): ``r<k>`` text→image and ``i2t_r<k>``
  image→text recall at k = 1, 5, 10 (negft's rule: ties at their expected rank; ``i2t_r<k>`` leaves out images
  with no caption); ``r<k>_official`` is its ``image_retrieval_recall@k``, ``i2t_r<k>_official`` its
  ``text_retrieval_recall@k``: a hit when ``torch.topk`` of ``texts @ images.T`` (its transpose) returns a
  positive, an image with no caption a miss (0 / 0 positives is nan, not > 0). Where k exceeds the gallery,
  CLIP_benchmark's ``topk`` fails; here every entry is within the top k.
"""
from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from negft.probes import clip_benchmark_wds as wds
from negft.probes import register
from negft.probes.base import EvalContext, Dataset, ProbeResult, missing
from negft.probes.imagenet_wnids import WNIDS
from negft.probes.released import count_skips, manifest, report_skips
from negft.probes.stats import recall_at_k
from negft.probes.video import IMAGE_EXTENSIONS
from negft.probes.similarity import score_matrix
from negft.text import with_article

# the world's prompts, which probe_b's class ranking and bench/ scripts use too (class_prompts); the zeroshot
# probe reads the world's from its folder set, where the world writes these same prompts
TEMPLATES = ("a photo of {}.", "a picture of {}.", "a drawing of {}.", "an image showing {}.",
             "{} in the scene.")
CLASSNAMES_FILE = "classnames.txt"
TEMPLATES_FILE = "zeroshot_classification_templates.txt"
WORLD_FOLDER = "zeroshot"
KS = (1, 5)
RETRIEVAL_KS = (1, 5, 10)
_WNID_INDEX = {w: i for i, w in enumerate(WNIDS)}


def class_names(where) -> list[str] | None:
    """Class names for probes that ask by folder (geometry, probe_b) or by dataset: ``classes.json`` (a JSON
    list, as the world writes it); else a folder set's names (``classnames.txt``; ImageNet's for ``val/<wnid>/``); a
    ``Dataset`` also gets its manifest's ``zeroshot`` set."""
    if isinstance(where, Dataset):
        spec = folder_spec(where)
        if spec["manifest"]:
            names, _ = _classes(spec, _folders(spec["images"]))
            return names
        where = where.root
    root = Path(where)
    if (root / "classes.json").exists():
        return json.loads((root / "classes.json").read_text())
    if (root / CLASSNAMES_FILE).exists():
        return _lines(root / CLASSNAMES_FILE)
    folders = _folders(root / "val")
    if folders and all(f in _WNID_INDEX for f in folders):
        return _imagenet_names()
    return None


def class_prompts(classes: list[str]) -> list[str]:
    """The world's prompts for ``classes`` (``TEMPLATES`` with an article), class by class."""
    return [t.format(with_article(c)) for c in classes for t in TEMPLATES]


def class_features(ctx: EvalContext, classes: list[str]) -> torch.Tensor:
    """(classes, D) text features of the world's prompts: each class's ensemble, averaged and renormalised."""
    return ensemble(ctx, class_prompts(classes), len(classes))


def ensemble(ctx: EvalContext, prompts: list[str], n_classes: int) -> torch.Tensor:
    """open_clip's ``build_zero_shot_classifier`` on cached features: ``prompts`` class by class, each class's
    normalised prompt features averaged and the mean normalised."""
    return F.normalize(ctx.encode_texts(prompts).view(n_classes, len(prompts) // n_classes, -1).mean(1), dim=-1)


# ------------------------------------------------------------------ folder sets
def _lines(path: Path) -> list[str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def _imagenet_names() -> list[str]:
    import open_clip
    return list(open_clip.IMAGENET_CLASSNAMES)


def _named_templates(name: str) -> list[str]:
    import open_clip
    table = {"openai": open_clip.OPENAI_IMAGENET_TEMPLATES, "simple": open_clip.SIMPLE_IMAGENET_TEMPLATES}[name]
    return [t("{c}") for t in table]            # open_clip's templates are callables of the class name


def folder_spec(dataset: Dataset) -> dict:
    """The set's description: the manifest's ``zeroshot`` section, or the world's ``zeroshot/`` folder."""
    man = manifest(dataset)
    section = man.get("zeroshot") or {}
    base = dataset.root if man else dataset.root / WORLD_FOLDER
    return {"manifest": bool(man), "base": base, "images": base / str(section.get("images") or "."),
            "classes": section.get("classes"), "templates": section.get("templates"),
            "labels": section.get("labels")}


def _folders(images: Path) -> list[str]:
    if not images.is_dir():
        return []
    return sorted(e.name for e in os.scandir(images) if e.is_dir())


def _classes(spec: dict, folders: list[str]) -> tuple[list[str] | None, str]:
    """(class names, "") or (None, why)."""
    chosen = spec["classes"]
    if chosen == "imagenet":
        return _imagenet_names(), ""
    if chosen:
        path = spec["base"] / str(chosen)
        return (_lines(path), "") if path.exists() else (None, str(path))
    if (spec["base"] / CLASSNAMES_FILE).exists():
        return _lines(spec["base"] / CLASSNAMES_FILE), ""
    if folders and all(f in _WNID_INDEX for f in folders):
        return _imagenet_names(), ""
    return (list(folders), "") if folders else (None, "")


def _templates(spec: dict) -> tuple[list[str] | None, str]:
    chosen = spec["templates"]
    if chosen in ("openai", "simple"):
        return _named_templates(chosen), ""
    path = spec["base"] / str(chosen) if chosen else spec["base"] / TEMPLATES_FILE
    if path.exists():
        templates = [t for t in _lines(path) if t]
        bad = [t for t in templates if "{c}" not in t]
        if not templates or bad:
            return None, f"{path}: every template must hold {{c}} (bad: {bad[:3]})"
        return templates, ""
    return (None, f"data not found: {path}") if chosen else (_named_templates("openai"), "")


_LISTINGS: dict[tuple, tuple] = {}


def _listing(images: Path, folders: list[str]) -> tuple:
    """((folder, relative path) of every file under the class folders, sorted), cached while no class folder
    changes (its modification time)."""
    key = (str(images), tuple((f, os.stat(images / f).st_mtime_ns) for f in folders))
    if key not in _LISTINGS:
        for old in [k for k in _LISTINGS if k[0] == key[0]]:
            del _LISTINGS[old]
        files = []
        for folder in folders:
            for dirpath, dirnames, filenames in os.walk(images / folder, followlinks=True):
                dirnames.sort()
                files += [(folder, os.path.join(dirpath, f)) for f in sorted(filenames)]
        _LISTINGS[key] = tuple(files)
    return _LISTINGS[key]


def load(dataset: Dataset) -> dict:
    """{why, images, classes, prompts, paths, labels, skipped (reason -> count), total} of the dataset's set."""
    spec = folder_spec(dataset)
    out = {"why": "", "images": spec["images"], "classes": None, "prompts": [], "paths": [], "labels": [],
           "skipped": Counter(), "total": 0}
    folders = _folders(spec["images"])
    if not folders:
        out["why"] = missing(dataset, spec["images"]) + ("" if not spec["images"].is_dir() else
                                                         " (no class folder in it)")
        return out
    classes, why = _classes(spec, folders)
    templates, twhy = _templates(spec)
    if classes is None or templates is None:
        out["why"] = twhy or missing(dataset, why)
        return out
    rule = spec["labels"]
    if rule is None:
        if len(classes) == len(WNIDS) and all(f in _WNID_INDEX for f in folders):
            rule = "wnid"
        elif all(f.isdigit() for f in folders):
            rule = "index"
        else:
            rule = "sorted"
    if rule == "sorted" and len(folders) != len(classes):
        out["why"] = f"{spec['images']}: {len(folders)} class folders but {len(classes)} class names"
        return out
    if rule == "wnid":
        label_of = {f: _WNID_INDEX.get(f) for f in folders}
    elif rule == "index":
        label_of = {f: int(f) if f.isdigit() and int(f) < len(classes) else None for f in folders}
    else:
        label_of = {f: i for i, f in enumerate(folders)}
    for folder, path in _listing(spec["images"], folders):
        label = label_of[folder]
        if os.path.splitext(path)[1].lower() not in IMAGE_EXTENSIONS:
            out["skipped"]["not an image file"] += 1
        elif label is None or label >= len(classes):
            out["skipped"][f"folder names no class ({rule})"] += 1
        else:
            out["paths"].append(path)
            out["labels"].append(label)
    out["total"] = len(out["paths"]) + sum(out["skipped"].values())
    out["classes"] = classes
    out["prompts"] = [t.replace("{c}", c) for c in classes for t in templates]
    return out


def _is_wds(dataset: Dataset) -> bool:
    return manifest(dataset).get("layout") == wds.LAYOUT


def _split(dataset: Dataset) -> str:
    return str(manifest(dataset).get("split") or "test")


def _texts(dataset: Dataset) -> list[str]:
    return wds.texts(dataset, _split(dataset)) if _is_wds(dataset) else load(dataset)["prompts"]


def ranks_official(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's rank of its label when ties go to the lower index (0: the argmax)."""
    target = scores.gather(1, labels.view(-1, 1))
    before = torch.arange(scores.shape[1]).view(1, -1) < labels.view(-1, 1)
    return (scores > target).sum(1, dtype=torch.int32) + ((scores == target) & before).sum(1, dtype=torch.int32)


def per_class_weights(labels: torch.Tensor) -> torch.Tensor:
    """n / (classes present × images of the example's class): the weights whose weighted mean of per-example
    top-1 hits is the mean per-class recall."""
    counts = torch.bincount(labels)
    present = int((counts > 0).sum())
    return len(labels) / (present * counts[labels].double())


def official_class_weights(labels: torch.Tensor) -> torch.Tensor:
    """``per_class_weights`` over any integer labels, those outside the classes included (each its own class)."""
    _, inverse, counts = torch.unique(labels, return_inverse=True, return_counts=True)
    return len(labels) / (len(counts) * counts[inverse].double())


def _classify_wds(ctx: EvalContext, data: dict, prefix: str, result: ProbeResult) -> None:
    """CLIP_benchmark's classification numbers (``_official``) and negft's, on a webdataset dataset."""
    classes = data["classes"]
    labels = torch.tensor(data["labels"], dtype=torch.long)
    inside = (labels >= 0) & (labels < len(classes))
    if not inside.all():
        n = int((~inside).sum())
        result.skipped[f"{prefix}/labels"] = (
            f"{n} of {len(labels)} samples in {data['where']} have a label outside the {len(classes)} class names: "
            "left out of negft's metrics; misses (and classes of their own in the mean per-class recall) in the "
            "_official ones, as CLIP_benchmark counts them")
        count_skips(result, prefix, n + sum(data["skipped"].values()))
    text = ensemble(ctx, data["prompts"], len(classes))
    scores = score_matrix(ctx.encode_images(data["images"]), text)
    rank = torch.full((len(labels),), len(classes), dtype=torch.int32)
    rank[inside] = ranks_official(scores[inside], labels[inside])
    hits = recall_at_k(scores[inside], labels[inside], KS)
    weights = per_class_weights(labels[inside]) if inside.any() else torch.zeros(0, dtype=torch.double)
    _add_classification(ctx, result, prefix, hits, rank, len(classes), (weights, official_class_weights(labels)))


def _add_classification(ctx: EvalContext, result: ProbeResult, prefix: str, hits: dict, rank: torch.Tensor,
                        n_classes: int, weights: tuple) -> None:
    """top<k> and mean_per_class_recall, negft's from ``hits`` and the ``_official`` ones from CLIP_benchmark's
    ranks, each recall with its per-class weights (negft's, the reference's)."""
    for k in KS:
        if k <= n_classes:
            result.add_rules(f"{prefix}/top{k}", (hits[k], (rank < k).double()), ctx.n_boot)
    result.add_rules(f"{prefix}/mean_per_class_recall",
                     (hits[1].double() * weights[0], (rank < 1).double() * weights[1]), ctx.n_boot)


def _retrieve_wds(ctx: EvalContext, data: dict, prefix: str, result: ProbeResult) -> None:
    """CLIP_benchmark's retrieval numbers (``_official``) and negft's, on a webdataset dataset."""
    from negft.probes.retrieval import topk_hits
    from negft.probes.stats import recall_any_at_k
    queries = [c for cs in data["captions"] for c in cs]
    targets = torch.tensor([i for i, cs in enumerate(data["captions"]) for _ in cs], dtype=torch.long)
    if not queries:
        result.skipped[prefix] = f"no caption in {data['where']}"
        return
    images, texts = ctx.encode_images(data["images"]), ctx.encode_texts(queries)
    scores = texts.float() @ images.float().T         # CLIP_benchmark's texts_emb @ images_emb.t()
    exact = score_matrix(texts, images)
    n = len(data["images"])
    official = topk_hits(scores, lambda q, top: top == targets[q], RETRIEVAL_KS, ctx.device, ctx.batch_size)
    i2t_official = topk_hits(scores.T, lambda i, top: targets[top] == i, RETRIEVAL_KS, ctx.device, ctx.batch_size)
    captioned = torch.zeros(n, dtype=torch.bool)
    captioned[targets] = True
    positives = torch.zeros(n, len(queries), dtype=torch.bool)
    positives[targets, torch.arange(len(queries))] = True
    hits = recall_at_k(exact, targets, RETRIEVAL_KS)
    i2t = recall_any_at_k(exact.T[captioned], positives[captioned], RETRIEVAL_KS)
    if not captioned.all():
        result.skipped[f"{prefix}/i2t"] = (
            f"{int((~captioned).sum())} of {n} images in {data['where']} have no caption (an empty txt): in the "
            "gallery for both directions; left out of i2t_r<k>, misses in i2t_r<k>_official as CLIP_benchmark "
            "counts them")
    for k in RETRIEVAL_KS:
        result.add(f"{prefix}/r{k}", hits[k], ctx.n_boot)
        result.add(f"{prefix}/i2t_r{k}", i2t[k], ctx.n_boot)
        result.add(f"{prefix}/r{k}_official", official[k], ctx.n_boot)
        result.add(f"{prefix}/i2t_r{k}_official", i2t_official[k], ctx.n_boot)


def _run_wds(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    data = wds.load(dataset, _split(dataset))
    family = "zeroshot" if data["kind"] == "classification" else "zeroshot_retrieval"
    prefix = f"{family}/{dataset.name}"
    if data["why"]:
        result.skipped[f"zeroshot/{dataset.name}"] = data["why"]
        return result
    report_skips(result, prefix, data["where"], data["skipped"], data["total"])
    if not data["images"]:
        result.skipped[prefix] = f"no sample to score in {data['where']}"
        return result
    (_classify_wds if family == "zeroshot" else _retrieve_wds)(ctx, data, prefix, result)
    return result


@register("zeroshot", texts=_texts, version=3, metrics={
    "zeroshot": ("top1", "top5", "mean_per_class_recall"), "zeroshot_retrieval": ("r<k>", "i2t_r<k>")})
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    if _is_wds(dataset):
        return _run_wds(ctx, dataset)
    result = ProbeResult()
    prefix = f"zeroshot/{dataset.name}"
    data = load(dataset)
    if data["why"]:
        result.skipped[prefix] = data["why"]
        return result
    report_skips(result, prefix, data["images"], data["skipped"], data["total"])
    if not data["paths"]:
        result.skipped[prefix] = f"no image to score in {data['images']}"
        return result
    classes = data["classes"]
    text = ensemble(ctx, data["prompts"], len(classes))
    images = ctx.encode_images(data["paths"])
    labels = torch.tensor(data["labels"])
    scores = score_matrix(images, text)
    hits = recall_at_k(scores, labels, KS)
    rank = ranks_official(scores, labels)
    weights = per_class_weights(labels)
    _add_classification(ctx, result, prefix, hits, rank, len(classes), (weights, weights))
    images_dir = str(data["images"])
    result.records[prefix] = [{"filepath": os.path.relpath(p, images_dir), "label": int(y), "class": classes[y],
                               "credit": float(c), "top5": float(h5)}
                              for p, y, c, h5 in zip(data["paths"], data["labels"], hits[1], hits[5])]
    return result
