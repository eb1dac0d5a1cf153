"""World RelComp images as CE-CLIP's generated COCO training data: a small example of the files the converter
``negft.convert.ceclip_coco`` reads (its docstring gives the layout and where it was taken from), written on demand
for tests (not a format of the world build: not in ``FORMATS``).

    <out>/generated_data/coco_train/processed_dataset<i>.npy    np.save of a list of dicts, as data/dataset.py saves
    <out>/train2014/COCO_train2014_<image_id:012d>.jpg           the images (IMG_DATA_DIR = <out>)

A row is a COCO caption annotation (``image_id``, ``id``, ``caption``: the world image's RelComp caption) with its
four hard captions: ``relation_aug_caption`` the world's exchange of subject and object, ``adj_aug_caption`` its
attribute swap, ``noun_aug_caption`` the caption's first shape named as another, ``verb_aug_caption`` its predicate
swap; ``valid_caption`` as dataset.py computes it. ``bad`` plants ``PLANTED``'s rows, which the converter skips, and
``LEFT_OUT``'s hard captions, which it leaves out of rows it keeps.
"""
from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
from PIL import Image

from negft.convert.ceclip_coco import (BAD_IMAGE_ID, EMPTY_CAPTION, HARD_KEYS, LEFT_BLANK, LEFT_PLACEHOLDER,
                                       LEFT_REASONS, LEFT_SAME, MALFORMED_HARD_CAPTION, MISSING_FILE, NO_HARD_CAPTION,
                                       NOT_A_RECORD, PLACEHOLDER, image_path)
from negft.data.schema import RELCOMP
from negft.world import generator as world
from negft.world.render import SHAPES

FOLDER = "generated_data/coco_train"
FILES = 2               # the rows split over processed_dataset0.npy and processed_dataset1.npy
# the world's relcomp kind each hard caption is made from (the noun swap is made here)
WORLD_KIND = {"relation": "exchange", "adjective": "attribute", "verb": "predicate"}
# planted rows (``bad``): row -> what the converter skips it for
PLANTED = {1: MISSING_FILE, 2: EMPTY_CAPTION, 3: BAD_IMAGE_ID, 4: MALFORMED_HARD_CAPTION, 5: NO_HARD_CAPTION,
           6: NOT_A_RECORD}
# ... and hard captions of kept rows the converter leaves out: row -> (type, why)
LEFT_OUT = {0: ("relation", LEFT_PLACEHOLDER), 7: ("noun", LEFT_PLACEHOLDER), 8: ("adjective", LEFT_BLANK),
            9: ("verb", LEFT_SAME)}


def noun_swap(caption: str) -> str:
    """The caption with its first shape named as the next shape it does not name."""
    named = [s for s in SHAPES if re.search(rf"\b{s}\b", caption)]
    first = min(named, key=lambda s: re.search(rf"\b{s}\b", caption).start())
    other = next(s for s in SHAPES[SHAPES.index(first) + 1:] + SHAPES if s not in named)
    return re.sub(rf"\b{first}\b", other, caption, count=1)


def row(i: int, rec: dict) -> dict:
    """Row ``i`` as dataset.py writes it: the annotation's keys, then the hard captions, then the mask."""
    relcomp = rec[RELCOMP]
    by_kind = {n["kind"]: n["text"] for n in relcomp["negatives"]}
    out = {"image_id": 100 + 3 * i, "id": 1000 + i, "caption": relcomp["caption"]}
    for kind, key in HARD_KEYS.items():
        out[key] = noun_swap(relcomp["caption"]) if kind == "noun" else by_kind[WORLD_KIND[kind]]
    return out


def _plant(rows: list) -> None:
    """The rows of ``PLANTED`` and the hard captions of ``LEFT_OUT`` (the missing image: see ``write``)."""
    for i, (kind, why) in LEFT_OUT.items():
        rows[i][HARD_KEYS[kind]] = {LEFT_PLACEHOLDER: PLACEHOLDER, LEFT_BLANK: " ", LEFT_SAME: rows[i]["caption"]}[why]
    rows[2]["caption"] = ""
    rows[3]["image_id"] = str(rows[3]["image_id"])
    del rows[4][HARD_KEYS["noun"]]
    rows[5].update({HARD_KEYS["relation"]: PLACEHOLDER,
                    **{HARD_KEYS[k]: rows[5]["caption"] for k in ("adjective", "noun", "verb")}})
    rows[6] = rows[6]["caption"]                  # a bare caption


def valid_caption(r: dict) -> list[int]:
    """dataset.py's mask: over the row's keys holding "caption", in order, 0 where the text is ###."""
    return [int(v != PLACEHOLDER) for k, v in r.items() if "caption" in k]


def write(out_dir, n: int, seed: int = 0, bad: bool = True) -> dict:
    """``n`` world RelComp images (n > 9 with ``bad``) under ``out_dir`` in the layout above, the rows split over
    ``FILES`` files. Returns the paths (``npy``: the folder, ``images``), the rows as written per file, and what the
    converter should count (``samples``, ``skipped`` and ``left_out`` by why and type)."""
    out_dir = Path(out_dir)
    folder = out_dir / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    (out_dir / "train2014").mkdir(exist_ok=True)
    rows = []
    for i in range(n):
        png, rec, _ = world.train_sample("relcomp", seed, i, held_out=set())
        rows.append(row(i, rec))
        if not (bad and PLANTED.get(i) == MISSING_FILE):
            Image.open(io.BytesIO(png)).convert("RGB").save(image_path(out_dir, rows[-1]["image_id"]), format="JPEG",
                                                             quality=90)
    if bad:
        _plant(rows)
    for r in rows:
        if isinstance(r, dict):
            r["valid_caption"] = valid_caption(r)
    files = {}
    for k, part in enumerate(np.array_split(np.arange(n), FILES)):
        files[f"processed_dataset{k}.npy"] = [rows[i] for i in part]
        with open(folder / f"processed_dataset{k}.npy", "wb") as f:
            np.save(f, files[f"processed_dataset{k}.npy"])
    planted, left_out = (PLANTED, LEFT_OUT) if bad else ({}, {})
    skipped, left = {}, {why: {} for why in LEFT_REASONS}
    for reason in planted.values():
        skipped[reason] = skipped.get(reason, 0) + 1
    for kind, why in left_out.values():
        left[why][kind] = left[why].get(kind, 0) + 1
    return {"npy": str(folder), "images": str(out_dir), "files": files, "samples": n - len(planted),
            "skipped": skipped, "left_out": left}
