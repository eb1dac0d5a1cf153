"""The world's image pairs as MMVP-VLM, in its released layout (MMVP/MMVP_VLM, as tsb0601/MMVP's
``scripts/evaluate_vlm.py`` reads it): ``Questions.csv`` (header ``Question ID,Type,Statement``; a pair is two
consecutive rows, the first with an odd id) and each row's image at ``MLLM_VLM Images/<Type>/<Question ID>.jpg``.

Where the files sit: at the top of the split folder, as under the manifest's root (``$NEGFT_DATA/mmvp_vlm/``).
The images are JPEG copies of the world's PNGs (the script opens ``<id>.jpg``), the only copies a world writer
makes: a pair's two images need two ids.

Each pair is two world images that differ in one visual detail, each with a statement true of it and false of the
other (the world's captions, first letter in lower case: the script prefixes "a photo of "), under the MMVP
pattern it honestly is:

- Spatial (MMVP's "Positional and Relational Context"): a RelComp pair of kind ``relation``, two related objects'
  positions exchanged ("a red star positioned to the left of a blue circle" / "... to the right of ...").
- Color ("Color and Appearance"): a RelComp pair of kind ``attribute``, the two objects' colours exchanged.
- Presence ("Presence of Specific Features"): a Probe-C pair of kind ``object``, one object replaced by a shape
  absent from the scene ("a red star" / "a red heart": each image has one of them and not the other).

The world draws no pair for Orientation, State, Quantity, Structural Character, Text or Camera Perspective
(Probe-C's size pairs, "a large star" / "a small star", are none of MMVP's patterns), so those Types are absent.
Types are written in the script's pattern order, ids counting up from 1 as the release's do. No randomness.
"""
from __future__ import annotations

import csv
from pathlib import Path

from PIL import Image

FILE = "Questions.csv"
IMAGES = "MLLM_VLM Images"
COLUMNS = ("Question ID", "Type", "Statement")
# the release's Types (its image folders), in the order of the script's patterns
TYPES = ("Orientation", "Presence", "State", "Quantity", "Spatial", "Color", "Structural Character", "Text",
         "Camera Perspective")
KINDS = {("relcomp", "relation"): "Spatial", ("relcomp", "attribute"): "Color", ("probe_c", "object"): "Presence"}


def statement(caption: str) -> str:
    return caption[0].lower() + caption[1:]


def pairs(main: list[dict]) -> dict[str, list[tuple[tuple[str, str], tuple[str, str]]]]:
    """Type -> [((image 0, image 1), (statement 0, statement 1))] of the records' pairs, in record order."""
    out: dict[str, list] = {}
    for rec in main:
        for field in ("relcomp", "probe_c"):
            pair = rec.get(field)
            qtype = KINDS.get((field, pair["kind"])) if pair else None
            if qtype:
                out.setdefault(qtype, []).append(((rec["image_path"], pair["image_1"]),
                                                  (statement(pair["caption_0"]), statement(pair["caption_1"]))))
    return out


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    split_dir = Path(split_dir)
    rows, by_type = [], pairs(main)
    for qtype in TYPES:
        folder = split_dir / IMAGES / qtype
        for images, statements in by_type.get(qtype, []):
            folder.mkdir(parents=True, exist_ok=True)
            for image, text in zip(images, statements):
                qid = len(rows) + 1
                Image.open(split_dir / image).convert("RGB").save(folder / f"{qid}.jpg", quality=95)
                rows.append((qid, qtype, text))
    with open(split_dir / FILE, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(COLUMNS)
        writer.writerows(rows)
