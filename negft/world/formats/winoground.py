"""The world's RelComp pairs as Winoground, in its released layout (facebook/winoground ``data/examples.jsonl``:
one JSON object a line with ``id, caption_0, caption_1, image_0, image_1, tag, secondary_tag, num_main_preds,
collapsed_tag``; ``image_k`` a file stem of ``images/<stem>.png`` beside it).

Where the files sit: ``examples.jsonl`` at the top of the split folder, the same relative path as under the
manifest's root (``$NEGFT_DATA/winoground/examples.jsonl``). The pair images are already the split's
``images/<stem>.png``, so ``image_k`` names them by stem and nothing is copied.

Each pair: image 1 is image 0 with two related objects' positions or colours exchanged (``world.relcomp_pair``);
caption k is true of image k only, and, as Winoground requires, both captions have the same words in a
different order:

- positions exchanged: "A red star positioned to the left of a blue circle" / "A blue circle positioned to the
  left of a red star" (the noun phrases swapped: Winoground's ``collapsed_tag`` Object, ``tag`` Noun). The
  world's relcomp.csv says the opposite predicate instead, which changes the words.
- colours exchanged: "A red star ... a blue circle" / "A blue star ... a red circle" (the world's captions; the
  adjectives swapped: collapsed_tag Relation, which in Winoground covers swapped verbs, adjectives,
  prepositions and adverbs; ``tag`` Adjective-Color).

``num_main_preds`` is 1 (one relation) and ``secondary_tag`` empty (no visual tag applies). No randomness.
"""
from __future__ import annotations

import json
from pathlib import Path

from negft import phrasings

FILE = "examples.jsonl"
KEYS = ("id", "caption_0", "caption_1", "tag", "secondary_tag", "num_main_preds", "collapsed_tag", "image_0",
        "image_1")
TAGS = {"relation": ("Noun", "Object"), "attribute": ("Adjective-Color", "Relation")}   # kind -> (tag, collapsed)


def stem(image_path: str) -> str:
    """``images/000012_pair.png`` -> ``000012_pair`` (Winoground names an image by its stem)."""
    return Path(image_path).stem


def example(rec: dict, index: int) -> dict | None:
    """The Winoground line of one probe record's RelComp pair, or None without a pair."""
    pair = rec.get("relcomp")
    if not pair:
        return None
    caption_0, caption_1 = pair["caption_0"], pair["caption_1"]
    if pair["kind"] == "relation":
        i, pred, j = pair["triple"]
        objects = rec["scene"]["objects"]
        caption_0 = phrasings.relcomp_caption(objects[i], pred, objects[j], pair["template"])
        caption_1 = phrasings.relcomp_caption(objects[j], pred, objects[i], pair["template"])
    tag, collapsed = TAGS[pair["kind"]]
    return {"id": index, "caption_0": caption_0, "caption_1": caption_1, "tag": tag, "secondary_tag": "",
            "num_main_preds": 1, "collapsed_tag": collapsed, "image_0": stem(rec["image_path"]),
            "image_1": stem(pair["image_1"])}


def write_examples(path: Path, rows: list[dict]) -> None:
    """``examples.jsonl`` in the released key order."""
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps({k: row[k] for k in KEYS}) + "\n")


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    rows = []
    for rec in main:
        row = example(rec, len(rows))
        if row is not None:
            rows.append(row)
    write_examples(Path(split_dir) / FILE, rows)
