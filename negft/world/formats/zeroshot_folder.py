"""The world's zero-shot set in the folder layout the ``zeroshot`` probe reads (``negft/probes/zeroshot.py``):

    <split>/zeroshot/<class index>/zs_<i>.png            the images of ``zeroshot.csv``, by label (ImageNet-V2's
                                                         layout: folders named by class index), zero-padded
                                                         (``00``..``11``) so that their order as text, which
                                                         torchvision's ImageFolder (and so CLIP_benchmark) takes as
                                                         the class order, is the class order
    <split>/zeroshot/classnames.txt                      one class name per line, line i = class i
    <split>/zeroshot/zeroshot_classification_templates.txt   one prompt template per line, {c} = the class name

(the metadata files of LAION-AI/CLIP_benchmark's ``wds`` datasets, ``clip_benchmark/datasets/builder.py``
``build_wds_dataset``). The class names carry their article ("a circle", "an arrow") and the templates none
("a photo of {c}."), so the prompts are exactly those the world's zero-shot probe always used
(``negft.probes.zeroshot.TEMPLATES`` with ``with_article``): same images (bytes copied), same class names, same
prompts, same ``zeroshot/world/*`` values. ``zeroshot.csv`` stays as it was. No randomness is drawn.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from negft.world.render import SHAPES
from negft.text import with_article

FOLDER = "zeroshot"
PROMPTS = ("a photo of {c}.", "a picture of {c}.", "a drawing of {c}.", "an image showing {c}.", "{c} in the scene.")


def class_names() -> list[str]:
    return [with_article(shape) for shape in SHAPES]


def folder_name(label: int, n_classes: int) -> str:
    """Class ``label``'s folder: its index with as many digits as the largest, so text order is class order."""
    return f"{label:0{len(str(n_classes - 1))}d}"


def write_set(out: Path, records: list[dict], source: Path) -> None:
    """Copy each record's image (``image_path`` under ``source``) to ``out/<label>/`` and write the metadata."""
    out.mkdir(parents=True, exist_ok=True)
    names = class_names()
    for r in records:
        folder = out / folder_name(int(r["label"]), len(names))
        folder.mkdir(exist_ok=True)
        shutil.copyfile(source / r["image_path"], folder / Path(r["image_path"]).name)
    (out / "classnames.txt").write_text("".join(f"{c}\n" for c in names))
    (out / "zeroshot_classification_templates.txt").write_text("".join(f"{t}\n" for t in PROMPTS))


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    write_set(Path(split_dir) / FOLDER, zeroshot, Path(split_dir))
