"""An img2dataset download of CC12M + a NegBench CSV (NegCap or NegMCQ) → shards, joined by URL or key.

    negft data convert img2dataset FOLDER ANNOTATIONS out=DIR [kind=auto|negcap|mcq] [join=auto|url|key]
                                   [mcq=MCQ_CSV] [img_key=...] [url_key=url] [sep=,]

Layout (github.com/rom1504/img2dataset: ``img2dataset/writer.py`` WebDatasetSampleWriter / FilesSampleWriter,
``img2dataset/downloader.py`` compute_key and the meta dict, README "output format",
``dataset_examples/cc12m.md``): FOLDER holds either shards ``SSSSS.tar`` (``output_format=webdataset``, what
the CC12M example uses) or sub-folders ``SSSSS/`` (``output_format=files``, the default), each sample being
``KEY.jpg`` (``encode_format``), ``KEY.txt`` (the caption, when a caption column was given) and ``KEY.json``
({url, caption, the input's extra columns, key, status, error_message, width, height, original_width,
original_height, exif, sha256}); ``KEY`` is shard id × 10^⌈log10(number_sample_per_shard)⌉ + the row's index in
the shard, zero-padded (``000010005``). ``SSSSS.parquet`` and ``SSSSS_stats.json`` beside them hold the same
metadata for every input row, failed downloads included: they are not needed here (a failed download has no
image, so its annotation simply finds none).

The join (ANNOTATIONS per ``negbench.py``'s layouts): ``join=url`` matches the CSV's ``url_key`` column with
the json's ``url``; ``join=key`` matches the stem of the CSV's image path (``filepath`` / ``image_path``) with
img2dataset's key — right when the authors' paths are img2dataset ``files`` paths (``.../00001/000010005.jpg``)
of the same URL list, which is plausible but not confirmed. ``join=auto`` (the default) takes ``url`` for a CSV
that has a URL column and ``key`` otherwise, per CSV: the paper promises the URLs with the release, while the
NegMCQ CSV (``create_mcq.py`` keeps only ``image_path``) never has one.

One pass over the images in shard order; the annotations are held in memory (about 1 KB a row: ~10 GB for the
full 10M rows). Each image with an annotation becomes one sample as in ``negbench.py`` (with ``mcq=`` both
fields in one sample; an MCQ-only sample takes img2dataset's caption), its bytes unchanged, keyed by
img2dataset's key, ``source`` = {key, url}. ``manifest.json`` notes how many annotations found no image (each
also skipped as "missing image") and how many images no annotation.
"""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

from negft.data import schema
from negft.convert import negbench as nb
from negft.data.shards import ShardWriter

LAYOUT_SOURCE = ("github.com/rom1504/img2dataset img2dataset/writer.py (WebDatasetSampleWriter: SSSSS.tar of "
                 "KEY.jpg/.txt/.json; FilesSampleWriter: SSSSS/KEY.jpg/.txt/.json; SSSSS.parquet), "
                 "img2dataset/downloader.py (compute_key; json keys url, caption, key, status, ...), README.md")
IMAGE_EXTS = ("jpg", "jpeg", "png", "webp")      # img2dataset's encode_format choices
UNREADABLE_SHARD = "unreadable img2dataset shard"


def _groups(members):
    """{ext: bytes} of each sample from consecutive (name, read) pairs, as webdataset groups a tar."""
    key, sample = None, {}
    for name, read in members:
        stem, _, ext = name.partition(".")
        if stem != key and sample:
            yield key, sample
            sample = {}
        key = stem
        sample[ext] = read()
    if sample:
        yield key, sample


def samples(folder: Path, writer: ShardWriter):
    """(where, key, {ext: bytes}) of every sample of an img2dataset output folder, in shard order."""
    tars = sorted(p for p in folder.glob("*.tar") if p.stem.isdigit())
    subs = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.isdigit())
    if not tars and not subs:
        raise FileNotFoundError(f"{folder} holds no img2dataset output: neither SSSSS.tar shards "
                                f"(output_format=webdataset) nor SSSSS/ sub-folders (output_format=files)")
    for tar in tars:
        try:
            with tarfile.open(tar) as tf:
                members = ((m.name.rsplit("/", 1)[-1], lambda m=m: tf.extractfile(m).read())
                           for m in tf if m.isfile())
                for key, sample in _groups(members):
                    yield f"{tar.name}:{key}", key, sample
        except (tarfile.TarError, OSError) as e:
            writer.skip(UNREADABLE_SHARD, f"{tar.name} ({e})")
    for sub in subs:
        files = sorted(p for p in sub.iterdir() if p.is_file())
        for key, sample in _groups((p.name, p.read_bytes) for p in files):
            yield f"{sub.name}/{key}", key, sample


def _index(csv, kind, join, sep, cols: dict, url_key, skips: list) -> tuple[dict, str, str]:
    """{join value: (row id, fields)} of an annotation CSV's good rows (bad ones appended to ``skips``), its
    kind and join; a wrong header is a ValueError before anything is written."""
    files = nb.csv_files(csv)
    header = nb.check_columns(files, sep, [])
    if kind == "auto":
        kind = ("mcq" if nb.ANSWER in header and nb.OPTIONS[0] in header else
                "negcap" if nb.NEGCAPS in header else None)
        if kind is None:
            raise ValueError(f"{csv}: neither a NegCap CSV ({', '.join(schema.NEGCAP_CSV_COLUMNS)}) nor a NegMCQ "
                             f"CSV ({', '.join(schema.MCQ_CSV_COLUMNS)}); its columns: {', '.join(header)}. "
                             f"Pass kind=negcap|mcq and the column keys")
    if join == "auto":
        join = "url" if url_key in header else "key"
    img_key = cols["img_key"] or (nb.FILEPATH if kind == "negcap" else nb.IMAGE_PATH)
    if kind == "negcap":
        fields = {k: cols[k] for k in ("caption_key", "negcap_key", "positive_key", "negative_key")}
        required = [("img_key", img_key), *fields.items()]
    else:
        fields = nb.mcq_columns(nb.ANSWER, ",".join(nb.OPTIONS), nb.TEMPLATE)
        required = nb.mcq_required(img_key, fields)
    nb.check_columns(files, sep, required + ([("url_key", url_key)] if join == "url" else []))
    index = {}
    for where, row in nb.read_rows(files, sep):
        where = f"{kind} {where}"
        try:
            if row is None:
                raise nb.BadRow(nb.UNREADABLE_ROW)
            value = nb.text(row, url_key) if join == "url" else Path(nb.text(row, img_key)).stem
            if value in index:
                raise nb.BadRow(nb.DUPLICATE_IMAGE)
            meta = nb.negcap_fields(row, fields) if kind == "negcap" else {schema.MCQ: nb.mcq_fields(row, fields)}
            index[value] = (where, meta)
        except nb.BadRow as e:
            skips.append((e.args[0], where))
    return index, kind, join


def convert(folder, annotations, out, kind="auto", join="auto", mcq="", img_key="", url_key="url",
            caption_key=nb.CAPTION, negcap_key=nb.NEGCAPS, positive_key=nb.POSITIVE, negative_key=nb.NEGATIVE,
            sep=",", maxcount="1000") -> dict:
    """img2dataset FOLDER + NegCap or NegMCQ ANNOTATIONS (+ ``mcq=`` NegMCQ CSV) → shards; see the module doc."""
    call = nb.command("img2dataset", convert, locals())
    folder, sep = Path(folder), nb.separator(sep)
    if not folder.is_dir():
        raise FileNotFoundError(f"img2dataset folder {folder} not found")
    if kind not in ("auto", "negcap", "mcq") or join not in ("auto", "url", "key"):
        raise ValueError(f"kind must be auto|negcap|mcq and join auto|url|key, got kind={kind} join={join}")
    cols = {"img_key": img_key, "caption_key": caption_key, "negcap_key": negcap_key,
            "positive_key": positive_key, "negative_key": negative_key}
    skips = []
    indexes = [_index(annotations, kind, join, sep, cols, url_key, skips)]
    if mcq:
        indexes.append(_index(mcq, "mcq", join, sep, {**cols, "img_key": ""}, url_key, skips))
    writer = ShardWriter(out, "img2dataset", f"{LAYOUT_SOURCE}; annotations: {nb.NEGCAP_LAYOUT}; {nb.MCQ_LAYOUT}",
                         {"folder": str(folder), "annotations": str(annotations), "mcq": str(mcq),
                          "columns": cols, "url_key": url_key, "sep": sep}, maxcount=int(maxcount))
    with writer:
        for reason, where in skips:
            writer.skip(reason, where)
        no_annotation = without_negcap = 0
        for where, key, sample in samples(folder, writer):
            info = _json(sample.get("json"))
            key, url = str(info.get("key") or key), info.get("url")
            found = [ix.pop(url if j == "url" else key, None) for ix, _, j in indexes]
            found = [f for f in found if f is not None]
            if not found:
                no_annotation += 1
                continue
            meta = {nb.SOURCE: {"key": key, "url": url}}
            for _, fields in found:
                meta.update(fields)
            caption = info.get("caption") or sample.get("txt", b"").decode("utf-8", "replace")
            if schema.CAPTION not in meta and isinstance(caption, str) and caption.strip():
                meta[schema.CAPTION] = caption.strip()
            image = next((sample[e] for e in IMAGE_EXTS if e in sample), None)
            try:
                if image is None:
                    raise nb.BadRow(nb.MISSING_IMAGE)
                ext = nb.image_format(image)
            except nb.BadRow as e:
                for row, _ in found:
                    writer.skip(e.args[0], f"{row} ({where})")
                continue
            writer.add(key, image, ext, meta)
            if any(schema.OBJECTS in fields for _, fields in found) and schema.NEGCAP not in meta:
                without_negcap += 1             # a NegCap row whose negative_captions is []: kept, as NegBench keeps it
        unmatched = 0
        for ix, _, _ in indexes:
            for row, _ in ix.values():
                writer.skip(nb.MISSING_IMAGE, row)
            unmatched += len(ix)
        writer.notes["join"] = {f"{k} {Path(str(p)).name}": j for (_, k, j), p in zip(indexes, [annotations, mcq])}
        writer.notes["annotations_without_image"] = unmatched
        writer.notes["images_without_annotation"] = no_annotation
        if indexes[0][1] == "negcap":
            writer.notes[nb.KEPT_WITHOUT_NEGCAP] = without_negcap
        return {**writer.close(call), "out": str(out)}


def _json(data: bytes | None) -> dict:
    try:
        value = json.loads(data) if data else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}

