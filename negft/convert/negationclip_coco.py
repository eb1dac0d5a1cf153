"""NegationCLIP's negation-rewritten COCO captions → NegCap shards (the ``negationclip`` recipe's data).

    negft data convert negationclip-coco CAPTIONS IMAGES out=DIR [val_split=0.2]

reads the release as it is: ``CAPTIONS`` is ``annotations/negationclip_captions_train2014.json`` of
parkquasar/NegationCLIP, ``IMAGES`` COCO's ``train2014/`` folder.

Layout (``LAYOUT_SOURCE``; the JSON itself is not in the repository snapshot read, so its layout is the writer's and
the loader's): a COCO captions file, ``{info, licenses, images, annotations}``, written by
``src/data_generation.py`` from ``captions_train2014.json``: ``images`` is COCO's list unchanged ([{id,
file_name, ...}], every train2014 image, also those left without a rewritten caption); ``annotations`` holds only
the COCO caption annotations whose rewrite was kept (LLaVA said the added object is absent), each COCO's
``{image_id, id, caption}`` plus ``updated_caption`` (LLaMA 3's rewrite stating that absence). The loader
(``src/clip_finetune.py`` ``COCOCaptionDataset``) maps ``images[j].id`` to ``file_name`` (a later duplicate id
wins, as its dict does), reads ``annotations[i].image_id / caption / updated_caption`` and opens
``IMAGES/<file_name>``; it trains on ``updated_caption`` alone.

One sample per annotation, in file order, keyed ``<file_name stem>_<row>`` (``row``: the annotation's index in
the file):

    caption      the original COCO caption
    negcap       [updated_caption]: the stream's training text
    image_id     COCO's image id
    annotation   {row, id}: the annotation's index in the file and its COCO caption id (null when absent)

Captions have their whitespace collapsed (CLIP's tokenizer does the same); nothing else is changed. Image bytes
are copied unchanged.

The reference's validation rows are left out by default: ``clip_finetune.py`` seeds numpy's global generator
with 42, shuffles ``list(range(len(annotations)))`` with ``np.random.shuffle`` and validates on the first
``floor(0.2 * n)`` indices, training on the rest; ``val_split=0.2`` leaves out exactly those rows (numpy's legacy
generator draws the same stream in every numpy version), counted in ``manifest.json``'s ``validation_rows``, not
as skips. ``val_split=0`` converts every row.

Skipped and counted in ``manifest.json``: an annotation whose ``image_id`` is not in ``images``, one with an
empty or missing caption or ``updated_caption``, an image file that is missing, unreadable or not jpg/png.

``negft.world.formats.negationclip_coco.write_negationclip_example`` writes a small release in exactly this layout
with world images, bad rows planted.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from negft.convert.coco import BAD_TYPE, EMPTY_CAPTION, MISSING_FILE, UNKNOWN_CAPTION_IMAGE, UNREADABLE, \
    clean_caption, read_bytes
from negft.data.schema import CAPTION, NEGCAP
from negft.data.shards import IMAGE_EXTS, ShardWriter, truthy

LAYOUT_SOURCE = ("parkquasar/NegationCLIP @ 6f858ee: src/clip_finetune.py (COCOCaptionDataset: coco_data"
                 "['annotations'][i] image_id, caption, updated_caption; {img['id']: img['file_name'] for img in "
                 "coco_data['images']}; image_dir / file_name; main: np.random.seed(42), np.random.shuffle("
                 "list(range(n))), the first floor(0.2 n) for validation), src/data_generation.py (the JSON: "
                 "captions_train2014.json's info, licenses, images, and its annotations whose rewrite was kept, "
                 "each with updated_caption added), README.md (annotations/negationclip_captions_train2014.json; "
                 "--image_dir train2014)")
RANDOM_SEED = 42            # clip_finetune.py RANDOM_SEED and VALIDATION_SPLIT
VALIDATION_SPLIT = 0.2

# skip reasons (manifest.json's "skipped"); the rest are negft.convert.coco's
EMPTY_REWRITE = "empty or missing updated_caption"


def load_release(path) -> dict:
    """The release's JSON; ValueError unless it is a COCO captions file (its ``images`` and ``annotations``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"NegationCLIP captions file {path} not found")
    with open(path) as f:
        data = json.load(f)
    if (not isinstance(data, dict) or not isinstance(data.get("annotations"), list)
            or not isinstance(data.get("images"), list)):
        raise ValueError(f"{path} is not a COCO captions file (a dict with 'images' and 'annotations' lists)")
    return data


def validation_rows(n: int, fraction: float) -> set[int]:
    """The annotation rows ``clip_finetune.py`` validates on for a file of ``n`` annotations: the first
    ``floor(fraction * n)`` of ``list(range(n))`` shuffled by numpy's generator seeded with 42."""
    indices = list(range(n))
    np.random.RandomState(RANDOM_SEED).shuffle(indices)
    return set(indices[:math.floor(fraction * n)])


def _file_names(images: list) -> dict:
    """image id -> file name, as the loader's dict builds it (a later duplicate id wins)."""
    return {img["id"]: img["file_name"] for img in images
            if isinstance(img, dict) and "id" in img and isinstance(img.get("file_name"), str)}


def _sample(row: int, ann, names: dict, root: Path, skip):
    """(key, image path, member extension, json) of annotation ``row``, or None after ``skip``."""
    ann = ann if isinstance(ann, dict) else {}
    what = f"annotation {row} (id {ann.get('id')}, image_id {ann.get('image_id')})"
    name = names.get(ann.get("image_id"))
    if name is None:
        return skip(UNKNOWN_CAPTION_IMAGE, what)
    caption, rewrite = clean_caption(ann.get("caption")), clean_caption(ann.get("updated_caption"))
    if not caption:
        return skip(EMPTY_CAPTION, what)
    if not rewrite:
        return skip(EMPTY_REWRITE, what)
    ext = IMAGE_EXTS.get(os.path.splitext(name)[1].lower())
    if ext is None:
        return skip(BAD_TYPE, f"{what}: {name}")
    path = root / name
    if not path.is_file():
        return skip(MISSING_FILE, f"{what}: {path}")
    meta = {CAPTION: caption, NEGCAP: [rewrite], "image_id": ann["image_id"],
            "annotation": {"row": row, "id": ann.get("id")}}
    return f"{os.path.splitext(name)[0]}_{row}", path, ext, meta


def convert(captions, images, out, val_split=str(VALIDATION_SPLIT), maxcount="1000", progress="true") -> dict:
    """NegationCLIP's captions JSON + COCO train2014 → ``out/shard-*.tar`` + ``manifest.json``; ``val_split``:
    the fraction of rows the reference validates on, left out (0: every row); see the module docstring."""
    fraction = float(val_split)
    if not 0 <= fraction < 1:
        raise ValueError(f"val_split={val_split}: a fraction in [0, 1)")
    data = load_release(captions)                   # fail before out/ is made
    root = Path(images)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} not found")
    inputs = {"captions": str(captions), "images": str(images)}
    with ShardWriter(out, "negationclip-coco", LAYOUT_SOURCE, inputs, maxcount=int(maxcount),
                     progress=truthy(progress)) as writer:
        names, annotations = _file_names(data["images"]), data["annotations"]
        left_out = validation_rows(len(annotations), fraction)
        for row, ann in enumerate(annotations):
            if row in left_out:
                continue
            sample = _sample(row, ann, names, root, writer.skip)
            if sample is None:
                continue
            key, path, ext, meta = sample
            image = read_bytes(path)
            if image is None:
                writer.skip(UNREADABLE, str(path))
                continue
            writer.add(key, image, ext, meta)
        writer.notes.update(images_listed=len(names), annotations=len(annotations),
                            validation_rows=len(left_out), val_split=fraction,
                            split_policy=f"the rows clip_finetune.py trains on: numpy seed {RANDOM_SEED}, the first "
                                         f"floor({fraction} n) shuffled rows left out for its validation")
        manifest = writer.close()
    return {**manifest, "out": str(out)}
