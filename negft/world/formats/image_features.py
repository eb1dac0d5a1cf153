"""``image_features.csv``: per-image features for the scalable analysis probe (Scalable performance analysis,
section 3), one row per probe image: ``image_path`` and numeric columns. Any dataset may carry such a file
(features from its own annotations); the world's come from its scene annotations."""
from __future__ import annotations

import csv
from pathlib import Path

FILE = "image_features.csv"
HORIZONTAL = ("left of", "right of")


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    with open(split_dir / FILE, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image_path", "objects", "horizontal"])
        for r in main:
            rel = r.get("relcomp")
            horizontal = "" if not rel else int(rel["triple"][1] in HORIZONTAL)     # RelComp images only
            w.writerow([r["image_path"], len(r["scene"]["objects"]), horizontal])
