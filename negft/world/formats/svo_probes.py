"""The world's probe images as SVO-Probes, in the released layout (google-deepmind/svo_probes ``svo_probes.csv``;
see ``negft.probes.svo_probes``): at the top of the split folder, as under the manifest's root
(``$NEGFT_DATA/svo_probes/``),

- ``svo_probes.csv``: ``sentence, pos_triplet, neg_triplet, pos_url, neg_url, pos_image_id, neg_image_id,
  subj_neg, verb_neg, obj_neg``. A sentence states one relation of a probe image, subject and object by colour
  and shape ("A red star above a blue circle"; the triplet ``red star,above,blue circle``): the world's
  predicate plays the verb. The negative image is the record's RelComp pair image when it exchanges the two
  objects' positions (``verb_neg``: the relation reversed), or another probe image with the same relation between
  another subject and the same object (``subj_neg``) or the same subject and another object (``obj_neg``); in
  every case the sentence is false of the negative image. No (sentence, image) pair is in two rows (the notebook
  keeps one score per pair). ``pos_url`` / ``neg_url`` hold the world's own image
  path (the release's hold web addresses, which no reader uses).
- ``svo_images/<id>.jpg``: JPEG copies; a probe image's id is its number, its pair image's the number plus
  ``PAIR_OFFSET``.

Randomness (which relation of a scene): ``formats.rng(seed, split_dir, "svo_probes")`` only.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from PIL import Image

from negft import phrasings
from negft.text import with_article
from negft.world import formats
from negft.world.generator import relations

FILE, IMAGES = "svo_probes.csv", "svo_images"
COLUMNS = ("sentence", "pos_triplet", "neg_triplet", "pos_url", "neg_url", "pos_image_id", "neg_image_id",
           "subj_neg", "verb_neg", "obj_neg")
PAIR_OFFSET = 1_000_000


def desc(obj: dict) -> str:
    return f"{obj['color']} {obj['shape']}"


def sentence(a: str, pred: str, b: str) -> str:
    text = f"{with_article(a)} {phrasings.PREDICATE_WORDS[pred]} {with_article(b)}"
    return text[0].upper() + text[1:]


def holds(objects: list[dict], rels, a: str, pred: str, b: str) -> bool:
    """Is "<a> <pred> <b>" true of a scene (objects named by colour and shape)?"""
    return any(p == pred and desc(objects[i]) == a and desc(objects[j]) == b for i, p, j in rels)


def _copy(split_dir: Path, image_path: str, image_id: int) -> None:
    out = split_dir / IMAGES / f"{image_id}.jpg"
    if not out.exists():
        buf = io.BytesIO()
        Image.open(split_dir / image_path).convert("RGB").save(buf, format="JPEG", quality=95)
        out.write_bytes(buf.getvalue())


def verb_row(rec: dict) -> tuple | None:
    """(sentence parts, negative objects) from the record's RelComp pair that exchanges two objects' positions."""
    pair = rec.get("relcomp")
    if not pair or pair["kind"] != "relation":
        return None
    i, pred, j = pair["triple"]
    objects = rec["scene"]["objects"]
    a, b = desc(objects[i]), desc(objects[j])
    if holds(pair["objects_1"], relations(pair["objects_1"]), a, pred, b):
        return None
    return (a, pred, b), (a, phrasings.OPPOSITE[pred], b)


def swap_row(rec: dict, others: list[dict], rng, part: int) -> tuple | None:
    """((a, pred, b), the negative's triplet, its record) with the subject (part 0) or object (part 2) changed."""
    rels = rec["scene"]["relations"]
    if not rels:
        return None
    i, pred, j = rels[int(rng.random() * len(rels))]
    objects = rec["scene"]["objects"]
    a, b = desc(objects[i]), desc(objects[j])
    for other in others:
        o_objects, o_rels = other["scene"]["objects"], other["scene"]["relations"]
        if other is rec or holds(o_objects, o_rels, a, pred, b):
            continue
        for x, p, y in o_rels:
            triplet = (desc(o_objects[x]), p, desc(o_objects[y]))
            kept = (triplet[2] == b and triplet[0] != a) if part == 0 else (triplet[0] == a and triplet[2] != b)
            if p == pred and kept:
                return (a, pred, b), triplet, other
    return None


def _flags(kind: str) -> list[str]:
    return [str(kind == k) for k in ("subj_neg", "verb_neg", "obj_neg")]


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    split_dir = Path(split_dir)
    rng = formats.rng(seed, split_dir, "svo_probes")
    (split_dir / IMAGES).mkdir(exist_ok=True)
    rows, used = [], set()

    def fresh(pos, pos_id, neg_id) -> bool:
        """No (sentence, image) pair repeats: the notebook keeps one score per pair."""
        keys = {(sentence(*pos).lower(), pos_id), (sentence(*pos).lower(), neg_id)}
        if keys & used:
            return False
        used.update(keys)
        return True

    for n, rec in enumerate(main):
        index = int(Path(rec["image_path"]).stem)
        found = verb_row(rec)
        if found is not None and fresh(found[0], index, index + PAIR_OFFSET):
            pos, neg = found
            _copy(split_dir, rec["image_path"], index)
            _copy(split_dir, rec["relcomp"]["image_1"], index + PAIR_OFFSET)
            rows.append([sentence(*pos), ",".join(pos), ",".join(neg), rec["image_path"],
                         rec["relcomp"]["image_1"], index, index + PAIR_OFFSET, *_flags("verb_neg")])
        part = n % 2 * 2
        found = swap_row(rec, main, rng, part)
        if found is not None and fresh(found[0], index, int(Path(found[2]["image_path"]).stem)):
            pos, neg, other = found
            other_index = int(Path(other["image_path"]).stem)
            _copy(split_dir, rec["image_path"], index)
            _copy(split_dir, other["image_path"], other_index)
            rows.append([sentence(*pos), ",".join(pos), ",".join(neg), rec["image_path"], other["image_path"],
                         index, other_index, *_flags("subj_neg" if part == 0 else "obj_neg")])
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(COLUMNS)
    out.writerows(rows)
    (split_dir / FILE).write_text(buf.getvalue(), encoding="utf-8")
