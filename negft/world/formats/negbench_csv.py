"""World training images as NegBench's fine-tuning CSVs (CC12M-NegCap, CC12M-NegMCQ) + their image folder: a
small example of the released files the converter ``negft.convert.negbench`` reads, written on demand for tests
and benches (not a format of the world build: not in ``FORMATS``).

Layout (github.com/m1k2zoo/negbench, ``synthetic_datasets/finetuning/``; the converter's docstring has it in
full): NegCap ``generate_negative_captions.py`` / ``combine_csv_files.py`` (``filepath, caption,
extracted_objects, negative_objects, negative_captions``), NegMCQ ``create_mcq.py`` / ``paraphrase_captions.py``
(``correct_answer, caption_0..3, correct_answer_template, image_path``); every CSV as
``pandas.DataFrame.to_csv(index=False)`` writes it, a list cell ``str(list)``. Image paths follow img2dataset's
``files`` layout (github.com/rom1504/img2dataset ``img2dataset/writer.py`` FilesSampleWriter:
``SSSSS/KKKKKKKKK.jpg``, 10,000 per folder).
"""
from __future__ import annotations

import csv
import io
import random
from pathlib import Path

from PIL import Image

from negft.data import schema
from negft.data.shards import MISSING_IMAGE
from negft.convert.negbench import ANSWER, ANSWER_RANGE, CAPTION, CORRUPT_IMAGE, EMPTY_CAPTION, FILEPATH, \
    IMAGE_PATH, KEPT_WITHOUT_NEGCAP, MALFORMED_ANSWER, MALFORMED_LIST, MCQ_FILE, MISSING_FIELD, NEGATIVE, \
    NEGCAP_FILE, NEGCAPS, OPTIONS, POSITIVE, TEMPLATE, UNKNOWN_TEMPLATE
from negft.world.generator import train_sample


def world_rows(n: int, seed: int, start: int = 0):
    """(jpeg bytes, world record, relative path) of world training images ``start`` .. ``start+n-1``.

    Paths follow img2dataset's ``files`` layout (``SSSSS/KKKKKKKKK.jpg``, 10,000 per folder), which is
    how the authors' ``filepath`` plausibly looks (not confirmed)."""
    for i in range(start, start + n):
        png, rec, _ = train_sample("finetune", seed, i, held_out=set())
        yield jpeg(png), rec, f"{i // 10000:05d}/{i:09d}.jpg"


def jpeg(png: bytes) -> bytes:
    """A world PNG re-encoded as JPEG (fixtures only: CC12M images are JPEGs)."""
    buf = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(buf, "JPEG", quality=90)
    return buf.getvalue()


def negcap_row(rec: dict, path: str) -> dict:
    return {FILEPATH: path, CAPTION: rec[schema.CAPTION], POSITIVE: str(rec[schema.OBJECTS]["positive"]),
            NEGATIVE: str(rec[schema.OBJECTS]["negative"]), NEGCAPS: str(rec[schema.NEGCAP])}


def mcq_row(rec: dict, path: str, modified_positive: bool = False) -> dict:
    mcq = rec[schema.MCQ]
    template = mcq["answer_template"]
    if modified_positive and template == "positive":
        template = "modified_positive"
    return {ANSWER: mcq["answer"], **dict(zip(OPTIONS, mcq["options"])), TEMPLATE: template, IMAGE_PATH: path}


def _save(images: Path, path: str, data: bytes) -> None:
    (images / path).parent.mkdir(parents=True, exist_ok=True)
    (images / path).write_bytes(data)


def write_csv(path: Path, columns, rows) -> None:
    """As pandas' ``to_csv(index=False)`` writes it: comma-separated, minimal quoting, '\\n' line ends."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)


def _good_rows(images: Path, n: int, seed: int, start: int, make_row) -> list[dict]:
    """``n`` world rows from ``start``, their images written under ``images``: ``make_row(record, path, i)``."""
    rows = []
    for i, (data, rec, path) in enumerate(world_rows(n, seed, start)):
        _save(images, path, data)
        rows.append(make_row(rec, path, i))
    return rows


def _planted(rows: list, images: Path, seed: int, start: int, make_row, plan: list, missing: set, corrupt: int,
             corrupt_bytes: bytes, plant_seed: int) -> tuple[list, dict]:
    """(``rows`` with bad rows spread among them at seeded positions, {skip reason: rows}). The bad rows are world
    rows from ``start``: row k is ``make_row(record, path)`` changed as ``plan[k]`` = (reason, {column: value})
    says (reason None: a row the converter keeps); the images of the rows in ``missing`` are not written, and row
    ``corrupt``'s is ``corrupt_bytes``."""
    extra = list(world_rows(len(plan), seed, start))
    for k, (data, _, path) in enumerate(extra):
        if k not in missing:
            _save(images, path, corrupt_bytes if k == corrupt else data)
    bad = [{**make_row(extra[k][1], extra[k][2]), **change} for k, (_, change) in enumerate(plan)]
    rng = random.Random(plant_seed)
    out = list(rows)
    for row in bad:
        out.insert(rng.randrange(len(out) + 1), row)
    skipped = {}
    for reason, _ in plan:
        if reason is not None:
            skipped[reason] = skipped.get(reason, 0) + 1
    return out, skipped


def write_negcap_example(out_dir, n, seed=0, bad=True, start=0) -> dict:
    """``out_dir/NEGCAP_FILE`` + ``out_dir/images/``: ``n`` good rows (world images ``start``..) and, with
    ``bad``, planted bad rows and one row whose ``negative_captions`` is ``[]`` (kept, without negcap). Returns
    the paths and the expected counts {good (rows with a negcap), kept_without_negcap, skipped: {reason: n}}."""
    out_dir = Path(out_dir)
    images = out_dir / "images"
    rows = _good_rows(images, n, seed, start, lambda rec, path, i: negcap_row(rec, path))
    skipped = {}
    if bad:
        plan = [(MISSING_IMAGE, {}), (MISSING_IMAGE, {}),            # rows 0 and 1: their images are missing
                (MALFORMED_LIST, {NEGCAPS: "['There is no cat', 'No dog"}), (MALFORMED_LIST, {POSITIVE: "[cat, dog]"}),
                (EMPTY_CAPTION, {CAPTION: "  "}), (MISSING_FIELD, {NEGATIVE: ""}), (None, {NEGCAPS: "[]"}),
                (CORRUPT_IMAGE, {})]
        rows, skipped = _planted(rows, images, seed, start + n, negcap_row, plan, missing={0, 1}, corrupt=7,
                                 corrupt_bytes=b"not an image", plant_seed=seed)
    write_csv(out_dir / NEGCAP_FILE, schema.NEGCAP_CSV_COLUMNS, rows)
    return {"csv": str(out_dir / NEGCAP_FILE), "images": str(images), "good": n, KEPT_WITHOUT_NEGCAP: int(bad),
            "skipped": skipped}


def write_mcq_example(out_dir, n, seed=0, bad=True, start=0) -> dict:
    """``out_dir/MCQ_FILE`` + ``out_dir/images/`` (for the same seed and rows, the good rows' images are
    those ``write_negcap_example`` writes; planted rows differ); every third positive answer is released as
    ``modified_positive``. Returns the paths and the expected counts {good, skipped, templates: released
    template → good rows}."""
    out_dir = Path(out_dir)
    images = out_dir / "images"
    rows = _good_rows(images, n, seed, start, lambda rec, path, i: mcq_row(rec, path, modified_positive=i % 3 == 0))
    templates = {}
    for row in rows:
        templates[row[TEMPLATE]] = templates.get(row[TEMPLATE], 0) + 1
    skipped = {}
    if bad:
        plan = [(MISSING_IMAGE, {}), (ANSWER_RANGE, {ANSWER: 4}), (ANSWER_RANGE, {ANSWER: -1}),
                (MALFORMED_ANSWER, {ANSWER: "two"}), (EMPTY_CAPTION, {OPTIONS[2]: ""}),
                (UNKNOWN_TEMPLATE, {TEMPLATE: "affirmation"}), (CORRUPT_IMAGE, {})]
        rows, skipped = _planted(rows, images, seed, start + n, mcq_row, plan, missing={0}, corrupt=6,
                                 corrupt_bytes=b"\x89PNG\r\n\x1a\n broken", plant_seed=seed + 1)
    write_csv(out_dir / MCQ_FILE, schema.MCQ_CSV_COLUMNS, rows)
    return {"csv": str(out_dir / MCQ_FILE), "images": str(images), "good": n, "skipped": skipped,
            "templates": dict(sorted(templates.items()))}
