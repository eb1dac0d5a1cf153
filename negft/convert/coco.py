"""COCO captions (+ instances) → shards: the control dataset, original captions only.

``negft data convert coco CAPTIONS_JSON INSTANCES_JSON IMAGES out=DIR`` reads COCO's released files as
they are, e.g. ``annotations/captions_train2017.json``, ``annotations/instances_train2017.json`` and the
``train2017/`` image folder. Without instances, pass ``CAPTIONS_JSON instances= images=IMAGES out=DIR``.

Layout (cocodataset/cocoapi, PythonAPI/pycocotools/coco.py: ``COCO.createIndex`` and ``COCO.download``):
a dict with ``images`` [{id, file_name, width, height, ...}], ``annotations`` — in a captions file
[{id, image_id, caption}], in an instances file [{id, image_id, category_id, bbox [x, y, w, h],
segmentation, area, iscrowd}] — and, in an instances file, ``categories`` [{id, name, supercategory}];
an image lives at ``IMAGES/<file_name>``.

One sample per image (in the order of the captions file's ``images``), keyed by its file name's stem:

    caption    the image's first caption in file order (whitespace collapsed)
    captions   all its captions in file order (``caption`` is ``captions[0]``)
    image_id   COCO's image id
    objects    {positive: the category names annotated on it (sorted, each once; crowd regions count),
               negative: []} — only when INSTANCES is given; an image with no instance annotation gets
               an empty ``positive`` list (COCO has about a thousand such train2017 images)

Image bytes are copied unchanged (``jpg`` member for ``.jpg``/``.jpeg`` files, ``png`` for ``.png``).
Skipped and counted in ``manifest.json``: an annotation whose ``image_id`` is not in ``images``, an
empty caption, an instance of an unknown ``category_id``, an image with no (non-empty) caption, an
image whose file is missing, an image of another type.

``write_coco_example`` writes a small dataset in exactly this layout with world images, bad rows planted.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

from negft.data.shards import IMAGE_EXTS, MISSING_IMAGE, ShardWriter

LAYOUT_SOURCE = ("cocodataset/cocoapi PythonAPI/pycocotools/coco.py (COCO.createIndex: images[{id, file_name}], "
                 "annotations[{image_id, caption}] / [{image_id, category_id, bbox}], categories[{id, name, "
                 "supercategory}]; COCO.download: images at <dir>/<file_name>)")

# skip reasons (manifest.json's "skipped"), shared with negft data negate
UNKNOWN_CAPTION_IMAGE = "caption annotation with unknown image_id"
EMPTY_CAPTION = "empty caption"
UNKNOWN_INSTANCE_IMAGE = "instance annotation with unknown image_id"
UNKNOWN_CATEGORY = "instance annotation with unknown category_id"
NO_CAPTION = "image without caption"
MISSING_FILE = MISSING_IMAGE
BAD_TYPE = "image type not jpg/png"
UNREADABLE = "image file unreadable"
NO_LABELS = "no object labels"            # negft data negate only


def _truthy(value) -> bool:
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def _load(path, what: str) -> dict:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} file {path} not found")
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise ValueError(f"{path} is not a COCO {what} file (a dict with an 'annotations' list)")
    return data


def clean_caption(text) -> str:
    return " ".join(text.split()) if isinstance(text, str) else ""


def read_coco(captions, instances, images, skip, check_files: bool = True) -> tuple[list[dict], dict]:
    """The images of a COCO captions file (+ instances file) as records
    ``{key, path, ext, captions: [str], objects: [str] | None, image_id, file_name}``;
    bad rows go to ``skip(reason, row)``. Returns (records, notes)."""
    cap = _load(captions, "captions")
    if not isinstance(cap.get("images"), list):
        raise ValueError(f"{captions} has no 'images' list (a COCO captions file has one)")
    imgs: dict = {}
    for img in cap["images"]:
        if isinstance(img, dict) and "id" in img and isinstance(img.get("file_name"), str):
            imgs.setdefault(img["id"], img)
    texts: dict = {}
    for ann in cap["annotations"]:
        iid = ann.get("image_id")
        if iid not in imgs:
            skip(UNKNOWN_CAPTION_IMAGE, f"caption id {ann.get('id')} (image_id {iid})")
            continue
        text = clean_caption(ann.get("caption"))
        if not text:
            skip(EMPTY_CAPTION, f"caption id {ann.get('id')} (image_id {iid})")
            continue
        texts.setdefault(iid, []).append(text)
    labels: dict | None = None
    notes = {"images_listed": len(imgs), "caption_annotations": len(cap["annotations"])}
    if instances:
        inst = _load(instances, "instances")
        cats = {c["id"]: c["name"] for c in inst.get("categories") or [] if isinstance(c, dict) and "id" in c}
        if not cats:
            raise ValueError(f"{instances} has no 'categories' (a COCO instances file has them)")
        labels = {}
        for ann in inst["annotations"]:
            iid = ann.get("image_id")
            if iid not in imgs:
                skip(UNKNOWN_INSTANCE_IMAGE, f"instance id {ann.get('id')} (image_id {iid})")
                continue
            name = cats.get(ann.get("category_id"))
            if name is None:
                skip(UNKNOWN_CATEGORY, f"instance id {ann.get('id')} (category_id {ann.get('category_id')})")
                continue
            labels.setdefault(iid, set()).add(name)
        notes.update(categories=len(cats), instance_annotations=len(inst["annotations"]))
    root = Path(images)
    if check_files and not root.is_dir():
        raise FileNotFoundError(f"image folder {root} not found")
    records = []
    for iid, img in imgs.items():
        name = img["file_name"]
        if iid not in texts:
            skip(NO_CAPTION, f"image_id {iid} ({name})")
            continue
        ext = IMAGE_EXTS.get(os.path.splitext(name)[1].lower())
        if ext is None:
            skip(BAD_TYPE, f"image_id {iid} ({name})")
            continue
        path = root / name
        if check_files and not path.is_file():
            skip(MISSING_FILE, f"image_id {iid} ({path})")
            continue
        records.append({"key": os.path.splitext(name)[0], "path": str(path), "file_name": name, "ext": ext,
                        "captions": texts[iid], "image_id": iid,
                        "objects": None if labels is None else sorted(labels.get(iid, ()))})
    return records, notes


def read_bytes(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def convert(captions, instances, images, out, maxcount="1000", progress="true") -> dict:
    """COCO captions (+ instances) → ``out/shard-*.tar`` + ``manifest.json``; see the module docstring."""
    inputs = {"captions": str(captions), "instances": str(instances or ""), "images": str(images)}
    if not Path(captions).is_file():           # fail before out/ is made
        raise FileNotFoundError(f"captions file {captions} not found")
    with ShardWriter(out, "coco", LAYOUT_SOURCE, inputs, maxcount=int(maxcount),
                     progress=_truthy(progress)) as writer:
        records, notes = read_coco(captions, instances, images, writer.skip)
        without = 0
        for rec in records:
            data = read_bytes(rec["path"])
            if data is None:
                writer.skip(UNREADABLE, rec["path"])
                continue
            meta = {"caption": rec["captions"][0], "captions": rec["captions"], "image_id": rec["image_id"]}
            if rec["objects"] is not None:
                meta["objects"] = {"positive": rec["objects"], "negative": []}
                without += not rec["objects"]
            writer.add(rec["key"], data, rec["ext"], meta)
        writer.notes.update(notes, caption_policy="one sample per image: caption = its first caption in file "
                            "order, captions = all of them")
        if instances:
            writer.notes["images_without_instances"] = without
        manifest = writer.close()
    return {**manifest, "out": str(out)}


# ------------------------------------------------------------------ an example in COCO's layout
def write_coco_example(out_dir, n: int, seed: int = 0, bad: bool = True, split: str = "train2017") -> dict:
    """``n`` world images in COCO's released layout under ``out_dir``:

        annotations/captions_<split>.json, annotations/instances_<split>.json, <split>/<id:012d>.jpg

    Category names are the world's shape names (ids spread with gaps, as COCO's are); each image has 1-3
    captions (the world's caption first, then alt-text drawn from its scene), shuffled in the file as
    COCO's are; one instance annotation per object, bbox [x, y, w, h]. Images are JPEG via PIL.

    ``bad`` plants: image 1's file missing, image 2 without captions, image 3 without instances (kept by
    ``convert``, skipped by ``negate``), an empty caption on image 0, a caption and an instance of an
    unknown image_id. Returns paths and expected counts for ``convert`` and ``negate``."""
    import numpy as np
    from PIL import Image

    from negft.world import generator as world
    from negft import phrasings

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
