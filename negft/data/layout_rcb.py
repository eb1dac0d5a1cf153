"""Where the Probe-R / Probe-C / Probe-B release puts its files (the Probe-R/C/B paper; repository
DeepLearningRobustnessStudies/UnderstandingVisualTextModels), relative to one dataset root: the folder layout
of a checkout of that repository with its ``data/`` filled in as its README's run examples and scripts' defaults
place it. The readers (negft/probes/probe_r.py, probe_c.py, probe_b.py) and the world's writer
(negft/world/formats/probe_rcb.py) both take their paths from here; nothing here imports the world.

- Probe-R (``core/eval_relation_understanding.py``): ``<annot_dir>/data/visual_genome/relation_eval_<switch>.json``
  with switch ``subject`` (the one its ``eval()`` reads) or ``object``; images ``<root_image_dir>/<image_id>.jpg``
  (default ``.../visual_genome/all_images``).
- Probe-C (``core/eval_compositional_understanding.py``): ``<annot_dir>/data_compositional_switch.json`` and
  ``data_object_switch.json`` (annot_dir default ``data/coco``); images
  ``<root_image_dir>/COCO_val2014_<id, 12 digits>.jpg`` (README: ``data/coco/val2014/``).
- Probe-B (``core/eval_context_understanding.py``, ``core/eval_cooccurence_understanding.py``; README:
  ``annot_dir=data/context``, ``data/coco/val2014_random_patch_dataset``, ...): ``background_context_dataset.json``,
  ``object_context_dataset.json``, ``prompt_classes.csv`` (columns ``class, prompt``); per filler the patched
  images ``val2014_random_patch_dataset/<fill>/``, the background-removed ones
  ``val2014_background_removed_dataset/segmentation_mask/<fill>/`` and the one-object ones
  ``val2014_background_removed_and_cooccurrence_dataset/segmentation_mask/<fill>/<object>_COCO_val2014_....jpg``.

Image files are named as the release names them (``.jpg``); a ``.png`` of the same stem is accepted (the
world writes PNG links).
"""
from __future__ import annotations

import os
from pathlib import Path

from negft.data.schema import PROBE_B_FILLERS  # noqa: F401  (the fillers the release's folders are named by)

# Probe-R
PROBE_R_DIR = "data/visual_genome"
PROBE_R_SWITCHES = ("subject", "object")
VG_IMAGES = "data/visual_genome/all_images"


def probe_r_file(switch: str) -> str:
    return f"{PROBE_R_DIR}/relation_eval_{switch}.json"


def vg_name(image_id) -> str:
    return f"{image_id}.jpg"


# Probe-C
PROBE_C_DIR = "data/coco"
PROBE_C_FILES = {"composition": "data/coco/data_compositional_switch.json",
                 "object": "data/coco/data_object_switch.json"}
COCO_IMAGES = "data/coco/val2014"


def coco_name(image_id) -> str:
    return f"COCO_val2014_{str(image_id).zfill(12)}.jpg"


# Probe-B
CONTEXT_DIR = "data/context"
PROBE_B_MR_FILE = "data/context/background_context_dataset.json"
PROBE_B_R_FILE = "data/context/object_context_dataset.json"
PROMPT_CLASSES = "data/context/prompt_classes.csv"
R_EXCLUDED_CLASS = "apple"           # eval_cooccurence_understanding.py drops it ("too much overlap")


def patch_dir(fill: str) -> str:
    return f"data/coco/val2014_random_patch_dataset/{fill}"


def background_removed_dir(fill: str) -> str:
    return f"data/coco/val2014_background_removed_dataset/segmentation_mask/{fill}"


def one_object_dir(fill: str) -> str:
    return f"data/coco/val2014_background_removed_and_cooccurrence_dataset/segmentation_mask/{fill}"


def one_object_name(obj: str, image_id) -> str:
    return f"{obj}_{coco_name(image_id)}"


def find_image(folder, name: str, listing: set | None = None) -> str | None:
    """The path of the release's image ``name`` (``.jpg``) in ``folder``, or of a ``.png`` of the same stem;
    None when neither is there. ``listing``: the folder's names, when the caller has listed it already."""
    stem = os.path.splitext(name)[0]
    for candidate in (name, stem + ".png"):
        if (candidate in listing) if listing is not None else os.path.exists(os.path.join(folder, candidate)):
            return os.path.join(folder, candidate)
    return None


def listing(folder) -> set:
    """The names in ``folder`` (empty when it does not exist)."""
    try:
        return set(os.listdir(folder))
    except OSError:
        return set()


def image_key(path: str) -> str:
    """The path an image is encoded (and cached) under: a symbolic link's target, so that one image the world
    links into several released layouts is encoded once; any other path as it is."""
    if os.path.islink(path):
        return os.path.normpath(os.path.join(os.path.dirname(path), os.readlink(path)))
    return path


def release_root(path) -> Path:
    """The dataset root of one of the release's JSON files, which sit two folders below it (``data/<dir>/``)."""
    return Path(path).parents[2]


def image_folder(path, images: str) -> tuple[Path, set]:
    """(the image folder ``images`` of the release that JSON file ``path`` belongs to, that folder's names)."""
    folder = release_root(path) / images
    return folder, listing(folder)
