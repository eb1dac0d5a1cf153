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

``negft.world.formats.coco.write_coco_example`` writes a small dataset in exactly this layout with world
images, bad rows planted.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from negft.data.shards import IMAGE_EXTS, MISSING_IMAGE, ShardWriter, truthy

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
                     progress=truthy(progress)) as writer:
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

