"""The world's probe images as What's Up's six subsets, in the released layout (amitakamath/whatsup_vlms
``dataset_zoo/aro_datasets.py``; see ``negft.probes.whatsup``): at the top of the split folder, as under the
manifest's root (``$NEGFT_DATA/whatsup/``),

- ``controlled_images_dataset.json`` + ``controlled_images/`` (Controlled_Images_A) and
  ``controlled_clevr_dataset.json`` + ``controlled_clevr/`` (Controlled_Images_B): first from the RelComp pairs
  whose second image exchanges two objects' positions (``world.relcomp_pair``, kind ``relation``) along the
  horizontal: image 0 has object i to the left (right) of object j, image 1 to the right (left). A pair is used
  only where i and j have no vertical relation in either image, so of the four captions ("A red star to the left
  of a blue circle", "... to the right of ...", "... on ..." / "... under ..." (A), "... in front of ..." /
  "... behind ..." (B)) exactly the first is true: the world's shapes never touch or overlap, so none is on,
  under, in front of or behind another. A probe image without such a pair gives one row where two of its
  objects have a horizontal relation and no vertical one. Each image is a JPEG copy named as the release names
  its images, ``<colour>-<shape>_<left_of|right_of>_<colour>-<shape>.jpeg``, which is how the reference finds a
  pair; an object pair already used is not used again. Records that give rows go to A and B in turn. No
  world image has an object on or under another, so the world's sets are never complete (pair accuracy only).
- ``coco_qa_two_obj.json`` + ``val2017/<id as 12 digits>.jpg`` and ``vg_qa_two_obj.json`` +
  ``vg_images/<id>.jpg``: per probe image with a relation, ``[id, "A red star above a blue circle", "A red star
  below a blue circle"]`` (one relation drawn; the wrong caption says the opposite, which cannot hold with it);
  ``id`` is the world image's number, so ids skip the images without a relation.
- ``coco_qa_one_obj.json`` and ``vg_qa_one_obj.json``: per one-object image whose object sits off the centre by
  more than the world's relation margin along its larger offset, ``[id, "A red star on the left", "A red star on
  the right"]`` (left, right, top, bottom: the last word is the preposition, as the reference reads it).

Even-numbered probe images go to the COCO files, odd-numbered ones to the VG files. Randomness (which relation
of a scene): ``formats.rng(seed, split_dir, "whatsup")`` only.
"""
from __future__ import annotations

import json
from pathlib import Path

from PIL import Image

from negft import phrasings
from negft.text import with_article
from negft.world import formats
from negft.world.generator import REL_MARGIN, relations
from negft.world.render import IMAGE_SIZE

CONTROLLED = {               # subset file -> (image folder, its four relations: caption words)
    "controlled_images_dataset.json": ("controlled_images", {"left": "to the left of", "right": "to the right of",
                                                              "on": "on", "under": "under"}),
    "controlled_clevr_dataset.json": ("controlled_clevr", {"left": "to the left of", "right": "to the right of",
                                                            "in-front": "in front of", "behind": "behind"}),
}
FILE_RELATION = {"left of": "left_of", "right of": "right_of"}     # the world's predicate in a file name
QA = {"coco": ("val2017", lambda i: f"{i:012d}.jpg"), "vg": ("vg_images", lambda i: f"{i}.jpg")}
SIDES = {"left": "on the left", "right": "on the right", "top": "at the top", "bottom": "at the bottom"}
OPPOSITE_SIDE = {"left": "right", "right": "left", "top": "bottom", "bottom": "top"}
RELEASE_DIR = "data/"        # how the release's image_path starts (the reference's working directory)


def _capital(text: str) -> str:
    return text[0].upper() + text[1:]


def name(obj: dict) -> str:
    """An object as a controlled file name spells it: 'red-star' (no '_': the reference splits names on it)."""
    return f"{obj['color']}-{obj['shape']}"


def caption(a: dict, words: str, b: dict) -> str:
    return _capital(f"{with_article(a['color'] + ' ' + a['shape'])} {words} "
                    f"{with_article(b['color'] + ' ' + b['shape'])}")


def jpeg_copy(split_dir: Path, image_path: str, out: Path) -> None:
    out.parent.mkdir(exist_ok=True)
    Image.open(split_dir / image_path).convert("RGB").save(out, quality=95)


def _vertical(rels, i: int, j: int) -> bool:
    return any([i, p, j] in rels for p in ("above", "below"))


def horizontal(rec: dict) -> tuple[tuple[int, int], list[tuple[str, str]]] | None:
    """((i, j), [(image path, relation of i to j)]) of a record: its RelComp pair's two images where the pair
    moves two objects along the horizontal only, else its own image where two objects have a horizontal relation
    and no vertical one (the first such), else None."""
    rels = rec["scene"]["relations"]
    pair = rec.get("relcomp")
    if pair and pair["kind"] == "relation" and pair["triple"][1] in FILE_RELATION:
        i, pred, j = pair["triple"]
        rels_1 = relations(pair["objects_1"])
        if not (_vertical(rels, i, j) or _vertical(rels_1, i, j)) and [i, phrasings.OPPOSITE[pred], j] in rels_1:
            return (i, j), [(rec["image_path"], pred), (pair["image_1"], phrasings.OPPOSITE[pred])]
    for i, pred, j in rels:
        if pred in FILE_RELATION and not _vertical(rels, i, j):
            return (i, j), [(rec["image_path"], pred)]
    return None


def controlled_rows(split_dir: Path, main: list[dict]) -> dict[str, list[dict]]:
    """file -> rows of the two controlled subsets (their JPEG copies written)."""
    out: dict[str, list[dict]] = {f: [] for f in CONTROLLED}
    used: dict[str, set] = {f: set() for f in CONTROLLED}
    n = 0
    for rec in main:
        found = horizontal(rec)
        if found is None:
            continue
        (i, j), images = found
        file = list(CONTROLLED)[n % 2]
        n += 1
        a, b = rec["scene"]["objects"][i], rec["scene"]["objects"][j]
        if (name(a), name(b)) in used[file]:
            continue
        used[file].add((name(a), name(b)))
        folder, words = CONTROLLED[file]
        for image_path, pred in images:
            relation = pred.split()[0]                           # "left of" -> "left"
            target = f"{folder}/{name(a)}_{FILE_RELATION[pred]}_{name(b)}.jpeg"
            jpeg_copy(split_dir, image_path, split_dir / target)
            others = [caption(a, w, b) for r, w in words.items() if r != relation]
            out[file].append({"image_path": RELEASE_DIR + target,
                              "caption_options": [caption(a, words[relation], b), *others]})
    return out


def two_object_row(rec: dict, rng) -> tuple[str, str] | None:
    rels = rec["scene"]["relations"]
    if not rels:
        return None
    i, pred, j = rels[int(rng.random() * len(rels))]
    a, b = rec["scene"]["objects"][i], rec["scene"]["objects"][j]
    return (caption(a, phrasings.PREDICATE_WORDS[pred], b),
            caption(a, phrasings.PREDICATE_WORDS[phrasings.OPPOSITE[pred]], b))


def one_object_row(rec: dict) -> tuple[str, str] | None:
    objects = rec["scene"]["objects"]
    if len(objects) != 1:
        return None
    o = objects[0]
    dx, dy = o["x"] - IMAGE_SIZE / 2, o["y"] - IMAGE_SIZE / 2
    offset, side = max((abs(dx), "left" if dx < 0 else "right"), (abs(dy), "top" if dy < 0 else "bottom"))
    if offset <= REL_MARGIN:
        return None
    phrase = _capital(with_article(f"{o['color']} {o['shape']}"))
    return f"{phrase} {SIDES[side]}", f"{phrase} {SIDES[OPPOSITE_SIDE[side]]}"


def _dump(path: Path, data) -> None:
    path.write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    split_dir = Path(split_dir)
    rng = formats.rng(seed, split_dir, "whatsup")
    for file, rows in controlled_rows(split_dir, main).items():
        _dump(split_dir / file, rows)
    qa: dict[str, list] = {f"{source}_qa_{k}_obj.json": [] for source in QA for k in ("one", "two")}
    for rec in main:
        index = int(Path(rec["image_path"]).stem)
        source = "coco" if index % 2 == 0 else "vg"
        for k, row in (("two", two_object_row(rec, rng)), ("one", one_object_row(rec))):
            if row is None:
                continue
            folder, file_name = QA[source]
            jpeg_copy(split_dir, rec["image_path"], split_dir / folder / file_name(index))
            qa[f"{source}_qa_{k}_obj.json"].append([index, *row])
    for file, rows in qa.items():
        _dump(split_dir / file, rows)
