"""The world's probe images as ARO's files, in their released layout (mertyg/vision-language-models-are-bows
``dataset_zoo/aro_datasets.py``; see ``negft.probes.aro``), read by the ``aro`` and ``snare`` probes:

- ``visual_genome_relation.json``: a JSON list, one row per probe image with two or more objects and a relation
  between them: ``image_path`` (relative to ``<root>/images``, as ARO resolves it), ``bbox_x, bbox_y, bbox_w,
  bbox_h`` (the smallest box holding both objects, as ARO's boxes hold the pair: ARO and SNARE crop to it),
  ``relation_name`` (the world's predicate in VG's words: "to the left of", "to the right of", "above",
  "below"), ``true_caption`` "the {subject} is {relation} the {object}" and ``false_caption`` with the two
  objects exchanged ("the circle is above the ring" / "the ring is above the circle"). Objects are named by
  shape alone, as VG's rows name them by their noun: a world scene never holds two objects of one shape.
- ``visual_genome_attribution.json``: for the same pair where the two colours differ: ``attributes``
  [colour 1, colour 2], ``obj1_name``, ``obj2_name``, ``true_caption`` "the {colour 1} {shape 1} and the
  {colour 2} {shape 2}" and ``false_caption`` with the colours exchanged, and the same box.
- ``coco_karpathy_test.json`` and ``flickr30k_test.json`` (COCO-Order / Flickr30k-Order and SNARE's semantic
  structure): the Karpathy test layout ``[{"image": "images/000012.png", "caption": [...]}]`` with each probe
  image's held-out affirmative captions (``retrieval.csv``'s); even-numbered probe images go to the COCO file,
  odd-numbered ones to the Flickr30k file, so each reader has its own examples and none is scored twice.

Where the files sit: at the top of the split folder, at the same relative paths as under each manifest's root
(``$NEGFT_DATA/aro/visual_genome_relation.json``, ``$NEGFT_DATA/coco/coco_karpathy_test.json``, ...), so the
probes read both with one code path; the split's own ``images/`` folder is ARO's ``<root>/images``, and the
Karpathy files' ``image`` values are relative to the split folder as ARO resolves them against its COCO /
Flickr30k root. No image is copied. Randomness (which relation of a scene): ``formats.rng(seed,
split_dir, "aro")`` only.
"""
from __future__ import annotations

import json
from pathlib import Path

from negft import phrasings
from negft.world import formats

IMAGES = "images/"


def box(a: dict, b: dict) -> dict:
    """ARO's bbox keys for the smallest box holding objects ``a`` and ``b`` (world bboxes: [x0, y0, x1, y1])."""
    x0, y0 = min(a["bbox"][0], b["bbox"][0]), min(a["bbox"][1], b["bbox"][1])
    x1, y1 = max(a["bbox"][2], b["bbox"][2]), max(a["bbox"][3], b["bbox"][3])
    return {"bbox_x": x0, "bbox_y": y0, "bbox_w": x1 - x0, "bbox_h": y1 - y0}


def vg_rows(rec: dict, rng) -> tuple[dict | None, dict | None]:
    """(VG-Relation row, VG-Attribution row) of one probe record; None where the scene has no such pair."""
    objs, rels = rec["scene"]["objects"], rec["scene"]["relations"]
    if len(objs) < 2 or not rels:
        return None, None
    assert rec["image_path"].startswith(IMAGES), rec["image_path"]
    image_path = rec["image_path"][len(IMAGES):]
    i, pred, j = rels[int(rng.random() * len(rels))]
    x, y = objs[i], objs[j]
    rel = phrasings.PREDICATE_WORDS[pred]
    where = {"image_path": image_path, **box(x, y)}
    relation = {**where, "relation_name": rel, "true_caption": f"the {x['shape']} is {rel} the {y['shape']}",
                "false_caption": f"the {y['shape']} is {rel} the {x['shape']}"}
    if x["color"] == y["color"]:
        return relation, None
    a, b = x["color"], y["color"]
    attribution = {**where, "attributes": [a, b], "obj1_name": x["shape"], "obj2_name": y["shape"],
                   "true_caption": f"the {a} {x['shape']} and the {b} {y['shape']}",
                   "false_caption": f"the {b} {x['shape']} and the {a} {y['shape']}"}
    return relation, attribution


def _dump(path: Path, data) -> None:
    path.write_text(json.dumps(data) + "\n", encoding="utf-8")


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    split_dir = Path(split_dir)
    rng = formats.rng(seed, split_dir, "aro")
    relation, attribution = [], []
    for rec in main:
        r, a = vg_rows(rec, rng)
        if r is not None:
            relation.append(r)
        if a is not None:
            attribution.append(a)
    _dump(split_dir / "visual_genome_relation.json", relation)
    _dump(split_dir / "visual_genome_attribution.json", attribution)
    for name, part in (("coco_karpathy_test.json", 0), ("flickr30k_test.json", 1)):
        _dump(split_dir / name, [{"image": rec["image_path"], "caption": list(rec["retrieval"])}
                                 for k, rec in enumerate(main) if k % 2 == part])
