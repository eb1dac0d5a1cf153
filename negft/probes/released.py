"""Which released file a probe reads for a dataset, and how a reader reports the rows it skips.

A dataset's manifest (``negft/data_manifests/<name>.yaml``) may name, under ``probe_files``, the file each probe reads,
as its authors released it (NegBench's ``COCO_val_mcq_llama3.1_rephrased.csv`` for ``mcq_neg``, ...); a dataset
whose manifest names none (the world's split) is read under the probe's own name (``mcq.csv``, the world's).
Other manifest sections a probe reads (``zeroshot``, ``video``, ``option_templates``) come through ``section``.
"""
from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

from negft.probes.base import DataNotFound, Dataset, ProbeResult, missing, parse_once, resolve


def manifest(dataset: Dataset) -> dict:
    """The dataset's manifest, or {} (the world's split, a test fixture, a manifest gone missing)."""
    if not dataset.manifest:
        return {}
    from negft.data import manifests
    try:
        return manifests.load(dataset.manifest)
    except FileNotFoundError:
        return {}


def section(dataset: Dataset, key: str, default=None):
    value = manifest(dataset).get(key)
    return default if value is None else value


def probe_file(dataset: Dataset, probe: str, default: str) -> tuple[Path | None, str]:
    """(the file ``probe`` reads, None when absent; the skip message naming the path looked for): the
    manifest's ``probe_files[probe]``, else the probe's own ``default`` name (the world's). A manifest that
    names a released file gets that file only: several datasets share NegBench's data/images/ folder, and a
    generic name there would be read by each of them."""
    named = (section(dataset, "probe_files", {}) or {}).get(probe)
    path = dataset.root / (named or default)
    return (path, "") if path.exists() else (None, missing(dataset, path))


def report_skips(result: ProbeResult, prefix: str, where, skipped: Counter, total: int, unit: str = "rows") -> None:
    """Rows a reader left out: ``<prefix>/skipped_rows`` (a count, not a per-example metric) and a ``skipped``
    entry naming the file and the reasons (``unit``: what the file calls a row). Nothing when none was skipped."""
    count_skips(result, prefix, note_skips(result, prefix, where, skipped, total, unit))


def note_skips(result: ProbeResult, key: str, where, skipped: Counter, total: int, unit: str = "rows") -> int:
    """The ``skipped`` entry ``<key>/rows`` naming the file ``where`` and the reasons (nothing when no ``unit`` of
    it was skipped); returns how many were, for a probe that counts the skips of several files under one
    prefix (``count_skips``)."""
    n = sum(skipped.values())
    if n:
        reasons = ", ".join(f"{why}: {k}" for why, k in sorted(skipped.items()))
        result.skipped[f"{key}/rows"] = f"{n} of {total} {unit} skipped in {where} ({reasons}){cut_short(where)}"
    return n


def read_rows(dataset: Dataset, path: Path, parse) -> tuple[list, Counter]:
    """(good rows, skipped rows by reason) of a probe's one file, whose ``parse`` gives ``(row, None)`` or ``(None,
    reason)`` per row, or ``[("file", reason)]``: DataNotFound when the file is absent (the registry skips the
    probe), ValueError with that reason when it cannot be read (``rows_to_score`` reports it)."""
    if not path.exists():
        raise DataNotFound(dataset, path)
    parsed = parse_once(path, parse)
    if parsed and parsed[0][0] == "file":
        raise ValueError(parsed[0][1])
    return [r for r, _ in parsed if r is not None], Counter(why for r, why in parsed if r is None)


def row_texts(path: Path, parse, key: str) -> list[str]:
    """Each good row's ``key`` in a probe's one file (``parse`` as for ``read_rows``): what the probe will encode;
    [] when the file is absent or cannot be read, which the probe reports when it runs."""
    if not path.exists():
        return []
    return [r[key] for r, _ in parse_once(path, parse) if isinstance(r, dict)]


def rows_to_score(result: ProbeResult, prefix: str, read, where, what: str = "row") -> list | None:
    """The rows of a probe's one file, from ``read()`` -> (rows, skipped rows by reason), its skips reported under
    ``prefix``; None, with a ``skipped`` entry saying why, when ``read`` finds the file unreadable (a ValueError)
    or no ``what`` is left to score in ``where``."""
    try:
        rows, skipped = read()
    except ValueError as e:
        result.skipped[prefix] = str(e)
        return None
    report_skips(result, prefix, where, skipped, len(rows) + sum(skipped.values()))
    if not rows:
        result.skipped.setdefault(prefix, f"no {what} to score in {where}")
        return None
    return rows


def file_rows(result: ProbeResult, key: str, read: tuple, where, what: str = "row") -> tuple[list | None, int]:
    """One file of a probe that reads several, from ``read`` = (rows, skipped rows by reason, why the file is
    skipped or None): (its rows, or None with a ``skipped`` entry ``key`` saying why when the file is skipped or
    holds no ``what`` to score; how many rows it skipped, noted under ``<key>/rows``), so that the probe counts
    the skips of all its files once (``count_skips``)."""
    rows, skipped, why = read
    if why is not None:
        result.skipped[key] = why
        return None, 0
    n = note_skips(result, key, where, skipped, len(rows) + sum(skipped.values()))
    if not rows:
        result.skipped.setdefault(key, f"no {what} to score in {where}")
        return None, n
    return rows, n


def finish(result: ProbeResult, prefix: str, n_skipped: int, records: list) -> ProbeResult:
    """``result`` of a probe that reads several files, with the rows all of them skipped counted
    (``count_skips``) and its per-example records, when it scored any."""
    count_skips(result, prefix, n_skipped)
    if records:
        result.records[prefix] = records
    return result


def count_skips(result: ProbeResult, prefix: str, n: int) -> None:
    """``<prefix>/skipped_rows``: a count, not a per-example metric; absent when no row was skipped."""
    if n:
        result.metrics[f"{prefix}/skipped_rows"] = float(n)
        result.ci95[f"{prefix}/skipped_rows"] = [float(n), float(n)]


def cut_short(path) -> str:
    """A note when a row-per-line file (CSV, JSON lines) does not end with a line break, as a download or copy
    that stopped early leaves it: its last row was probably cut, and rows after it are missing. Else ""."""
    path = Path(path)
    if path.suffix not in (".csv", ".tsv", ".jsonl", ".txt") or not path.is_file() or not path.stat().st_size:
        return ""
    with open(path, "rb") as f:
        f.seek(-1, 2)
        if f.read(1) in (b"\n", b"\r"):
            return ""
    return "; the file does not end with a line break: it looks cut short (an interrupted download or copy?)"


def read_json(path, expect: type):
    """(the file's JSON, "") or (None, why it cannot be read) for a released JSON file that must hold an
    ``expect`` (list or dict) at its top."""
    import json
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        return None, f"unreadable JSON ({type(e).__name__}: {e})"
    if not isinstance(data, expect):
        return None, f"expected a JSON {'list' if expect is list else 'object'}, found {type(data).__name__}"
    return data, ""


def parsed_rows(dataset: Dataset, path: Path, parse):
    """(good rows, skipped rows by reason, why the whole file is skipped or None) of a released file whose
    ``parse`` gives rows, ``(None, reason)`` for a bad row, or ``[("file", reason)]`` for an unreadable file
    (parsed once per version of the file)."""
    if not path.exists():
        return [], Counter(), missing(dataset, path)
    parsed = parse_once(path, parse)
    if parsed and parsed[0][0] == "file":
        return [], Counter(), f"{path}: {parsed[0][1]}"
    return [r for r in parsed if r[0] is not None], Counter(r[1] for r in parsed if r[0] is None), None


def keyed_rows(dataset: Dataset, path: Path, parse, why_not, images: str, image_field: str, row_of,
               not_counted: str | None = None) -> tuple[list[dict], Counter, str | None]:
    """(rows that can be scored, skipped rows by reason, why the whole file is skipped or None) of a released JSON
    object {id: row}, which ``parse`` gives as [(id, row)], or [(None, reason)] when the file cannot be read.
    A row is skipped under ``why_not(row)``'s reason, or when its image file (``row[image_field]`` under
    ``images``) is absent; ``not_counted`` is the reason of a row the reference leaves out too, left out silently.
    ``row_of(id, row, image)`` is the row kept."""
    if not path.exists():
        return [], Counter(), missing(dataset, path)
    parsed = parse_once(path, parse)
    if parsed and parsed[0][0] is None:
        return [], Counter(), f"{path}: {parsed[0][1]}"
    rows, skipped = [], Counter()
    for key, row in parsed:
        why = why_not(row)
        if why is not None and why == not_counted:
            continue
        if why is None:
            image = resolve(images, row[image_field])
            if not os.path.isfile(image):
                why = "image file not found"
        if why is not None:
            skipped[why] += 1
            continue
        rows.append(row_of(key, row, image))
    return rows, skipped, None


def bad_object(row, keys, unit: str = "row", may_be_empty: tuple = ()) -> str | None:
    """Why a released file's row (``unit``: what the file calls one) cannot be scored (not an object, or a text
    field missing or empty), or None. The keys in ``may_be_empty`` need only be strings: a reference that
    tokenizes "" as any text scores such a row, so its ``_official`` number must too."""
    if not isinstance(row, dict):
        return f"{unit} is not an object"
    for key in keys:
        if key in may_be_empty:
            if not isinstance(row.get(key), str):
                return f"'{key}' missing or not a string"
        elif not isinstance(row.get(key), str) or not row[key].strip():
            return f"'{key}' missing or not a non-empty string"
    return None
