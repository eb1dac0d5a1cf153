"""World training images as NegationCLIP's rewritten COCO captions and a train2014 folder: a small example of the
release the converter ``negft.convert.negationclip_coco`` reads, written on demand for tests (not a format of the
world build: not in ``FORMATS``).

Layout (parkquasar/NegationCLIP @ 6f858ee, src/data_generation.py writes it, src/clip_finetune.py reads it):
``annotations/negationclip_captions_train2014.json``, a dict with ``info``, ``licenses``, ``images`` (COCO's
[{license, file_name, coco_url, height, width, date_captured, flickr_url, id}], every image) and ``annotations``
(the kept COCO caption annotations, each ``{image_id, id, caption, updated_caption}``), dumped with indent 4; an
image at ``train2014/COCO_train2014_<id:012d>.jpg``.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from negft import phrasings
from negft.convert.coco import BAD_TYPE, EMPTY_CAPTION, MISSING_FILE, UNKNOWN_CAPTION_IMAGE
from negft.convert.negationclip_coco import EMPTY_REWRITE
from negft.data.schema import NEGCAP
from negft.world import generator as world

SPLIT = "train2014"
FILE = "negationclip_captions_train2014.json"


def _image_entry(iid: int, name: str, im: Image.Image) -> dict:
    return {"license": 1, "file_name": name, "coco_url": f"http://images.cocodataset.org/{SPLIT}/{name}",
            "height": im.height, "width": im.width, "date_captured": "2013-11-14 16:28:13", "flickr_url": "",
            "id": iid}


def write_negationclip_example(out_dir, n: int, seed: int = 0, bad: bool = True) -> dict:
    """``n`` world images in NegationCLIP's released layout under ``out_dir``:

        annotations/negationclip_captions_train2014.json, train2014/COCO_train2014_<id:012d>.jpg

    Image i keeps ``1 + i % 2`` caption annotations (image 5 none, as most COCO captions' rewrites were not
    kept): the world's caption, then alt-text drawn from its scene, each with one of the image's NegCap captions
    as ``updated_caption``; annotations shuffled in the file as COCO's are. Images are JPEG via PIL.

    ``bad`` plants: image 1's file missing, image 3 listed as a GIF, an empty caption, an empty and a missing
    ``updated_caption``, an annotation of an unknown image_id. Returns the paths and, per annotation row, the
    skip reason it should meet (None for a good row)."""
    out_dir = Path(out_dir)
    img_dir, ann_dir = out_dir / SPLIT, out_dir / "annotations"
    img_dir.mkdir(parents=True, exist_ok=True)
    ann_dir.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 2014])
    images, anns = [], []                   # anns: (annotation, the reason it is skipped or None)
    for i in range(n):
        png, rec, _ = world.train_sample("finetune", seed, i, held_out=set())
        iid = 9 + 13 * i
        gif = bad and i == 3
        name = f"COCO_{SPLIT}_{iid:012d}.{'gif' if gif else 'jpg'}"
        im = Image.open(io.BytesIO(png)).convert("RGB")
        images.append(_image_entry(iid, name, im))
        if not (bad and i == 1):
            im.save(img_dir / name, format="GIF" if gif else "JPEG", **({} if gif else {"quality": 90}))
        if i == 5:
            continue
        reason = MISSING_FILE if bad and i == 1 else BAD_TYPE if gif else None
        captions = [rec["caption"]] + [phrasings.affirmative_caption(rec["scene"], rng) for _ in range(i % 2)]
        anns += [({"image_id": iid, "caption": c, "updated_caption": rec[NEGCAP][k]}, reason)
                 for k, c in enumerate(captions)]
    if bad:
        good = [a for a, reason in anns if reason is None]
        anns += [({**good[0], "caption": "  "}, EMPTY_CAPTION),
                 ({**good[1], "updated_caption": ""}, EMPTY_REWRITE),
                 ({k: v for k, v in good[2].items() if k != "updated_caption"}, EMPTY_REWRITE),
                 ({**good[3], "image_id": 999_999_999}, UNKNOWN_CAPTION_IMAGE)]
    anns = [anns[k] for k in rng.permutation(len(anns))]     # COCO's caption annotations are not grouped by image
    annotations = [{"image_id": a["image_id"], "id": 100_000 + 3 * j,
                    **{k: a[k] for k in ("caption", "updated_caption") if k in a}} for j, (a, _) in enumerate(anns)]
    info = {"description": "negft example in NegationCLIP's layout (world images)", "url": "", "version": "1.0",
            "year": 2014, "contributor": "negft", "date_created": "2015-01-27 09:11:52.357475"}
    licenses = [{"url": "http://creativecommons.org/licenses/by/4.0/", "id": 1, "name": "CC BY 4.0"}]
    path = ann_dir / FILE
    path.write_text(json.dumps({"info": info, "licenses": licenses, "images": images, "annotations": annotations},
                               indent=4))
    return {"captions": str(path), "images": str(img_dir), "rows": [reason for _, reason in anns]}
