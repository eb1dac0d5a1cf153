"""VL-CheckList (Zhao et al., 2022, "VL-CheckList: Evaluating Pre-trained Vision-Language Models with Objects,
Attributes and Relations"): an image with a true phrase and a phrase that changes one object, attribute or
relation; the true one should score higher. Thirteen categories, each drawn from several source corpora.

Released layout (om-ai-lab/VL-CheckList @ 6f8d6a3: ``corpus/v1/<type>/<corpus>.yaml`` names each file's
``ANNO_PATH`` and ``IMG_ROOT``, ``vl_checklist/data_loader.py`` reads them, ``DATASETS.md`` lays out the images):
one folder (the reference's working directory) holding

- ``data/...json`` as in the repository (``data/Attribute/vg/color.json``,
  ``data/Object/Location/swig_location/swig_agent/swig_agent_center.json``, ``data/Relation/vg/spatial.json``,
  ...; ``FILES`` lists the 56 of ``corpus/v1``): a JSON list of ``[image path, {"POS": [phrases], "NEG":
  [phrases]}]``;
- the image folders each file's ``IMG_ROOT`` names, the image path joined to it: ``vg/`` (``VG_100K/``,
  ``VG_100K_2/``; the VAW files read Visual Genome's images too), ``hake/`` and ``swig/``.

Metrics (``vl_checklist/<dataset>/<metric>``), with s(t) the cosine similarity of the image and phrase t, the
first POS phrase against the first NEG phrase as the reference compares them:

- ``<type>_<corpus>`` (negft), e.g. ``attribute_color_vg``, ``object_location_center_swig_agent``: per row 1 when
  s(POS) > s(NEG), 1/2 on an exact tie, 0 otherwise, over every row of the file; ``<type>`` (``attribute_color``,
  ``object_size_small``, ``relation_spatial``, ...: the thirteen categories FSC-CLIP's tables report) the
  unweighted mean of its files' numbers, ``attribute`` / ``object`` / ``relation`` the unweighted mean of their
  categories', ``avg`` of the three (means over the files present; per-example values reweighted so the interval
  resamples rows).
- ``..._official``: the ITC evaluation CE-CLIP's README points to (rabiulcste/vl_checklist @ ca0c68d
  ``vl_checklist/evaluate.py`` with ``example_models/open_clip/engine.py`` and ``configs/our_clip_*.yaml``): per
  file, the first ``OFFICIAL_ROWS`` rows whose image exists (``MAX_NUM: 2000``, halved for ITC), correct when
  s(POS) > s(NEG) strictly (a tie is wrong), ``total_acc`` the share correct; the category and group means are
  negft's averages of those per-file numbers (the reference writes one number per file). om-ai-lab's own CLIP
  example cannot run ITC (its ``predict`` takes a model id first and returns one probability per image).
- ``skipped_rows`` (only when rows were skipped; a count, not a per-example metric): rows left out (not a pair
  ``[image path, {POS, NEG}]``; POS or NEG not a non-empty list of strings, on which the reference stops; the image
  file not found, which the reference also drops, silently), counted by reason in ``skipped`` under
  ``<prefix>/<type>_<corpus>/rows``. An empty phrase is scored, as the reference's tokenizer scores it.

A file absent is skipped with its path, an unreadable one with the reason; the others run. The reference's
``Evaluate.start`` evaluates only the last type of a config (its loop calls ``eval`` once, after the loop); the
parity run called ``eval`` per type.
"""
from __future__ import annotations

import os
from collections import Counter
from functools import partial

import torch

from negft.probes import register
from negft.probes.base import DataNotFound, Dataset, EvalContext, ProbeResult, resolve
from negft.probes.released import file_rows, finish, parsed_rows, read_json
from negft.probes.similarity import option_scores
from negft.probes.stats import pair_credits

OFFICIAL_ROWS = 1000     # the reference's MAX_NUM (2000 in configs/our_clip_*.yaml), halved for ITC
SWIG_ROLES = ("agent", "destination", "item", "tool")


def _files() -> dict[tuple[str, str], tuple[str, str]]:
    """(type, corpus) -> (annotation file, image root), as corpus/v1/<type>/<corpus>.yaml name them."""
    out = {}
    for a in ("action", "color", "material", "size", "state"):
        for corpus in ("vaw", "vg"):
            out[f"Attribute/{a}", corpus] = (f"data/Attribute/{corpus}/{a}.json", "vg")
    for kind, values, folder in (("Location", ("center", "margin", "mid"), "location"),
                                 ("Size", ("large", "medium", "small"), "size")):
        for v in values:
            t = f"Object/{kind}/{v}"
            out[t, "hake"] = (f"data/Object/{kind}/hake_{folder}/hake_obj_{v}.json", "hake")
            for role in SWIG_ROLES:
                out[t, f"swig_{role}"] = (f"data/Object/{kind}/swig_{folder}/swig_{role}/swig_{role}_{v}.json", "swig")
            for o in ("obj", "subj"):
                out[t, f"vg_{o}"] = (f"data/Object/{kind}/vg_{folder}/vg_{o}_{v}.json", "vg")
    out["Relation/action", "hake"] = ("data/Relation/hake_action.json", "hake")
    out["Relation/action", "swig"] = ("data/Relation/swig_action.json", "swig")
    out["Relation/action", "vg"] = ("data/Relation/vg/action.json", "vg")
    out["Relation/spatial", "vg"] = ("data/Relation/vg/spatial.json", "vg")
    return out


FILES = _files()
TYPES = tuple(dict.fromkeys(t for t, _ in FILES))        # the thirteen categories


def metric_name(vl_type: str) -> str:
    return vl_type.lower().replace("/", "_")


def _phrases(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(t, str) for t in value)


def _row(row, root: str, image_root: str) -> tuple[dict | None, str | None]:
    if not (isinstance(row, list) and len(row) == 2 and isinstance(row[0], str) and isinstance(row[1], dict)):
        return None, "row is not [image path, {POS, NEG}]"
    if not (_phrases(row[1].get("POS")) and _phrases(row[1].get("NEG"))):
        return None, "POS or NEG is not a non-empty list of strings"
    image = resolve(os.path.join(root, image_root), row[0])
    if not os.path.isfile(image):
        return None, "image file not found (the reference drops it too)"
    return {"image": image, "image_path": row[0], "pos": row[1]["POS"][0], "neg": row[1]["NEG"][0]}, None


def _parse_file(path, file: str, image_root: str) -> list:
    """[(row,)] for a row that can be scored, (None, reason) for another, [("file", reason)] for a file that is
    not a JSON list; image paths under the dataset's root (the path less ``file``) and ``image_root``."""
    data, why = read_json(path, list)
    if data is None:
        return [("file", why)]
    root = os.fspath(path)[:-len(file)]
    return [(out,) if bad is None else (None, bad) for out, bad in (_row(r, root, image_root) for r in data)]


# one parser per file, made once: parse_once keys its cache by the function
PARSERS = {key: partial(_parse_file, file=file, image_root=image_root) for key, (file, image_root) in FILES.items()}


def read(dataset: Dataset, key: tuple[str, str]) -> tuple[list[dict], Counter, str | None]:
    file = FILES[key][0]
    rows, skipped, why = parsed_rows(dataset, dataset.root / file, PARSERS[key])
    return [r for r, in rows], skipped, why


def texts(dataset: Dataset) -> list[str]:
    return [t for key in FILES for r in read(dataset, key)[0] for t in (r["pos"], r["neg"])]


def _macro(parts: list[torch.Tensor], shares: list[float]) -> torch.Tensor:
    """Values whose mean is Σ share_i · mean(parts_i): each part's values reweighted by share · N / n_i."""
    n = sum(len(p) for p in parts)
    return torch.cat([p * (s * n / len(p)) for p, s in zip(parts, shares)])


def _averages(per_file: dict[tuple[str, str], torch.Tensor]) -> dict[str, tuple[list, list]]:
    """{metric: (parts, shares)} of the category, group and overall means over the files present."""
    by_type: dict[str, list] = {}
    for (t, _), values in per_file.items():
        by_type.setdefault(t, []).append(values)
    out = {metric_name(t): (parts, [1 / len(parts)] * len(parts)) for t, parts in by_type.items()}
    groups: dict[str, list] = {}
    for t, parts in by_type.items():
        groups.setdefault(t.split("/")[0].lower(), []).append(parts)
    overall_parts, overall_shares = [], []
    for g, types in groups.items():
        parts = [p for ps in types for p in ps]
        shares = [1 / (len(types) * len(ps)) for ps in types for _ in ps]
        out[g] = (parts, shares)
        overall_parts += parts
        overall_shares += [s / len(groups) for s in shares]
    out["avg"] = (overall_parts, overall_shares)
    return out


@register("vl_checklist", texts=texts, version=1, metrics=(
    "attribute_<x>", "object_<x>", "relation_<x>", "attribute", "object", "relation", "avg"))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    if not (dataset.root / "data").is_dir():
        raise DataNotFound(dataset, dataset.root / "data")
    result, prefix = ProbeResult(), f"vl_checklist/{dataset.name}"
    tie_aware, official, records, n_skipped = {}, {}, [], 0
    for key, (file, _) in FILES.items():
        name = f"{metric_name(key[0])}_{key[1]}"
        rows, n = file_rows(result, f"{prefix}/{name}", read(dataset, key), dataset.root / file)
        n_skipped += n
        if rows is None:
            continue
        images = ctx.encode_images([r["image"] for r in rows])
        phrases = ctx.encode_texts([t for r in rows for t in (r["pos"], r["neg"])]).view(len(rows), 2, -1)
        s = option_scores(images, phrases).double()
        tie_aware[key], strict = pair_credits(s[:, 0], s[:, 1])
        official[key] = strict[:OFFICIAL_ROWS]
        result.add_rules(f"{prefix}/{name}", (tie_aware[key], official[key]), ctx.n_boot)
        records += [{"file": file, "image_path": r["image_path"], "pos": r["pos"], "neg": r["neg"],
                     "scores": [round(float(v), 5) for v in row]} for r, row in zip(rows, s)]
    for suffix, per_file in (("", tie_aware), ("_official", official)):
        if per_file:
            for metric, (parts, shares) in _averages(per_file).items():
                result.add(f"{prefix}/{metric}{suffix}", _macro(parts, shares), ctx.n_boot)
    return finish(result, prefix, n_skipped, records)
