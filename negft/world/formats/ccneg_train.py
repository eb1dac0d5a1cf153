"""World images as CC-Neg's fine-tuning split with its COCO distractors: a small example of the released files the
converter ``negft.convert.ccneg_train`` reads (its docstring gives the layout and where it was taken from), written
on demand for tests (not a format of the world build: not in ``FORMATS``).

    <out>/ccneg_dataset/ccneg_preprocessed.pt                the annotations, the dataset folder's torch file
    <out>/ccneg_dataset/distractor_image_mapping.pt           row -> top-k COCO indices (an int64 tensor)
    <out>/ccneg_dataset/ccneg_images/cc3m_subset_images_extracted_final/<row>.jpg   the CC3M images
    <out>/coco/annotations/captions_train2017.json, <out>/coco/train2017/   COCO (formats.coco.write_coco_example)

``ccneg_preprocessed.pt`` holds ``n`` fine-tuning rows, then the 40,000 rows of the evaluation split (every one of
them a reference to one of three rows, so the file stays small; pickle stores a repeated object once). Image paths
are written under the authors' ``/workspace/datasets/cc3m/``. A fine-tuning row's caption names the scene's objects
and a negated caption denies one of them (formats.ccneg.example in the training phrasings: CC-Neg's negation of an
object the image shows); its distractors are random COCO example images, ``TOP_K`` per row.

``bad`` plants, one row each: row 1's image file missing, row 2's caption missing, row 3's negated caption only
commas (empty once the loader removes them), row 4's top-1 distractor past COCO's last image, row 5's top-1 the COCO
image whose file is missing (write_coco_example's image 1), and the mapping one row short (the last row has none).
Saved with ``torch.save`` of dicts, lists, strings and a tensor only, which ``torch.load(weights_only=True)`` reads.
"""
from __future__ import annotations

import io
from pathlib import Path

import torch
from PIL import Image

from negft import phrasings
from negft.convert.ccneg_train import MAPPING, MISSING_DISTRACTOR, NO_DISTRACTOR, OUT_OF_RANGE
from negft.data.shards import MISSING_IMAGE
from negft.probes.ccneg import EVAL_ROWS, FILE, NO_CAPTION, NO_NEGATED, PREFIX
from negft.world import formats
from negft.world import generator as world
from negft.world.formats import ccneg
from negft.world.formats.coco import write_coco_example

IMAGES = "ccneg_images/cc3m_subset_images_extracted_final"     # ccneg_dataset/README.md's folder
TOP_K = 5                       # distractors per row (the loader reads the first)
COCO_IMAGES = 12                # images of the COCO example; its image 1 has no file
EVAL_DISTINCT = 3               # distinct rows the evaluation split repeats


def _jpeg(png: bytes, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.open(io.BytesIO(png)).convert("RGB").save(path, format="JPEG", quality=90)


def _rows(root: Path, first: int, count: int, seed: int, rng) -> tuple[list, list]:
    """(image paths as released, annotations) of world images ``first .. first + count - 1``."""
    paths, annotations = [], []
    for i in range(first, first + count):
        png, rec, _ = world.train_sample("finetune", seed, i, held_out=set())
        caption, negated = ccneg.example(rec["scene"], rng, phrasings.AFFIRM_TRAIN, phrasings.NEGATE_TRAIN)
        name = f"{IMAGES}/{i:06d}.jpg"
        _jpeg(png, root / name)
        paths.append(PREFIX + name)
        annotations.append({"json": {"caption": caption, "key": f"{i:06d}"}, "sop_data": {"negative-prompt": negated}})
    return paths, annotations


def _plant(root: Path, paths: list, annotations: list, mapping: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """The bad rows of the module docstring; (the mapping, skipped rows by reason)."""
    (root / paths[1].replace(PREFIX, "")).unlink()
    del annotations[2]["json"]["caption"]
    annotations[3]["sop_data"]["negative-prompt"] = " , ,"
    mapping[4, 0] = COCO_IMAGES + 3
    mapping[5, 0] = 1
    return mapping[:-1].clone(), {MISSING_IMAGE: 1, NO_CAPTION: 1, NO_NEGATED: 1, OUT_OF_RANGE: 1,
                          MISSING_DISTRACTOR: 1, NO_DISTRACTOR: 1}


def write(out_dir, n: int, seed: int = 0, bad: bool = True) -> dict:
    """``n`` fine-tuning rows (n >= 7 with ``bad``) in the released layout under ``out_dir``; returns the paths
    (``pt``, ``mapping``, ``root``, ``coco_captions``, ``coco_images``) and what the converter should give
    (``samples``, ``skipped`` by reason)."""
    out_dir = Path(out_dir)
    root = out_dir / "ccneg_dataset"
    rng = formats.rng(seed, out_dir, "ccneg_train")
    coco = write_coco_example(out_dir / "coco", COCO_IMAGES, seed=seed + 1, bad=True)
    paths, annotations = _rows(root, 0, n, seed, rng)
    with_files = [k for k in range(COCO_IMAGES) if k != 1]
    mapping = torch.tensor([[with_files[int(j)] for j in rng.permutation(len(with_files))[:TOP_K]] for _ in range(n)],
                           dtype=torch.int64)
    mapping, skipped = _plant(root, paths, annotations, mapping) if bad else (mapping, {})
    tail_paths, tail = _rows(root, n, EVAL_DISTINCT, seed, rng)
    paths += [tail_paths[k % EVAL_DISTINCT] for k in range(EVAL_ROWS)]
    annotations += [tail[k % EVAL_DISTINCT] for k in range(EVAL_ROWS)]
    torch.save({"image_paths": paths, "annotations": annotations}, root / FILE)
    torch.save(mapping, root / MAPPING)
    return {"pt": str(root / FILE), "mapping": str(root / MAPPING), "root": str(root),
            "coco_captions": coco["captions"], "coco_images": coco["images"], "rows": n,
            "samples": n - sum(skipped.values()), "skipped": skipped}
