"""Markdown tables of metrics: the one renderer behind a run's ``report.md``, ``eval.py``'s ``results.md`` and a
release's ``MODEL_CARD.md``.

One row per metric, one column per evaluation (a value with its 95% interval), and, against a reference
evaluation (epoch 0, the base model), the change of the last column, starred where a paired test gives
p < 0.05. A metric's better side is its probe's record (``negft.probes.direction``): ``↓`` marks a metric that is
better lower, ``·`` one with no better direction; every other metric is better higher.
"""
from __future__ import annotations

import math

MARKS = {-1: " ↓", 0: " ·", 1: ""}
LEGEND = ("↓: better lower; ·: no better direction (a count, a share of picks, a feature effect); every other "
          "metric is better higher.")


def cell(value, ci=None, digits: int = 3) -> str:
    """``value [lo, hi]``; ``–`` for a value that is absent or NaN."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{value:.{digits}f}"
    if ci:
        text += f" [{ci[0]:.{digits}f}, {ci[1]:.{digits}f}]"
    return text


def metric_table(columns: list[tuple[str, dict, dict | None]], keys: list[str] | None = None,
                 reference: dict | None = None, p_values: dict | None = None, p_column: bool = False,
                 digits: int = 3) -> list[str]:
    """The markdown lines of a metric table.

    ``columns``: (header, metrics, ci95) per evaluation. ``keys``: the rows (default: every metric of every
    column, sorted). ``reference``: adds the column Δ = last column − reference, with `` \\*`` where
    ``p_values`` gives p < 0.05; ``p_column``: the p-values in a column of their own. A legend follows the
    table when a row is marked.
    """
    from negft.probes import direction
    keys = sorted({k for _, metrics, _ in columns for k in metrics}) if keys is None else keys
    p_values = p_values or {}
    headers = ["metric", *(h for h, _, _ in columns)] + (["Δ"] if reference is not None else []) \
        + (["p"] if p_column else [])
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    marked = False
    for k in keys:
        mark = MARKS[direction(k)]
        marked = marked or bool(mark)
        cells = [k + mark] + [cell(metrics.get(k), (ci or {}).get(k), digits) for _, metrics, ci in columns]
        if reference is not None:
            first, last = reference.get(k), columns[-1][1].get(k)
            delta = f"{last - first:+.{digits}f}" if first is not None and last is not None else "–"
            cells.append(delta + (" \\*" if p_values.get(k, 1.0) < 0.05 else ""))
        if p_column:
            cells.append(f"{p_values.get(k, math.nan):.3g}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines + (["", LEGEND] if marked else [])
