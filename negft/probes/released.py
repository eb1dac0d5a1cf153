"""Which released file a probe reads for a dataset, and how a reader reports the rows it skips.

A dataset's manifest (``negft/data_manifests/<name>.yaml``) may name, under ``probe_files``, the file each probe reads,
as its authors released it (NegBench's ``COCO_val_mcq_llama3.1_rephrased.csv`` for ``mcq_neg``, ...); a dataset
whose manifest names none (the world's split) is read under the probe's own name (``mcq.csv``, the world's).
Other manifest sections a probe reads (``zeroshot``, ``video``, ``option_templates``) come through ``section``.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path

from negft.probes.base import Dataset, ProbeResult, missing


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


def report_skips(result: ProbeResult, prefix: str, where, skipped: Counter, total: int) -> None:
    """Rows a reader left out: ``<prefix>/skipped_rows`` (a count, not a per-example metric) and a ``skipped``
    entry naming the file and the reasons. Nothing when no row was skipped."""
    n = sum(skipped.values())
    if not n:
        return
    reasons = ", ".join(f"{why}: {k}" for why, k in sorted(skipped.items()))
    result.skipped[f"{prefix}/rows"] = f"{n} of {total} rows skipped in {where} ({reasons}){cut_short(where)}"
    count_skips(result, prefix, n)


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
    from negft.probes.base import parse_once
    if not path.exists():
        return [], Counter(), missing(dataset, path)
    parsed = parse_once(path, parse)
    if parsed and parsed[0][0] == "file":
        return [], Counter(), f"{path}: {parsed[0][1]}"
    return [r for r in parsed if r[0] is not None], Counter(r[1] for r in parsed if r[0] is None), None


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
