"""CE-CLIP's COCO training data (typed hard captions, ``processed_dataset*.npy``) + COCO's images → relcomp shards.

    negft data convert ceclip-coco NPY IMAGES out=DIR

Layout (lezhang7/Enhance-FineGrained @ ef87eb7; the data is not released as files: ``data/prepare_dataset.sh``
generates it from COCO 2014 with ``data/dataset.py --data coco_train``, and ``scripts/run_multiple_nodes.sh`` trains
on it with ``--dataset-type npy --train-data ../data/generated_data/coco_train/``). ``dataset.py`` (``main``,
``TextAugment.generate``) writes ``generated_data/coco_train/processed_dataset<i>.npy``, one per 50,000 of
``captions_train2014.json``'s annotations, each ``np.save`` of a list of dicts (a 1-d object array, so a pickle
after the npy header): the annotation as COCO has it (``image_id``, ``id``, ``caption``) and

    relation_aug_caption   the caption with its first two nouns exchanged, or ``###`` where it has fewer than three
    adj_aug_caption        an adjective (a random one) masked and filled by distilroberta-base (its 4th guess);
                           a caption without one: ``<mask>`` alone, filled (a single word)
    noun_aug_caption       the same for a noun
    verb_aug_caption       the same for a verb
    valid_caption          [1, 0 where relation_aug_caption is ###, 1, 1, 1]: its ``caption`` keys, in order

The loader (``src/training/data.py`` ``NpyDataset`` and ``HardNegative_Collate`` as of 0ff8cbf, the last commit
whose ``data.py`` has them; ``src/training/train.py`` then slices the mask to ``valid_caption[1:]``) reads every
``*.npy`` of the folder with ``np.load(allow_pickle=True)``; per sample the caption and the four hard captions in
that order (each ``str()``-ed and tokenized, a ``###`` too, which the mask leaves out of the rank hinge only), and
the image ``$IMG_DATA_DIR/train2014/COCO_train2014_<image_id:012d>.jpg`` (``val2014`` where the path holds "val";
an ``image_path`` key where it does not hold "coco": not this data).

NPY is that folder (or one of its files); IMAGES the loader's ``IMG_DATA_DIR``, the folder holding ``train2014/``.
The files are read in the order of their number. The pickle is read with an unpickler that builds numpy's object
array and plain Python values only (what ``np.save`` of such a list holds): any other global is refused, so no
code in the file runs.

One sample per usable row, keyed ``<file stem>_<row>``, the image's bytes unchanged:

    caption   the caption
    relcomp   {caption, negatives: the row's real hard captions in CE-CLIP's order (schema.CECLIP_TYPES), kind
              relation / adjective / noun / verb, negative_image: null}
    ceclip    {file, row, id: the annotation's id, image_id}

Left out of ``negatives`` and counted in manifest.json's ``left_out`` by why and type, the row kept: a ``###``
placeholder (the loader keeps it as a candidate; CE-CLIP's mask says it is none), a blank text, and a hard caption
equal to the caption (the fill-mask model put the word back). The single-word captions of a caption without an
adjective, noun or verb are kept: they are what CE-CLIP trains on. Skipped and counted, by reason: a row that is not
a dict, an empty caption, an ``image_id`` that is not a non-negative integer, a hard-caption key missing or not text
(the loader fails on it), a row with no real hard caption, a missing image.

``negft.world.formats.ceclip_coco.write`` writes a small example in exactly this layout with world images and bad
rows planted.
"""
from __future__ import annotations

import pickle
import re
from collections import Counter
from pathlib import Path

import numpy as np
from numpy.lib import format as npy_format

from negft.data.schema import CAPTION, CECLIP_TYPES, RELCOMP
from negft.data.shards import MISSING_IMAGE as MISSING_FILE, NO_HARD_CAPTION, ShardWriter, an_input, truthy

LAYOUT_SOURCE = ("lezhang7/Enhance-FineGrained @ ef87eb7: data/dataset.py (TextAugment.generate: np.save of the "
                 "COCO train2014 caption annotations, each with relation_aug_caption ('###' where none), "
                 "adj_aug_caption, noun_aug_caption, verb_aug_caption, valid_caption; main: generated_data/coco_train/"
                 "processed_dataset<i>.npy per 50,000), data/prepare_dataset.sh, scripts/run_multiple_nodes.sh "
                 "(--dataset-type npy --train-data ../data/generated_data/coco_train/, IMG_DATA_DIR); @ 0ff8cbf: "
                 "src/training/data.py (NpyDataset: every *.npy of the folder, np.load(allow_pickle=True).tolist(); "
                 "caption and the four hard captions in that order; IMG_DATA_DIR/train2014/"
                 "COCO_train2014_<image_id:012d>.jpg; HardNegative_Collate), src/training/train.py "
                 "(valid_caption[:, 1:])")
FILE = re.compile(r"processed_dataset(\d+)\.npy")
# the hard-caption keys, in CE-CLIP's order of its types (schema.CECLIP_TYPES)
HARD_KEYS = dict(zip(CECLIP_TYPES, ("relation_aug_caption", "adj_aug_caption", "noun_aug_caption",
                                    "verb_aug_caption")))
PLACEHOLDER = "###"                 # dataset.py's relation_aug_caption where the caption has fewer than three nouns
FIELD = "ceclip"                    # the sample's provenance in the release

# skip reasons (manifest.json's "skipped"), besides MISSING_FILE and NO_HARD_CAPTION
NOT_A_RECORD = "row not a dict"
EMPTY_CAPTION = "empty caption"
BAD_IMAGE_ID = "image_id not a non-negative integer"
MALFORMED_HARD_CAPTION = "hard caption key missing or not text"

# why a hard caption is left out of a kept row (manifest.json's "left_out", in this order)
LEFT_REASONS = LEFT_PLACEHOLDER, LEFT_BLANK, LEFT_SAME = ("placeholder ###", "blank", "same as the caption")

# what np.save of a list of dicts pickles besides plain values: numpy's object-array reconstruction (numpy 1 and 2
# name its module differently)
_RECONSTRUCT = np.empty(0, dtype=object).__reduce__()[0]
ARRAY_GLOBALS = {("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
                 ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
                 ("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype}


class _ArrayUnpickler(pickle.Unpickler):
    """Builds an object array of plain values; refuses every other global, so the file runs no code."""

    def find_class(self, module, name):
        try:
            return ARRAY_GLOBALS[module, name]
        except KeyError:
            raise pickle.UnpicklingError(f"global {module}.{name} refused") from None


def load_rows(path: Path) -> list:
    """The list one ``processed_dataset<i>.npy`` holds; ValueError where it is not a 1-d object array npy file
    (or its pickle holds more than plain values)."""
    headers = {(1, 0): npy_format.read_array_header_1_0, (2, 0): npy_format.read_array_header_2_0}
    try:
        with open(path, "rb") as f:
            version = npy_format.read_magic(f)
            if version not in headers:
                raise ValueError(f"npy format version {version}")
            shape, _, dtype = headers[version](f)
            if dtype != np.dtype(object) or len(shape) != 1:
                raise ValueError(f"a {dtype} array of shape {shape}, not a list of records")
            array = _ArrayUnpickler(f).load()
    except pickle.UnpicklingError as e:
        raise ValueError(f"{path}: its pickle holds more than an array of plain values ({e}); negft runs no code "
                         "from a data file, so nothing in it ran") from None
    except (OSError, EOFError, ValueError, TypeError) as e:
        raise ValueError(f"{path}: not CE-CLIP's npy file ({type(e).__name__}: {e})") from None
    if not isinstance(array, np.ndarray) or array.shape != shape:
        raise ValueError(f"{path}: its pickle is not the {shape} array its header declares")
    return array.tolist()


def npy_files(npy: Path) -> list[Path]:
    """The folder's ``*.npy`` files (the loader's glob) by their number, or the one file given."""
    if npy.is_file():
        return [npy]
    number = lambda p: (int(m.group(1)) if (m := FILE.fullmatch(p.name)) else float("inf"), p.name)
    files = sorted(npy.glob("*.npy"), key=number)
    if not files:
        raise FileNotFoundError(f"{npy} holds no .npy file (CE-CLIP's generated_data/coco_train/ holds "
                                "processed_dataset<i>.npy)")
    return files


def image_path(images: Path, image_id: int) -> Path:
    return images / "train2014" / f"COCO_train2014_{image_id:012d}.jpg"


def hard_captions(row: dict, caption: str, left_out: Counter) -> list[dict] | str:
    """The row's real hard captions as [{text, kind}] (what is left out counted by why and type), or the reason the
    row cannot be used."""
    texts = {kind: row.get(key) for kind, key in HARD_KEYS.items()}
    if not all(isinstance(t, str) for t in texts.values()):
        return MALFORMED_HARD_CAPTION
    negatives = []
    for kind, text in texts.items():
        why = (LEFT_PLACEHOLDER if text.strip() == PLACEHOLDER else LEFT_BLANK if not text.strip()
               else LEFT_SAME if text == caption else None)
        if why:
            left_out[why, kind] += 1
        else:
            negatives.append({"text": text, "kind": kind})
    return negatives or NO_HARD_CAPTION


def parse(row, images: Path, left_out: Counter) -> dict | str:
    """One row as {caption, negatives, path, id, image_id}, or the reason it cannot be used."""
    if not isinstance(row, dict):
        return NOT_A_RECORD
    caption, image_id = row.get("caption"), row.get("image_id")
    if not isinstance(caption, str) or not caption.strip():
        return EMPTY_CAPTION
    if not isinstance(image_id, int) or isinstance(image_id, bool) or image_id < 0:
        return BAD_IMAGE_ID
    found = Counter()
    negatives = hard_captions(row, caption, found)
    if isinstance(negatives, str):
        return negatives
    path = image_path(images, image_id)
    if not path.is_file():
        return MISSING_FILE
    left_out.update(found)          # counted for the rows kept only
    return {"caption": caption, "negatives": negatives, "path": path, "id": row.get("id"), "image_id": image_id}


def record(row: dict, file: str, i: int) -> dict:
    """The sample's json: see the module docstring."""
    return {CAPTION: row["caption"],
            RELCOMP: {"caption": row["caption"], "negatives": row["negatives"], "negative_image": None},
            FIELD: {"file": file, "row": i, "id": row["id"], "image_id": row["image_id"]}}


def convert(npy, images, out, maxcount="1000", progress="true") -> dict:
    """CE-CLIP's ``generated_data/coco_train/`` (or one of its ``.npy`` files) + IMAGES (holding ``train2014/``)
    → ``out/shard-*.tar`` + ``manifest.json``; see the module docstring."""
    npy = an_input(npy, "CE-CLIP data", Path.exists, "its generated_data/coco_train/ folder")
    images = an_input(images, "image folder", Path.is_dir, "the folder holding train2014/")
    files = npy_files(npy)
    tables = [(f.name, load_rows(f)) for f in files]
    inputs = {"npy": str(npy), "images": str(images)}
    with ShardWriter(out, "ceclip-coco", LAYOUT_SOURCE, inputs, maxcount=int(maxcount),
                     progress=truthy(progress)) as writer:
        left_out, per_row = Counter(), Counter()
        for name, rows in tables:
            for i, raw in enumerate(rows):
                row = parse(raw, images, left_out)
                if isinstance(row, str):
                    writer.skip(row, f"{name} row {i}")
                    continue
                writer.add(f"{Path(name).stem}_{i:06d}", row["path"].read_bytes(), "jpg", record(row, name, i))
                per_row[len(row["negatives"])] += 1
        writer.notes.update({
            "rows": {name: len(rows) for name, rows in tables},
            "hard_captions_per_row": {str(k): v for k, v in sorted(per_row.items())},
            "left_out": {why: {kind: left_out[why, kind] for kind in CECLIP_TYPES if left_out[why, kind]}
                         for why in LEFT_REASONS},
            "policy": "one sample per row: the caption and its real hard captions, typed (relation, adjective, noun, "
                      "verb); ### placeholders, blank texts and copies of the caption left out",
        })
        manifest = writer.close()
    return {**manifest, "out": str(out)}
