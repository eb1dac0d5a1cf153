"""The world's probe split in the Probe-R / Probe-C / Probe-B release's layout (negft.data.layout_rcb; repository
DeepLearningRobustnessStudies/UnderstandingVisualTextModels, ``core/eval_*_understanding.py`` and
``new_datasets/README.md``), written from the world's probe records so that the probes read only released files.

Images are the world's own PNGs, linked (relative symbolic links; copies where links are not possible) under
the names the release gives them: ``data/visual_genome/all_images/<id>.png`` and
``data/coco/.../COCO_val2014_<id, 12 digits>.png``. Ids: probe image ``n`` is ``n``, zero-shot (single-object)
image ``k`` is ``1_000_000 + k``, the second image of image n's Probe-C pair is ``2_000_000 + n``.

- Probe-R (``relation_eval_subject.json`` and ``relation_eval_object.json``, dicts keyed by the anchor image's id):
  per probe image with a relation, one relation ⟨x, r, y⟩ of its scene ("the x is r the y"), the predicate swapped
  for one that does not hold between x and y (``negative_predicate_prompt``), and the subject x (subject file) or
  the object y (object file) swapped for a shape absent from the scene (``negative_prompt``,
  ``negative_object``). ``positive_image_ids`` / ``negative_image_ids``: up to 10 single-object (zero-shot) images
  of the kept / the swapped-in shape, as the release gives 10 images of the subject alone. The relation, the
  predicate swap and the object swap are drawn exactly as negft's Probe-R drew them before it read released
  files (``numpy.random.default_rng(n)`` for image n, its own generator, not the world's), so those samples are
  unchanged; the subject swap and the image ids come from ``formats.rng``.
- Probe-C (``data_compositional_switch.json``, ``data_object_switch.json``): the world's Probe-C pairs (image
  n and its pair image, caption k true of image k only), split by kind.
- Probe-B: ``background_context_dataset.json`` (per image with Probe-B variants: its objects' annotations keyed
  by shape, COCO style), ``object_context_dataset.json`` (per such image with 2+ objects: the kept object and
  the others), ``prompt_classes.csv`` (one prompt per shape), and per filler the patched image, the
  background-removed image and the one-object image in the release's folders.
"""
from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import numpy as np

from negft.data import layout_rcb
from negft.world import formats
from negft import phrasings
from negft.world.render import SHAPES
from negft.text import with_article

ZS_ID, PAIR_ID = 1_000_000, 2_000_000
OBJECT_ONLY_IMAGES = 10             # the release's positive / negative images per Probe-R group
PREDICATES = tuple(phrasings.PREDICATE_WORDS)


def relation_prompt(x: str, pred: str, y: str) -> str:
    return f"the {x} is {phrasings.PREDICATE_WORDS[pred]} the {y}"


def _png(name: str) -> str:
    return os.path.splitext(name)[0] + ".png"


def _dump(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def write_probe_r(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    rng = formats.rng(seed, split_dir, "probe_r")
    zs_by_shape: dict[str, list[int]] = {}
    zs_path = {}
    for k, r in enumerate(zeroshot):
        zs_by_shape.setdefault(r["scene"]["objects"][0]["shape"], []).append(ZS_ID + k)
        zs_path[ZS_ID + k] = r["image_path"]

    def alone(shape: str) -> list[int]:
        have = zs_by_shape.get(shape, [])
        pick = rng.choice(len(have), min(OBJECT_ONLY_IMAGES, len(have)), replace=False) if have else []
        return [have[int(i)] for i in pick]

    files = {switch: {} for switch in layout_rcb.PROBE_R_SWITCHES}
    linked = {}
    for n, rec in enumerate(main):
        objs, rels = rec["scene"]["objects"], rec["scene"]["relations"]
        if not rels:
            continue
        old = np.random.default_rng(n)      # the draws negft's Probe-R made for image n (same samples)
        i, pred, j = rels[int(old.integers(len(rels)))]
        x, y = objs[i]["shape"], objs[j]["shape"]
        holds = {p for a, p, b in rels if (a, b) == (i, j)}
        wrong = [p for p in PREDICATES if p not in holds]
        absent = [s for s in SHAPES if s not in {o["shape"] for o in objs}]
        predicate_prompt = relation_prompt(x, wrong[int(old.integers(len(wrong)))], y)
        new_object = absent[int(old.integers(len(absent)))]
        new_subject = absent[int(rng.integers(len(absent)))]
        right = relation_prompt(x, pred, y)
        for switch, kept, swapped, negative in (
                ("subject", x, new_subject, relation_prompt(new_subject, pred, y)),
                ("object", y, new_object, relation_prompt(x, pred, new_object))):
            positives, negatives = alone(kept), alone(swapped)
            files[switch][str(n)] = {"positive_image_ids": positives, "negative_image_ids": negatives,
                                     "positive_prompt": right, "negative_prompt": negative,
                                     "negative_object": swapped, "positive_object": kept,
                                     "negative_predicate_prompt": predicate_prompt}
            linked.update({i_: zs_path[i_] for i_ in positives + negatives})
        linked[n] = rec["image_path"]
    for switch, data in files.items():
        _dump(split_dir / layout_rcb.probe_r_file(switch), data)
    for image_id, path in sorted(linked.items()):
        formats.link(split_dir, path, f"{layout_rcb.VG_IMAGES}/{_png(layout_rcb.vg_name(image_id))}")


def _words(caption: str) -> tuple[str, str]:
    """(attribute, object) of a Probe-C caption such as "a large star"."""
    attribute, obj = caption.split(" ", 1)[1].rsplit(" ", 1)
    return attribute, obj


def write_probe_c(split_dir: Path, main: list[dict]) -> None:
    pairs = {kind: [] for kind in layout_rcb.PROBE_C_FILES}
    for n, rec in enumerate(main):
        p = rec.get("probe_c")
        if not p:
            continue
        (c1, o1), (c2, o2) = _words(p["caption_0"]), _words(p["caption_1"])
        pairs[p["kind"]].append({"img1_prompt": p["caption_0"], "img1_id": str(n), "img1_composition": c1,
                                 "img1_object": o1, "img2_id": PAIR_ID + n, "img2_prompt": p["caption_1"],
                                 "img2_composition": c2, "img2_object": o2})
        formats.link(split_dir, rec["image_path"], f"{layout_rcb.COCO_IMAGES}/{_png(layout_rcb.coco_name(n))}")
        formats.link(split_dir, p["image_1"], f"{layout_rcb.COCO_IMAGES}/{_png(layout_rcb.coco_name(PAIR_ID + n))}")
    for kind, path in layout_rcb.PROBE_C_FILES.items():
        _dump(split_dir / path, pairs[kind])


def write_probe_b(split_dir: Path, main: list[dict]) -> None:
    (split_dir / layout_rcb.CONTEXT_DIR).mkdir(parents=True, exist_ok=True)
    with open(split_dir / layout_rcb.PROMPT_CLASSES, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["class", "prompt"])
        w.writerows([s, f"A photo of {with_article(s)}."] for s in SHAPES)
    background, cooccurrence = [], []
    for n, rec in enumerate(main):
        b = rec.get("probe_b")
        if not b:
            continue
        objs, images, name = rec["scene"]["objects"], b["images"], layout_rcb.coco_name(n)
        annotations = {}
        for k, o in enumerate(objs):
            x0, y0, x1, y1 = o["bbox"]
            annotations[o["shape"]] = [{"segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]],
                                        "area": float((x1 - x0) * (y1 - y0)), "iscrowd": 0, "image_id": n,
                                        "bbox": [x0, y0, x1 - x0, y1 - y0],
                                        "category_id": SHAPES.index(o["shape"]) + 1, "id": 10 * n + k}]
        background.append({"annotations": annotations, "image": name, "image_id": n})
        formats.link(split_dir, rec["image_path"], f"{layout_rcb.COCO_IMAGES}/{_png(name)}")
        kept = objs[b["kept"]]["shape"]
        for fill in layout_rcb.PROBE_B_FILLERS:
            formats.link(split_dir, images[f"{fill}_patch"], f"{layout_rcb.patch_dir(fill)}/{_png(name)}")
            formats.link(split_dir, images[f"{fill}_bg"], f"{layout_rcb.background_removed_dir(fill)}/{_png(name)}")
            if f"{fill}_one" in images:
                formats.link(split_dir, images[f"{fill}_one"],
                      f"{layout_rcb.one_object_dir(fill)}/{_png(layout_rcb.one_object_name(kept, n))}")
        if len(objs) > 1:
            cooccurrence.append({"image_id": n, "object": kept,
                                 "other_objects": [o["shape"] for o in objs if o["shape"] != kept],
                                 "path": layout_rcb.one_object_name(kept, n)})
    _dump(split_dir / layout_rcb.PROBE_B_MR_FILE, background)
    _dump(split_dir / layout_rcb.PROBE_B_R_FILE, cooccurrence)


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    write_probe_r(split_dir, main, zeroshot, seed)
    write_probe_c(split_dir, main)
    write_probe_b(split_dir, main)
