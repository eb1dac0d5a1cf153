"""World RelComp images as NegCLIP's COCO training file and image folder: a small example of the released files the
converter ``negft.convert.negclip_coco`` reads, written on demand for tests (not a format of the world build: not
in ``FORMATS``).

Layout (the converter's docstring; mertyg/vision-language-models-are-bows @ 81fdd20 ``temp_data/*_neg_clip.tsv``):
``train_neg_clip.tsv`` as pandas ``to_csv(sep="\\t")`` writes it — the unnamed index column, ``title``,
``filepath``, ``neg_caption`` (``str(list)``), ``neg_image`` (``str(list)`` of three row numbers), a cell quoted
where it holds a double quote — and the images at ``coco/train2014/COCO_train2014_<id:012d>.jpg``.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

import numpy as np
from PIL import Image

from negft.convert.negclip_coco import BAD_TYPE, COLUMNS, EMPTY_CAPTION, FILE, MALFORMED_HARD_CAPTIONS, \
    MALFORMED_NEIGHBOURS, MALFORMED_ROW, MISSING_FILE, NO_HARD_CAPTION, NO_NEIGHBOUR
from negft.data.schema import MAX_NEGATIVES, RELCOMP
from negft.world import generator as world

PICTURE = "a picture of "
# planted rows (``bad``): row -> what is wrong with it; row 0's first neighbour is row 1, so its second is used
PLANTED = {1: MISSING_FILE, 2: EMPTY_CAPTION, 3: NO_HARD_CAPTION, 4: MALFORMED_HARD_CAPTIONS, 5: MALFORMED_NEIGHBOURS,
           6: NO_NEIGHBOUR, 7: BAD_TYPE, 8: MALFORMED_ROW}
QUOTED = 9          # a row whose texts hold an apostrophe: Python writes them in double quotes, pandas quotes the cell


def rephrased(text: str) -> str:
    """The same statement in another of the world's RelComp templates: with or without "a picture of"."""
    if text.lower().startswith(PICTURE):
        rest = text[len(PICTURE):]
        return rest[0].upper() + rest[1:]
    return PICTURE[0].upper() + PICTURE[1:] + text[0].lower() + text[1:]


def hard_captions(negatives: list[str], count: int) -> list[str]:
    """``count`` (1 to 5, as in the release) hard captions: the world's swaps, then rephrased ones."""
    return (negatives + [rephrased(t) for t in negatives])[:count]


def write(out_dir, n: int, seed: int = 0, bad: bool = True) -> dict:
    """``n`` world RelComp images under ``out_dir`` as ``train_neg_clip.tsv`` + ``coco/train2014/``. A row's hard
    captions are its image's swapped captions (1 to 5 of them, cycling); its three neighbours are other good rows,
    drawn. ``bad`` plants ``PLANTED``'s rows (``n`` > 12). Returns the paths, the rows as written (``title``,
    ``filepath``, ``neg_caption`` and ``neg_image`` parsed) and what the converter should count."""
    out_dir = Path(out_dir)
    folder = out_dir / "coco" / "train2014"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng([seed, 2014])
    planted = PLANTED if bad else {}
    good = [i for i in range(n) if i not in planted]
    rows = []
    for i in range(n):
        png, rec, _ = world.train_sample("relcomp", seed, i, held_out=set())
        suffix = " in the world's picture" if i == QUOTED else ""
        filepath = f"coco/train2014/COCO_train2014_{100 + 3 * i:012d}.{'gif' if planted.get(i) == BAD_TYPE else 'jpg'}"
        others = [j for j in good if j != i]
        rows.append({"title": rec[RELCOMP]["caption"] + suffix, "filepath": filepath,
                     "neg_caption": hard_captions([t["text"] + suffix for t in rec[RELCOMP]["negatives"]], 1 + i % 5),
                     "neg_image": [int(j) for j in rng.choice(others, 3, replace=False)]})
        if planted.get(i) != MISSING_FILE:
            Image.open(io.BytesIO(png)).convert("RGB").save(out_dir / filepath, format="JPEG", quality=90)
    cells = [[str(i), r["title"], r["filepath"], str(r["neg_caption"]), str(r["neg_image"])] for i, r in enumerate(rows)]
    if bad:
        rows[0]["neg_image"][0] = 1
        rows[2]["title"] = ""
        rows[3]["neg_caption"] = []
        rows[6]["neg_image"] = [n + 5, 6, 1]               # out of the file, itself, a row whose image is missing
        for i in (0, 2, 3, 6):
            cells[i] = [str(i), rows[i]["title"], rows[i]["filepath"], str(rows[i]["neg_caption"]),
                        str(rows[i]["neg_image"])]
        cells[4][3] = cells[4][3][:-2]                    # the list cut short
        cells[5][4] = "[3, 7"
        cells[8] = cells[8][:4]                           # the neg_image cell lost
    with open(out_dir / FILE, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n")      # pandas' quoting: minimal, with '"'
        writer.writerow(COLUMNS)
        writer.writerows(cells)
    skipped = {}
    for reason in planted.values():
        skipped[reason] = skipped.get(reason, 0) + 1
    kept = [i for i in range(n) if i not in planted]
    return {"tsv": str(out_dir / FILE), "images": str(out_dir), "rows": rows, "kept": kept,
            "convert": {"samples": len(kept), "skipped": skipped,
                        "rows_trimmed": sum(len(rows[i]["neg_caption"]) > MAX_NEGATIVES for i in kept)}}
