"""NegCLIP's COCO training file (``train_neg_clip.tsv``) + COCO's images → relcomp shards.

    negft data convert negclip-coco TSV IMAGES out=DIR [prefix=P]

Layout (the file as ARO's authors host it, mertyg/vision-language-models-are-bows @ 81fdd20
``temp_data/train_neg_clip.tsv``, whose snapshot holds the file's git entry but not its bytes; its sibling
``temp_data/valid_neg_clip.tsv`` (4,839 rows) is there, in this layout): written by pandas ``to_csv(sep="\\t")``
with its index, so the header is ``<empty>, title, filepath, neg_caption, neg_image``; the first column is the row
number (0, 1, ...); a cell holding a tab or a double quote is quoted (``"``, doubled inside), as pandas quotes.

    title        the COCO caption
    filepath     the image, relative to where training runs: ``coco/train2014/COCO_train2014_<id:012d>.jpg``
    neg_caption  ``str(list)``: its hard captions, words of the caption swapped ("A umbrella holding a
                 flowered child ..."), 1 to 5 (a Python literal: single quotes, double where the text has one)
    neg_image    ``str(list)``: three row numbers, the rows whose images are this row's hard negatives

NegCLIP's loader (vinid/open_clip @ e680f8e ``src/training/data.py`` ``CsvDataset``; its ``params.py`` defaults
``--csv-img-key filepath --csv-caption-key title --csv-hard-captions-key neg_caption --csv-separator \\t``) reads
the two list cells with ``ast.literal_eval`` and, for each sample, each epoch: the caption, one hard caption drawn
from ``neg_caption``, one row drawn from ``neg_image`` (a position in the file: ``df[...].tolist()[j]``) whose
image, caption and one drawn hard caption of its own are the hard image's. FSC-CLIP's COCO run
(ytaek-oh/fsc-clip @ 604015d ``src/training/data.py``: ``_get_negclip_coco_dataset_fn``, ``CocoDataset``;
``--train-data="train_neg_clip"``) downloads the same file and reads ``title``, ``filepath`` (``coco/`` cut, under
``<root>/coco/images``) and one hard caption of ``neg_caption``; it does not read ``neg_image``.

IMAGES is the folder the ``filepath`` cells are relative to (the one holding ``coco/train2014/``); ``prefix=P``
replaces a leading ``P`` of the cells by IMAGES (FSC-CLIP's folders: ``IMAGES=<root>/coco/images prefix=coco/``).

One sample per usable row, keyed by its row number, image bytes unchanged:

    caption   the title
    relcomp   {caption: the title,
               negatives: its first 4 hard captions (schema.MAX_NEGATIVES), kind ``swap``; a row with more
                          (the release has up to 5) keeps the first 4, counted in ``rows_trimmed``, so the hard
                          caption drawn each epoch is one of 4 where NegCLIP draws one of up to 5,
               negative_image: ``neighbour``, the image of the first usable row of ``neg_image`` (NegCLIP draws
                          one of the three each epoch; the shards keep one) stored as ``neg.jpg``,
               negative_image_caption: that row's title,
               negative_image_negatives: all that row's hard captions (one is drawn each epoch, as NegCLIP draws)}
    negclip   {row, filepath: the cell, neg_image: the cell's rows, neighbour: the row used}

A neighbour is usable when its row number is another row of the file, showing another image file, that is
itself a usable row. Skipped and counted in ``manifest.json``: a row without the header's number of cells, an
empty title, a ``neg_caption`` cell that is not a list of texts, one with no non-empty text, a ``neg_image`` cell
that is not a list of row numbers, an image not jpg/png, an image missing, a row none of whose neighbours is
usable. No cell is evaluated: list cells are read as JSON or with ``ast.literal_eval``.

``negft.world.formats.negclip_coco.write`` writes a small example in exactly this layout with world images and
bad rows planted.
"""
from __future__ import annotations

import csv
import os
from collections import Counter
from pathlib import Path

from negft.convert.negbench import resolve
from negft.data.schema import CAPTION, MAX_NEGATIVES, RELCOMP, list_cell, literal_cell
from negft.data.shards import (IMAGE_EXTS, MISSING_IMAGE as MISSING_FILE, NO_HARD_CAPTION, ShardWriter, an_input,
                               truthy)

FILE = "train_neg_clip.tsv"
COLUMNS = ("", "title", "filepath", "neg_caption", "neg_image")      # pandas' index column first, unnamed
LAYOUT_SOURCE = ("mertyg/vision-language-models-are-bows @ 81fdd20: temp_data/train_neg_clip.tsv (hosted file; its "
                 "sibling temp_data/valid_neg_clip.tsv read for the layout: pandas to_csv with index, tab-separated, "
                 "title, filepath, neg_caption = str(list of str), neg_image = str(list of 3 row numbers)); "
                 "vinid/open_clip @ e680f8e: src/training/data.py (CsvDataset: ast.literal_eval of neg_caption and "
                 "neg_image, a hard caption and a neg_image row drawn per sample), src/training/params.py (csv keys); "
                 "ytaek-oh/fsc-clip @ 604015d: src/training/data.py (_get_negclip_coco_dataset_fn, CocoDataset)")
NEGATIVE_KIND = "swap"              # NegCLIP's hard captions swap two words or phrases of the caption
NEGATIVE_IMAGE = "neighbour"        # its hard image: a neighbour row's image
FIELD = "negclip"                   # the sample's provenance in the release

# skip reasons (manifest.json's "skipped"), besides MISSING_FILE and NO_HARD_CAPTION
MALFORMED_ROW = "row without 5 cells"
EMPTY_CAPTION = "empty title"
MALFORMED_HARD_CAPTIONS = "neg_caption not a list of texts"
MALFORMED_NEIGHBOURS = "neg_image not a list of row numbers"
BAD_TYPE = "image type not jpg/png"
NO_NEIGHBOUR = "no usable neg_image row"


def row_numbers(cell: str) -> list[int]:
    """``neg_image``: a list of row numbers, JSON or the Python literal pandas writes (``schema.literal_cell``)."""
    value = literal_cell(cell)
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ValueError(f"not a list of row numbers: {cell[:80]!r}")
    return list(value)


def read_rows(tsv) -> list[list[str]]:
    """The data rows of the file, cells as written (its header checked against ``COLUMNS``)."""
    with open(tsv, newline="", encoding="utf-8") as f:
        reader = csv.reader(f, delimiter="\t")
        header = next(reader, None)
        if header is None or tuple(header) != COLUMNS:
            raise ValueError(f"{tsv}: expected NegCLIP's header {list(COLUMNS)} (pandas' index column first), "
                             f"found {header}")
        return list(reader)


def parse(cells: list[str], images: Path, prefix: str) -> dict | str:
    """One row as {title, hard, neighbours, path, ext, filepath}, or the reason it cannot be used (the image's
    existence included: a neighbour needs it too)."""
    if len(cells) != len(COLUMNS):
        return MALFORMED_ROW
    _, title, filepath, hard, neighbours = cells
    if not title.strip():
        return EMPTY_CAPTION
    try:
        hard = list_cell(hard)
    except ValueError:
        return MALFORMED_HARD_CAPTIONS
    hard = [t for t in hard if t.strip()]
    if not hard:
        return NO_HARD_CAPTION
    try:
        neighbours = row_numbers(neighbours)
    except ValueError:
        return MALFORMED_NEIGHBOURS
    ext = IMAGE_EXTS.get(os.path.splitext(filepath)[1].lower())
    if ext is None:
        return BAD_TYPE
    path = resolve(filepath, images, prefix)
    if not path.is_file():
        return MISSING_FILE
    return {"title": title, "hard": hard, "neighbours": neighbours, "path": path, "ext": ext, "filepath": filepath}


def neighbour(i: int, rows: list) -> int | None:
    """The first of row ``i``'s ``neg_image`` rows that is another usable row showing another image."""
    for j in rows[i]["neighbours"]:
        if 0 <= j < len(rows) and j != i and isinstance(rows[j], dict) and rows[j]["path"] != rows[i]["path"]:
            return j
    return None


def record(i: int, j: int, rows: list) -> dict:
    """The sample's json: see the module docstring."""
    row, other = rows[i], rows[j]
    return {CAPTION: row["title"],
            RELCOMP: {"caption": row["title"],
                      "negatives": [{"text": t, "kind": NEGATIVE_KIND} for t in row["hard"][:MAX_NEGATIVES]],
                      "negative_image": NEGATIVE_IMAGE, "negative_image_caption": other["title"],
                      "negative_image_negatives": other["hard"]},
            FIELD: {"row": i, "filepath": row["filepath"], "neg_image": row["neighbours"], "neighbour": j}}


def convert(tsv, images, out, prefix="", maxcount="1000", progress="true") -> dict:
    """NegCLIP's ``train_neg_clip.tsv`` + IMAGES → ``out/shard-*.tar`` + ``manifest.json``; see the module
    docstring."""
    tsv = an_input(tsv, "NegCLIP file")
    images = an_input(images, "image folder", Path.is_dir, "the folder filepath's coco/train2014/... is under")
    cells = read_rows(tsv)
    inputs = {"tsv": str(tsv), "images": str(images), "prefix": prefix}
    with ShardWriter(out, "negclip-coco", LAYOUT_SOURCE, inputs, maxcount=int(maxcount),
                     progress=truthy(progress)) as writer:
        rows = [parse(c, images, prefix) for c in cells]
        trimmed, hard_counts, used_position = 0, Counter(), Counter()
        for i, row in enumerate(rows):
            if isinstance(row, str):
                writer.skip(row, f"row {i}")
                continue
            j = neighbour(i, rows)
            if j is None:
                writer.skip(NO_NEIGHBOUR, f"row {i} (neg_image {row['neighbours']})")
                continue
            other = rows[j]
            writer.add(f"{i:07d}", row["path"].read_bytes(), row["ext"], record(i, j, rows),
                       {f"neg.{other['ext']}": other["path"].read_bytes()})
            trimmed += len(row["hard"]) > MAX_NEGATIVES
            hard_counts[len(row["hard"])] += 1
            used_position[row["neighbours"].index(j)] += 1
        writer.notes.update({
            "rows": len(rows), "rows_trimmed": trimmed,
            "hard_captions_per_row": {str(k): v for k, v in sorted(hard_counts.items())},     # as manifest.json
            "neighbour_position_used": {str(k): v for k, v in sorted(used_position.items())},
            "policy": f"one sample per row: the first {MAX_NEGATIVES} hard captions, the first usable neg_image row "
                      "as the hard image with its title and all its hard captions",
        })
        manifest = writer.close()
    return {**manifest, "out": str(out)}
