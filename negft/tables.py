"""Markdown tables of metrics: the one renderer behind a run's ``report.md``, ``eval.py``'s ``results.md`` and a
release's ``README.md`` (its model card).

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


HEADLINE = (("mcq_neg/world/acc", "MCQ-Neg accuracy"), ("mcq_neg/world/acc_negation", "negation-type MCQ"),
            ("retrieval_neg/world/r5", "Retrieval-Neg R@5"), ("retrieval/world/r5", "affirmative R@5"),
            ("zeroshot/world/top1", "zero-shot top-1"))


def headline(first: dict, last: dict, released: dict | None = None, frontier: str | None = None,
             digits: int = 3) -> list[str]:
    """A report's opening five lines: whether negation was learnt and what it cost, epoch 0 → last epoch
    (→ released model), each with Δ from epoch 0 and `` \*`` where a paired test gives p < 0.05.

    ``first`` / ``last``: ledger lines (``epoch``, ``metrics``, ``paired_p``); ``released``: {metrics, alpha, tower,
    p} of the patching sweep's choice (its test-split values); ``frontier``: a link to experiments/frontier.py's plot."""
    out = [f"Headline (test split; epoch 0 → epoch {last['epoch']}" + (" → released" if released else "")
           + "; Δ from epoch 0, \\* where a paired bootstrap test gives p < 0.05):", ""]
    p_last = last.get("paired_p", {})
    for key, name in HEADLINE:
        if key not in first["metrics"] or key not in last["metrics"]:
            continue
        a, b = first["metrics"][key], last["metrics"][key]
        star = " \\*" if p_last.get(key, 1.0) < 0.05 else ""
        text = f"- **{name}** (`{key}`): {a:.{digits}f} → {b:.{digits}f} ({b - a:+.{digits}f}{star})"
        if released and key in released["metrics"]:
            r = released["metrics"][key]
            star = " \\*" if released.get("p", {}).get(key, 1.0) < 0.05 else ""
            text += f" → {r:.{digits}f} ({r - a:+.{digits}f}{star})"
        out.append(text)
    if released:
        out += ["", f"Released: the last epoch patched toward the base with α = {released['alpha']} (the weight of "
                    f"the fine-tuned model; tower `{released['tower']}`), chosen on the val split by the rule in "
                    "[patch/selected.json](patch/selected.json)."]
    if frontier:
        out += ["", f"NegBench's MCQ-vs-drift frontier and negft's objective on this world: [frontier.png]({frontier}) "
                    "(experiments/frontier.py)."]
    return out + [""]
