"""NegBench's fine-tuning CSVs (CC12M-NegCap, CC12M-NegMCQ) + their images → shards.

    negft data convert negbench-negcap CSV IMAGES out=DIR [mcq=MCQ_CSV] [prefix=P] [img_key=...] ...
    negft data convert negbench-mcq    CSV IMAGES out=DIR [prefix=P] [img_key=...] ...

Layout (github.com/m1k2zoo/negbench, ``synthetic_datasets/finetuning/``; every CSV is written by
``pandas.DataFrame.to_csv(index=False)``: comma-separated, a list cell is ``str(list)``, i.e. a Python
literal with single quotes, an empty cell is a missing value):

* NegCap (``generate_negative_captions.py``, combined by ``combine_csv_files.py`` into
  ``cc12m_images_captioned_llama3.1_neg_captions.csv``): the columns of the CC12M input CSV — at least
  ``filepath`` (read by ``filter_negative_objects.py``) and ``caption`` — plus ``extracted_objects``
  (``process_caption_objects.py``), ``negative_objects`` (after ``filter_negative_objects.py``) and
  ``negative_captions`` (up to 3; ``[]`` when the LLM gave nothing usable for any of the row's sampled
  negative objects: ``process_captioning_task`` keeps such a row, and ``main`` writes it).
  ``benchmarks/src/training/visualize_image_dataset.py`` reads it the same way.
* NegMCQ (``create_mcq.py`` → ``final/cc12m_mcq_captions.csv``, then ``paraphrase_captions.py`` →
  ``cc12m_mcq_captions_llama3.1_rephrased[_START_END].csv``, one per job): ``correct_answer, caption_0..3,
  correct_answer_template, image_path`` — the evaluation CSVs' columns; ``image_path`` is NegCap's
  ``filepath``. No caption column and no per-option templates (the options are shuffled and paraphrased).
  ``correct_answer_template`` is ``positive | negative | hybrid`` or ``modified_positive`` ("This image
  features A.", chosen when the caption had fewer than two positive objects): an affirmation, so it is
  stored as ``positive`` with ``released_template: modified_positive`` kept beside it. The training reader
  is ``benchmarks/src/training/data.py`` ``CsvMCQDataset`` (``sep=','``).

Not confirmed: the CC12M input CSV (``cc12m_images_captions.csv``) is not in the repository, so which
extra columns NegCap carries (the paper promises URLs) is unknown; and as of the snapshot read the CC12M
CSVs themselves are not published (issue m1k2zoo/negbench#6: "slowly working on uploading"), so the file
names above are the scripts' output names. ``filepath`` is an absolute path on the authors' cluster:
``prefix=`` replaces that leading part by IMAGES (a relative path is taken under IMAGES).

One sample per image: its bytes copied unchanged (``jpg`` or ``png`` by content), keyed by the image file
name's stem, with json ``caption``, ``negcap``, ``objects`` (NegCap) and/or ``mcq`` (NegMCQ) and
``source`` ({path: the CSV's cell}). A NegCap row whose ``negative_captions`` is ``[]`` keeps its caption and
objects and has no ``negcap`` field (the caption stream reads it, the NegCap stream passes over it as
another stream's sample, and the manifest's ``fields`` count, which sets a stream's epoch, leaves it out);
the summary's ``kept_without_negcap`` counts those rows. ``convert_negcap(..., mcq=MCQ_CSV)`` writes both fields into one
sample per image in one pass over the images (the shards the NegCap and NegMCQ manifests both name); MCQ
rows whose image has no NegCap row follow as MCQ-only samples. Every skipped row is counted by reason.
Both CSV arguments also take a glob (``'..._rephrased_*.csv'``), read in sorted order.
"""
from __future__ import annotations

import csv
import glob
import io
import os
from pathlib import Path

from PIL import Image

from negft.data import schema
from negft.data.shards import MISSING_IMAGE, ShardWriter

NEGCAP_FILE = "cc12m_images_captioned_llama3.1_neg_captions.csv"
MCQ_FILE = "cc12m_mcq_captions_llama3.1_rephrased.csv"
REPO = "github.com/m1k2zoo/negbench"
NEGCAP_LAYOUT = (f"{REPO} synthetic_datasets/finetuning/generate_negative_captions.py (negative_captions = "
                 "str(list)), process_caption_objects.py (extracted_objects, negative_objects), "
                 "filter_negative_objects.py (filepath), combine_csv_files.py (file name); "
                 "benchmarks/src/training/visualize_image_dataset.py (filepath, caption, negative_captions)")
MCQ_LAYOUT = (f"{REPO} synthetic_datasets/finetuning/create_mcq.py (columns, templates incl. modified_positive), "
              "paraphrase_captions.py (file name); benchmarks/src/training/data.py CsvMCQDataset")

# the released column names (schema.py holds them), by the keyword that overrides each
FILEPATH, CAPTION, POSITIVE, NEGATIVE, NEGCAPS = schema.NEGCAP_CSV_COLUMNS
ANSWER, *OPTIONS, TEMPLATE, IMAGE_PATH = schema.MCQ_CSV_COLUMNS
# correct_answer_template as released → negft's answer_template
TEMPLATES = {"positive": "positive", "negative": "negative", "hybrid": "hybrid", "modified_positive": "positive"}
IMAGE_FORMATS = {"JPEG": "jpg", "PNG": "png"}       # what the training loader decodes
SOURCE = "source"                                   # json: where the sample came from

# skip reasons (manifest.json's "skipped")
CORRUPT_IMAGE = "corrupt image"
UNSUPPORTED_IMAGE = "image not jpg/png"
MALFORMED_LIST = "malformed list cell"
EMPTY_CAPTION = "empty caption"
KEPT_WITHOUT_NEGCAP = "kept_without_negcap"       # manifest.json: NegCap rows whose negative_captions is []
MISSING_FIELD = "missing field"
ANSWER_RANGE = "answer index out of range"
MALFORMED_ANSWER = "malformed answer index"
UNKNOWN_TEMPLATE = "unknown answer template"
UNREADABLE_ROW = "unreadable csv row"
DUPLICATE_IMAGE = "duplicate image"


class BadRow(Exception):
    """A row that cannot be converted; ``args[0]`` is the skip reason."""


# ---- reading the CSVs -------------------------------------------------------------------------------

def separator(sep: str) -> str:
    sep = {"tab": "\t", "\\t": "\t", "comma": ","}.get(sep, sep)
    if len(sep) != 1:
        raise ValueError(f"sep must be one character (or 'tab'), got {sep!r}")
    return sep


def csv_files(pattern) -> list[Path]:
    """One CSV, or the sorted files a glob matches (the release's MCQ comes in one file per job)."""
    files = sorted(Path(p) for p in glob.glob(str(pattern))) if glob.has_magic(str(pattern)) else [Path(pattern)]
    if not files or not all(f.is_file() for f in files):
        raise FileNotFoundError(f"CSV {pattern} not found")
    return files


def check_columns(files: list[Path], sep: str, required: list[tuple[str, str]]) -> list[str]:
    """The first file's header, once every file has the ``required`` (keyword, column) pairs; else a
    ValueError naming the file's columns and the keyword that picks another."""
    headers = []
    for f in files:
        with open(f, newline="", encoding="utf-8-sig") as fh:
            header = next(csv.reader(fh, delimiter=sep), [])
        headers.append(header)
        for key, column in required:
            if column not in header:
                raise ValueError(f"{f} has no column '{column}' (pass {key}=COLUMN to read another); its "
                                 f"columns: {', '.join(header) or '(none)'}"
                                 + ("; a tab-separated file needs sep=tab" if "\t" in "".join(header) else ""))
    return headers[0]


def mcq_required(img_key: str, cols: dict) -> list[tuple[str, str]]:
    return [("img_key", img_key), ("answer_key", cols["answer_key"]), ("template_key", cols["template_key"]),
            *(("options_key", c) for c in cols["options_key"])]


def read_rows(files: list[Path], sep: str):
    """(row id, {column: cell} or None for a row the csv module cannot parse), file by file."""
    csv.field_size_limit(2**31 - 1)
    for f in files:
        name = "" if len(files) == 1 else f"{f.name} "
        with open(f, newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh, delimiter=sep)
            while True:
                try:
                    row = next(reader)
                except StopIteration:
                    break
                except csv.Error:
                    row = None
                yield f"{name}line {reader.line_num}", row


def text(row: dict, column: str, empty: str = MISSING_FIELD) -> str:
    value = row.get(column)
    if value is None:                       # a short row
        raise BadRow(MISSING_FIELD)
    value = value.strip()
    if not value:
        raise BadRow(empty)
    return value


def str_list(row: dict, column: str) -> list[str]:
    """A list cell: JSON, else a Python literal (what ``str(list)`` writes; never ``eval``)."""
    try:
        value = schema.list_cell(text(row, column))
    except ValueError:
        raise BadRow(MALFORMED_LIST) from None
    return [v.strip() for v in value if v.strip()]


def negcap_fields(row: dict, cols: dict) -> dict:
    """caption, objects and negcap of a NegCap row; no ``negcap`` when its list is empty (the generator writes
    ``[]`` when the LLM gave nothing: the caption and objects are still good)."""
    caption = text(row, cols["caption_key"], EMPTY_CAPTION)
    negcap = str_list(row, cols["negcap_key"])
    objects = {"positive": str_list(row, cols["positive_key"]), "negative": str_list(row, cols["negative_key"])}
    fields = {schema.CAPTION: caption, schema.OBJECTS: objects}
    if negcap:
        fields[schema.NEGCAP] = negcap
    return fields


def mcq_fields(row: dict, cols: dict) -> dict:
    options = [text(row, c, EMPTY_CAPTION) for c in cols["options_key"]]
    try:
        number = float(text(row, cols["answer_key"]))       # pandas writes 2.0 once a column has a gap
    except ValueError:
        raise BadRow(MALFORMED_ANSWER) from None
    if not number.is_integer():
        raise BadRow(MALFORMED_ANSWER)
    if not 0 <= number < len(options):
        raise BadRow(ANSWER_RANGE)
    released = text(row, cols["template_key"])
    if released not in TEMPLATES:
        raise BadRow(UNKNOWN_TEMPLATE)
    mcq = {"options": options, "answer": int(number), "answer_template": TEMPLATES[released]}
    if released != TEMPLATES[released]:
        mcq["released_template"] = released
    return mcq


def mcq_columns(answer_key, options_key, template_key) -> dict:
    options = [c.strip() for c in str(options_key).split(",")]
    if len(options) != schema.N_OPTIONS:
        raise ValueError(f"options_key needs {schema.N_OPTIONS} comma-separated columns, got {options_key!r}")
    return {"answer_key": answer_key, "options_key": options, "template_key": template_key}


# ---- images ------------------------------------------------------------------------------------------

def image_format(data: bytes) -> str:
    """``jpg`` or ``png`` for bytes PIL opens and verifies (cheap: no full decode); else BadRow."""
    if not data:
        raise BadRow(CORRUPT_IMAGE)
    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = im.format
            im.verify()
    except Exception:
        raise BadRow(CORRUPT_IMAGE) from None
    if fmt not in IMAGE_FORMATS:
        raise BadRow(UNSUPPORTED_IMAGE)
    return IMAGE_FORMATS[fmt]


def resolve(cell: str, images: Path, prefix: str) -> Path:
    """An image path from the CSV: ``prefix`` replaced by IMAGES, a relative path under IMAGES."""
    if prefix and cell.startswith(prefix):
        cell = cell[len(prefix):].lstrip("/")
    return Path(os.path.normpath(cell if os.path.isabs(cell) else images / cell))


def read_image(path: Path) -> tuple[bytes, str]:
    try:
        data = path.read_bytes()
    except OSError:
        raise BadRow(MISSING_IMAGE) from None
    return data, image_format(data)


def _images_dir(images) -> Path:
    images = Path(images)
    if not images.is_dir():
        raise FileNotFoundError(f"image folder {images} not found")
    return images


def command(name: str, fn, args: dict, positional: int = 2) -> str:
    """The ``negft data convert`` line that repeats a call: ``fn``'s first arguments, then every keyword
    that differs from its default (recorded in manifest.json)."""
    import inspect
    params = list(inspect.signature(fn).parameters.values())
    words = [str(args[p.name]) for p in params[:positional]]
    words += [f"{p.name}={args[p.name]}" for p in params[positional:]
              if p.default is inspect.Parameter.empty or str(args[p.name]) != str(p.default)]
    return " ".join(["negft", "data", "convert", name, *words])


# ---- converters ----------------------------------------------------------------------------------------

def convert_negcap(csv, images, out, mcq="", prefix="", img_key=FILEPATH, caption_key=CAPTION,
                   negcap_key=NEGCAPS, positive_key=POSITIVE, negative_key=NEGATIVE, mcq_img_key=IMAGE_PATH,
                   sep=",", maxcount="1000") -> dict:
    """CC12M-NegCap CSV (+ optionally the NegMCQ CSV of the same images) → shards; see the module doc."""
    call = command("negbench-negcap", convert_negcap, locals())
    sep, images = separator(sep), _images_dir(images)
    files = csv_files(csv)
    cols = {"img_key": img_key, "caption_key": caption_key, "negcap_key": negcap_key,
            "positive_key": positive_key, "negative_key": negative_key}
    check_columns(files, sep, list(cols.items()))
    mcq_cols = mcq_columns(ANSWER, ",".join(OPTIONS), TEMPLATE)
    mcq_files = csv_files(mcq) if mcq else []
    if mcq:
        check_columns(mcq_files, sep, [("mcq_img_key", mcq_img_key)] + mcq_required(mcq_img_key, mcq_cols)[1:])
    writer = ShardWriter(out, "negbench-negcap" + ("+mcq" if mcq else ""),
                         NEGCAP_LAYOUT + ("; " + MCQ_LAYOUT if mcq else ""),
                         {"csv": str(csv), "images": str(images), "mcq": str(mcq), "prefix": prefix,
                          "columns": cols, "sep": sep}, maxcount=int(maxcount))
    without_negcap = 0
    with writer:
        pending = _mcq_index(mcq_files, sep, mcq_img_key, mcq_cols, images, prefix, writer) if mcq else {}
        for where, row in read_rows(files, sep):
            try:
                if row is None:
                    raise BadRow(UNREADABLE_ROW)
                cell = text(row, img_key)
            except BadRow as e:
                writer.skip(e.args[0], where)
                continue
            path = resolve(cell, images, prefix)
            meta, rows = {SOURCE: {"path": cell}}, []
            try:
                meta.update(negcap_fields(row, cols))
                rows.append(where)
            except BadRow as e:
                writer.skip(e.args[0], where)
            question = pending.pop(str(path), None)
            if question is not None:            # this image's MCQ joins the same sample
                meta[schema.MCQ] = question[1][schema.MCQ]
                rows.append(question[0])
            if rows and _write(writer, path, meta, rows) and schema.CAPTION in meta and schema.NEGCAP not in meta:
                without_negcap += 1
        for path, (where, meta) in pending.items():       # MCQ rows of images NegCap does not have
            _write(writer, Path(path), meta, [where])
        writer.notes[KEPT_WITHOUT_NEGCAP] = without_negcap
        if mcq:                                 # a NegCap row's sample has a caption, an MCQ-only one none
            negcap, questions = writer.fields[schema.CAPTION], writer.fields[schema.MCQ]
            both = negcap + questions - writer.samples
            writer.notes["merged"] = {"negcap_and_mcq": both, "negcap_only": negcap - both,
                                      "mcq_only": questions - both}
        return {**writer.close(call), "out": str(out)}


def _write(writer: ShardWriter, path: Path, meta: dict, rows: list[str]) -> bool:
    """Add one sample, or skip every row it came from (each counted) when its image cannot be read."""
    try:
        data, ext = read_image(path)
    except BadRow as e:
        for where in rows:
            writer.skip(e.args[0], where)
        return False
    writer.add(path.stem, data, ext, meta)
    return True


def _mcq_index(files, sep, img_key, cols, images, prefix, writer) -> dict:
    """{resolved image path: (row id, {source, mcq})} of the good MCQ rows; bad ones are counted."""
    index = {}
    for where, row in read_rows(files, sep):
        where = f"mcq {where}"
        try:
            if row is None:
                raise BadRow(UNREADABLE_ROW)
            cell = text(row, img_key)
            path = str(resolve(cell, images, prefix))
            if path in index:
                raise BadRow(DUPLICATE_IMAGE)
            index[path] = (where, {SOURCE: {"path": cell}, schema.MCQ: mcq_fields(row, cols)})
        except BadRow as e:
            writer.skip(e.args[0], where)
    return index


def convert_mcq(csv, images, out, prefix="", img_key=IMAGE_PATH, answer_key=ANSWER,
                options_key=",".join(OPTIONS), template_key=TEMPLATE, caption_key=CAPTION, sep=",",
                maxcount="1000") -> dict:
    """CC12M-NegMCQ CSV → shards of ``mcq`` samples (+ ``caption`` when the file has that column)."""
    call = command("negbench-mcq", convert_mcq, locals())
    sep, images = separator(sep), _images_dir(images)
    files = csv_files(csv)
    cols = mcq_columns(answer_key, options_key, template_key)
    header = check_columns(files, sep, mcq_required(img_key, cols))
    has_caption = caption_key in header
    writer = ShardWriter(out, "negbench-mcq", MCQ_LAYOUT,
                         {"csv": str(csv), "images": str(images), "prefix": prefix,
                          "columns": {"img_key": img_key, **cols}, "sep": sep}, maxcount=int(maxcount))
    templates = {}
    with writer:
        for where, row in read_rows(files, sep):
            try:
                if row is None:
                    raise BadRow(UNREADABLE_ROW)
                cell = text(row, img_key)
                meta = {SOURCE: {"path": cell}, schema.MCQ: mcq_fields(row, cols)}
                if has_caption:
                    meta[schema.CAPTION] = text(row, caption_key, EMPTY_CAPTION)
            except BadRow as e:
                writer.skip(e.args[0], where)
                continue
            if _write(writer, resolve(cell, images, prefix), meta, [where]):
                released = meta[schema.MCQ].get("released_template", meta[schema.MCQ]["answer_template"])
                templates[released] = templates.get(released, 0) + 1
        writer.notes["answer_templates"] = dict(sorted(templates.items()))
        return {**writer.close(call), "out": str(out)}

