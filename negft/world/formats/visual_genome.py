"""World RelComp images as Visual Genome v1.2's released files + an ARO-style exclusion file: a small example of
what the converter ``negft.convert.relcomp_vg`` reads, written on demand for tests and benches (not a format of
the world build: not in ``FORMATS``).

Layouts (the converter's ``LAYOUT_SOURCE`` has each in full):

- ``relationships.json``: danfeiX/scene-graph-TF-release data_tools/vg_to_roidb.py; ranjaykrishna/
  visual_genome_python_driver visual_genome/local.py (``relationship_id``, ``synsets``; ``name`` or ``names``)
- ``attributes.json``: ranjaykrishna/visual_genome_python_driver visual_genome/local.py
- ``image_data.json``: ranjaykrishna/visual_genome_python_driver visual_genome/utils.py (parse_image_data)
- images: ``VG_100K/<image_id>.jpg`` and ``VG_100K_2/<image_id>.jpg`` (VG's images.zip / images2.zip)
- ``visual_genome_relation.json``: mertyg/vision-language-models-are-bows dataset_zoo/aro_datasets.py
  (VG_Relation: a list of {image_path, bbox_x, ..., true_caption, false_caption})
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
from PIL import Image

from negft import phrasings
from negft.convert.relcomp_vg import EMPTY_NAME, EMPTY_PREDICATE, IMAGE_DIRS, MISSING_FILE, NO_NEGATIVE, \
    NO_RELATIONSHIPS, NO_SAMPLE
from negft.world import generator as world


def write_vg_example(out_dir, n: int, seed: int = 0, bad: bool = True) -> dict:
    """``n`` world images (the ``relcomp`` split) in Visual Genome's released layout under ``out_dir``:

        relationships.json, attributes.json, image_data.json, VG_100K/<id>.jpg, VG_100K_2/<id>.jpg,
        visual_genome_relation.json (ARO-style exclusion file), exclude_ids.txt

    Image ``i`` has id ``i + 1`` (odd ids in VG_100K, even in VG_100K_2, as the url in image_data.json
    says). Objects are named by shape, carry the attributes [colour, size], and boxes x, y, w, h; the
    relations are a seeded ~60% (at least one) of the world's spatial relations, predicates spelled as
    the world's captions spell them ("to the left of", "above", ...), plus a symmetric "next to" for close
    pairs; even images name objects with ``name``, odd ones with ``names``. Images are JPEG via PIL.

    ``bad`` plants: an image whose file is missing (id n + 1), an empty subject name and an empty predicate
    beside the good relationships of id 2, id 3 without relationships, id 4 whose only relationship
    ("cloud near cloud", no attributes) has no valid negative. Ids 5-9 are listed for exclusion (5-7 in
    the ARO-style file by ``image_path``, id 6 also by ``image_id``; 8-9 in exclude_ids.txt beside an id
    not in VG). Needs n >= 10. Returns the paths and the expected counts for
    ``relcomp(..., max_per_image=1)``: every other image makes exactly one sample."""
    if n < 10:
        raise ValueError(f"write_vg_example needs n >= 10 (ids 2-9 are planted), got {n}")
    out_dir = Path(out_dir)
    for d in IMAGE_DIRS:
        (out_dir / d).mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 1234])
    relationships, attributes, image_data = [], [], []
    n_total = n + (1 if bad else 0)
    rid = 1
    for i in range(n_total):
        iid = i + 1
        png, rec, _ = world.train_sample("relcomp", seed, i, held_out=set())
        scene = rec["scene"]
        folder = IMAGE_DIRS[iid % 2 == 0]
        objs = []
        for k, o in enumerate(scene["objects"]):
            x0, y0, x1, y1 = o["bbox"]
            objs.append({"object_id": iid * 100 + k, "synsets": [f"{o['shape']}.n.01"],
                         "x": x0, "y": y0, "w": x1 - x0, "h": y1 - y0,
                         **({"name": o["shape"]} if iid % 2 == 0 else {"names": [o["shape"]]})})
        attributes.append({"image_id": iid, "attributes": [
            {"object_id": ob["object_id"], "names": [o["shape"]], "synsets": ob["synsets"],
             "attributes": [o["color"], o["size"]], **{k: ob[k] for k in ("x", "y", "w", "h")}}
            for ob, o in zip(objs, scene["objects"])]})
        pairs = [(a, p, b) for a, p, b in scene["relations"]]
        keep = [t for t in pairs if rng.random() < 0.6] or [pairs[int(rng.integers(len(pairs)))]]
        rels = []
        for a, p, b in keep:
            rels.append((a, phrasings.PREDICATE_WORDS[p], b))
        for a in range(len(objs)):
            for b in range(a + 1, len(objs)):
                oa, ob_ = scene["objects"][a], scene["objects"][b]
                if abs(oa["x"] - ob_["x"]) + abs(oa["y"] - ob_["y"]) <= 28 and rng.random() < 0.5:
                    rels.append((a, "next to", b))
        entries = []
        for a, p, b in rels:
            entries.append({"relationship_id": rid, "predicate": p, "synsets": [],
                            "subject": dict(objs[a]), "object": dict(objs[b])})
            rid += 1
        if bad and i == 1:
            entries.append({"relationship_id": rid, "predicate": "above", "synsets": [],
                            "subject": {**objs[0], "name": ""} if "name" in objs[0] else {**objs[0], "names": [""]},
                            "object": dict(objs[1])})
            entries.append({"relationship_id": rid + 1, "predicate": " ", "synsets": [],
                            "subject": dict(objs[0]), "object": dict(objs[1])})
            rid += 2
        if bad and i == 2:
            entries = []
        if bad and i == 3:
            clouds = [{"object_id": iid * 100 + 90 + k, "name": "cloud", "synsets": ["cloud.n.01"],
                       "x": 2 + 30 * k, "y": 2, "w": 20, "h": 10} for k in range(2)]
            entries = [{"relationship_id": rid, "predicate": "near", "synsets": [],
                        "subject": clouds[0], "object": clouds[1]}]
            rid += 1
        relationships.append({"image_id": iid, "relationships": entries})
        image_data.append({"image_id": iid, "url": f"https://cs.stanford.edu/people/rak248/{folder}/{iid}.jpg",
                           "width": world.IMAGE_SIZE, "height": world.IMAGE_SIZE, "coco_id": None, "flickr_id": None})
        if not (bad and i == n):                # the planted missing file
            buf = io.BytesIO()
            Image.open(io.BytesIO(png)).convert("RGB").save(buf, format="JPEG", quality=90)
            (out_dir / folder / f"{iid}.jpg").write_bytes(buf.getvalue())
    for name, data in (("relationships.json", relationships), ("attributes.json", attributes),
                       ("image_data.json", image_data)):
        (out_dir / name).write_text(json.dumps(data))
    # exclusion: ARO's VG-Relation rows (image_path; one also with image_id) and a plain id list
    aro = [{"image_path": f"{iid}.jpg", "relation_name": "to the left of", "bbox_x": 0, "bbox_y": 0,
            "bbox_w": 64, "bbox_h": 64, "true_caption": "the x is to the left of the y",
            "false_caption": "the y is to the left of the x", **({"image_id": str(iid)} if iid == 6 else {})}
           for iid in (5, 6, 7)]
    (out_dir / "visual_genome_relation.json").write_text(json.dumps(aro))
    (out_dir / "exclude_ids.txt").write_text("# ids\n8\n9\n2400000\n")
    excluded = [5, 6, 7, 8, 9]
    skipped = {}
    if bad:
        skipped = {MISSING_FILE: 1, EMPTY_NAME: 1, EMPTY_PREDICATE: 1, NO_RELATIONSHIPS: 1,
                   NO_NEGATIVE: 1, NO_SAMPLE: 1}
    return {
        "relationships": str(out_dir / "relationships.json"), "attributes": str(out_dir / "attributes.json"),
        "image_data": str(out_dir / "image_data.json"), "images": str(out_dir),
        "exclude": [str(out_dir / "visual_genome_relation.json"), str(out_dir / "exclude_ids.txt")],
        "excluded_ids": excluded,
        "expected": {"images": n_total, "samples": n - len(excluded) - (2 if bad else 0),
                     "excluded": len(excluded), "skipped": skipped,
                     "missing_ids": [n + 1] if bad else [], "no_sample_ids": [3, 4] if bad else []},
    }
