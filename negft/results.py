"""An evaluation's results read back: ``results.json`` (``eval.py``) with its per-example values, and the paired
comparison of two of them (``negft compare``).

Per-example values are what a paired test needs and a mean cannot give: a run keeps them per epoch
(``examples/epoch_N.npz``), ``eval.py`` beside its ``results.json`` (``examples/values.npz``), both in the one
format ``write_values`` writes (a ``.npz``, one array per metric, ``/`` written ``__``).
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from negft.io import atomic_write

VALUES_FILE = Path("examples") / "values.npz"      # eval.py's per-example values, beside results.json


def write_values(path: Path, values: dict) -> None:
    """Per-example values {metric: array} as one ``.npz`` (a metric's ``/`` written ``__``, as npz names allow)."""
    arrays = {k.replace("/", "__"): np.asarray(v) for k, v in values.items()}
    atomic_write(path, lambda p: np.savez_compressed(p, **arrays), suffix=".npz")


def read_values(path: Path) -> dict:
    """The values ``write_values`` wrote (empty if there is no such file)."""
    if not Path(path).exists():
        return {}
    with np.load(path) as f:
        return {k.replace("__", "/"): f[k] for k in f.files}


@dataclass
class Results:
    """One evaluation: its name in a table, its metrics and 95% intervals, its per-example values (None: none
    kept, so no paired test)."""
    path: Path
    name: str
    metrics: dict
    ci95: dict = field(default_factory=dict)
    values: dict | None = None


def read(path: str | Path, name: str = "") -> Results:
    """``results.json`` at ``path`` (a file, or the folder eval wrote it in), named ``name`` or by what it records
    evaluating (``ckpt``, else ``model``, else its folder's name), with the per-example values eval.py keeps beside
    it (``VALUES_FILE``). ValueError names a file that is absent or not an evaluation's results."""
    path = Path(path)
    path = path / "results.json" if path.is_dir() else path
    if not path.is_file():
        raise ValueError(f"no results file at '{path}' (eval.py writes OUT/results.json)")
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"'{path}' is not JSON: {e}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("metrics"), dict):
        raise ValueError(f"'{path}' has no 'metrics': not an evaluation's results.json")
    values = read_values(path.parent / VALUES_FILE) or None
    name = name or str(payload.get("ckpt") or payload.get("model") or path.parent.name)
    return Results(path, name, payload["metrics"], payload.get("ci95") or {}, values)


def compare(a: Results, b: Results, n_boot: int, seed: int = 0) -> list[dict]:
    """Per metric in both (sorted): ``a``, ``b``, ``delta`` = b − a, the paired bootstrap test's ``p``
    (``negft.probes.stats.paired_p_values`` on the two files' per-example values, as eval.py's base= and a run's
    report test; None where either file kept none or the two differ in examples) and ``better``: +1 where b is
    better by the metric's direction (``negft.probes.direction``), −1 where worse, 0 where equal or the metric
    has no better side; ``significant``: whether p < ``negft.tables.SIGNIFICANT`` (only then is it better or
    worse)."""
    from negft.probes import direction
    from negft.tables import SIGNIFICANT
    from negft.probes.stats import paired_p_values
    keys = sorted(set(a.metrics) & set(b.metrics))
    p = paired_p_values(a.values, b.values, n_boot, seed) if a.values and b.values else {}
    rows = []
    for k in keys:
        delta = b.metrics[k] - a.metrics[k]
        sign = 0 if math.isnan(delta) or delta == 0 else (1 if delta > 0 else -1)
        rows.append({"metric": k, "a": a.metrics[k], "b": b.metrics[k], "delta": delta, "p": p.get(k),
                     "better": sign * direction(k), "significant": p.get(k) is not None and p[k] < SIGNIFICANT})
    return rows
