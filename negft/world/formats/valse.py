"""The world's probe images as three VALSE pieces, in the released layout (Heidelberg-NLP/VALSE @ 2152d90: a clone of
the repository, ``data/<piece>.json`` = ``{"<id>": {dataset, ..., image_file, caption, foil, classes, classes_foil,
mturk, ...}}``, indented by 4, each piece with the keys its release gives it in the same order).

Where the files sit: the split folder stands for the clone (its ``data/``, at the same relative paths as under
the manifest's root, ``$NEGFT_DATA/valse/data/<piece>.json``), and each row's image in the folder the release's
``config.py`` names for the piece (the manifest's ``images``), named as its source names it: existence and
counting ``data/visual7w/images/v7w_<n>.png``, relations ``data/relations/test_images/<n, 12 digits>.png``, for
world image ``n`` (``images/<n>.png``). ``image_file`` is that file name, as released. The images are relative
links to the world's PNGs (``formats.link``; the release's are JPEGs, which its readers open alike), so their pixels
are the world's.

Per probe image, one row in each piece; the caption is true of the scene and the foil false of it (shapes in a
scene are distinct, and the world knows which shapes are absent):

- existence: "There is no heart in the picture." for a shape the scene lacks, foiled by "There is a heart in the
  picture." (VALSE's ``zero_to_something``), or, drawn half the time, a shape it has, affirmed and foiled by its
  denial (``something_to_zero``).
- counting-small-quant: "There are exactly 3 shapes in the picture." (the scene's 1-4 objects), foiled by another
  number from 0 to 4, as the small-numbers piece counts 0-3.
- relations: "A red star positioned to the left of a blue circle." for a relation that holds, foiled by the
  opposite relation; scenes with no relation give no row.

Every row has the annotators' unanimous vote (``mturk``: caption 3, foil 0, other 0): the world's captions are
true by construction, so every row is in VALSE's valid set. The other pieces are absent: plurals (one object per
shape), the balanced and adversarial counting pieces, actions, coreference (no dialogue) and FOIL-it (no COCO
captions); so are the
keys that hold other models' scores (``nli_scores``, ``grammaticality_scores``), which no reader reads.
Randomness: ``formats.rng(seed, split_dir, "valse")`` only.
"""
from __future__ import annotations

import json
from pathlib import Path

from negft import phrasings
from negft.data import manifests
from negft.world import formats

PIECES = ("existence", "counting-small-quant", "relations")
VOTES = {"foil": 0, "caption": 3, "other": 0}
MAX_COUNT = 4                 # the world's scenes hold 1-4 objects
JSON_FOLDER = "data"          # the release's folder of piece files


def folder(piece: str) -> str:
    """The piece's image folder as the release's ``config.py`` names it (the manifest's ``images``)."""
    return manifests.load("valse")["images"][piece]


def _index(rec: dict) -> str:
    """``images/000012.png`` -> ``12``: the row's id in the world, as VALSE's ids carry the source's."""
    return str(int(Path(rec["image_path"]).stem))


def visual7w_name(rec: dict) -> str:
    return f"v7w_{_index(rec)}.png"


def coco_name(rec: dict) -> str:
    return f"{int(_index(rec)):012d}.png"


def existence(rec: dict, rng) -> dict:
    objects = rec["scene"]["objects"]
    present = rng.random() < 0.5
    shape = objects[int(rng.random() * len(objects))]["shape"] if present else rec["negative"][0]
    there = f"There is {phrasings.with_article(shape)} in the picture."
    there_no = f"There is no {shape} in the picture."
    caption, foil = (there, there_no) if present else (there_no, there)
    answer = int(present)
    return {"dataset": "visual7w", "dataset_idx": _index(rec), "image_file": visual7w_name(rec),
            "linguistic_phenomena": "existence", "caption": caption, "answer": answer, "classes": answer,
            "split": "test", "original_split": "test", "classes_foil": [1 - answer], "declarative_statement": caption,
            "declarative_statement_foils": [foil],
            "provenance_of_foils": "something_to_zero" if present else "zero_to_something", "mturk": dict(VOTES),
            "foil": foil}


def _count_sentence(n: int) -> str:
    return f"There {'is' if n == 1 else 'are'} exactly {n} shape{'' if n == 1 else 's'} in the picture."


def counting(rec: dict, rng) -> dict:
    n = len(rec["scene"]["objects"])
    others = [k for k in range(MAX_COUNT + 1) if k != n]
    wrong = others[int(rng.random() * len(others))]
    return {"dataset": "visual7w", "dataset_idx": _index(rec), "image_file": visual7w_name(rec),
            "linguistic_phenomena": "counting", "caption": _count_sentence(n), "answer": n, "classes": n,
            "split": "test", "original_split": "test", "classes_foil": wrong, "mturk": dict(VOTES),
            "foil": _count_sentence(wrong)}


def relation(rec: dict, rng) -> dict | None:
    objects, rels = rec["scene"]["objects"], rec["scene"]["relations"]
    if not rels:
        return None
    i, pred, j = rels[int(rng.random() * len(rels))]
    opposite = phrasings.OPPOSITE[pred]
    template = phrasings.RELCOMP_HELD_OUT[0]
    key = f"relations:coco_2017:{_index(rec)}"
    return {"dataset": "coco_2017", "original_split": "test", "dataset_idx": int(_index(rec)),
            "image_file": coco_name(rec), "linguistic_phenomena": "relations", "foil_method": "opposite relation",
            "caption": phrasings.relcomp_caption(objects[i], pred, objects[j], template) + ".",
            "classes": phrasings.PREDICATE_WORDS[pred], "classes_foil": phrasings.PREDICATE_WORDS[opposite],
            "key": key, "mturk": dict(VOTES),
            "foil": phrasings.relcomp_caption(objects[i], opposite, objects[j], template) + "."}


def write_piece(path: Path, rows: dict[str, dict]) -> None:
    """One piece file in the released layout: ``{"<id>": row, ...}``, indented by 4 as the release's files are."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(rows, indent=4), encoding="utf-8")


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    rng = formats.rng(seed, split_dir, "valse")
    pieces: dict[str, dict] = {p: {} for p in PIECES}
    images: list[tuple[str, str]] = []          # (the world's image, its name in the release's tree)
    for rec in main:
        rows = {"existence": (f"existence_visual7w_{_index(rec)}", existence(rec, rng)),
                "counting-small-quant": (f"counting_visual7w_{_index(rec)}", counting(rec, rng))}
        row = relation(rec, rng)
        if row is not None:
            rows["relations"] = (row["key"], row)
        for piece, (key, row) in rows.items():
            pieces[piece][key] = row
            images.append((rec["image_path"], f"{folder(piece)}/{row['image_file']}"))
    for target, name in images:
        formats.link(Path(split_dir), target, name)
    for piece, rows in pieces.items():
        write_piece(Path(split_dir) / JSON_FOLDER / f"{piece}.json", rows)
