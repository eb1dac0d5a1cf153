"""World training images as COCO captions + instances and their image folder: a small example of the released
files the converter ``negft.convert.coco`` reads (``negft.convert.negate`` reads them too), written on demand for
tests and benches (not a format of the world build: not in ``FORMATS``).

Layout (cocodataset/cocoapi, PythonAPI/pycocotools/coco.py: ``COCO.createIndex`` and ``COCO.download``):
``annotations/captions_<split>.json`` and ``annotations/instances_<split>.json``, each a dict with ``info``,
``licenses``, ``images`` [{id, file_name, width, height, ...}] and ``annotations`` (captions [{id, image_id,
caption}], instances [{id, image_id, category_id, bbox [x, y, w, h], segmentation, area, iscrowd}] + the
instances file's ``categories`` [{id, name, supercategory}]); an image at ``<split>/<file_name>``.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from negft import phrasings
from negft.convert.coco import EMPTY_CAPTION, MISSING_FILE, NO_CAPTION, NO_LABELS, UNKNOWN_CAPTION_IMAGE, \
    UNKNOWN_INSTANCE_IMAGE
from negft.world import generator as world


def write_coco_example(out_dir, n: int, seed: int = 0, bad: bool = True, split: str = "train2017") -> dict:
    """``n`` world images in COCO's released layout under ``out_dir``:

        annotations/captions_<split>.json, annotations/instances_<split>.json, <split>/<id:012d>.jpg

    Category names are the world's shape names (ids spread with gaps, as COCO's are); each image has 1-3
    captions (the world's caption first, then alt-text drawn from its scene), shuffled in the file as
    COCO's are; one instance annotation per object, bbox [x, y, w, h]. Images are JPEG via PIL.

    ``bad`` plants: image 1's file missing, image 2 without captions, image 3 without instances (kept by
    ``convert``, skipped by ``negate``), an empty caption on image 0, a caption and an instance of an
    unknown image_id. Returns paths and expected counts for ``convert`` and ``negate``."""
    out_dir = Path(out_dir)
    img_dir, ann_dir = out_dir / split, out_dir / "annotations"
    img_dir.mkdir(parents=True, exist_ok=True)
    ann_dir.mkdir(parents=True, exist_ok=True)
    cat_id = {s: 1 + 3 * k for k, s in enumerate(world.SHAPES)}
    images, caps, insts = [], [], []
    rng = np.random.default_rng([seed, 2017])
    for i in range(n):
        png, rec, _ = world.train_sample("finetune", seed, i, held_out=set())
        scene = rec["scene"]
        iid = 1000 + 7 * i
        name = f"{iid:012d}.jpg"
        im = Image.open(io.BytesIO(png)).convert("RGB")
        images.append({"license": 1, "file_name": name, "coco_url": f"http://images.cocodataset.org/{split}/{name}",
                       "height": im.height, "width": im.width, "date_captured": "2013-11-14 16:28:13",
                       "flickr_url": "", "id": iid})
        if not (bad and i == 1):
            im.save(img_dir / name, format="JPEG", quality=90)
        if not (bad and i == 2):
            texts = [rec["caption"]] + [phrasings.affirmative_caption(scene, rng) for _ in range(i % 3)]
            caps += [{"image_id": iid, "caption": t} for t in texts]
        if bad and i == 0:
            caps.append({"image_id": iid, "caption": "  "})
        if not (bad and i == 3):
            for o in scene["objects"]:
                x0, y0, x1, y1 = o["bbox"]
                insts.append({"segmentation": [[x0, y0, x1, y0, x1, y1, x0, y1]], "area": float((x1 - x0) * (y1 - y0)),
                              "iscrowd": 0, "image_id": iid, "bbox": [float(x0), float(y0), float(x1 - x0),
                                                                       float(y1 - y0)],
                              "category_id": cat_id[o["shape"]]})
    if bad:
        caps.append({"image_id": 999_999_999, "caption": "A caption of an image that is not listed"})
        insts.append({"segmentation": [[0, 0, 1, 0, 1, 1]], "area": 1.0, "iscrowd": 0, "image_id": 999_999_999,
                      "bbox": [0.0, 0.0, 1.0, 1.0], "category_id": cat_id[world.SHAPES[0]]})
    order = rng.permutation(len(caps))          # COCO's caption annotations are not grouped by image
    caps = [{**caps[k], "id": 10_000 + j} for j, k in enumerate(order)]
    insts = [{**a, "id": 50_000 + j} for j, a in enumerate(insts)]
    info = {"description": "negft example in COCO's layout (world images)", "url": "", "version": "1.0",
            "year": 2017, "contributor": "negft", "date_created": "2017/09/01"}
    licenses = [{"url": "http://creativecommons.org/licenses/by/4.0/", "id": 1, "name": "CC BY 4.0"}]
    categories = [{"supercategory": "shape", "id": cat_id[s], "name": s} for s in world.SHAPES]
    paths = {"captions": ann_dir / f"captions_{split}.json", "instances": ann_dir / f"instances_{split}.json",
             "images": img_dir}
    paths["captions"].write_text(json.dumps({"info": info, "licenses": licenses, "images": images,
                                             "annotations": caps}))
    paths["instances"].write_text(json.dumps({"info": info, "licenses": licenses, "images": images,
                                              "annotations": insts, "categories": categories}))
    skipped = {UNKNOWN_CAPTION_IMAGE: 1, EMPTY_CAPTION: 1, UNKNOWN_INSTANCE_IMAGE: 1, NO_CAPTION: 1,
               MISSING_FILE: 1} if bad else {}
    n_bad = 2 if bad else 0
    return {
        **{k: str(v) for k, v in paths.items()},
        "images_listed": n,
        "convert": {"samples": n - n_bad, "skipped": skipped, "images_without_instances": 1 if bad else 0},
        "negate": {"samples": n - n_bad - (1 if bad else 0),
                   "skipped": {**skipped, **({NO_LABELS: 1} if bad else {})}},
    }
