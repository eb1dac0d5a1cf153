"""``negft compare A B``: two evaluations (``results.json``) metric by metric: A, B, B − A and the paired bootstrap
test's p-value on their per-example values (``negft.results.compare``), marked better or worse by each metric's
direction. Markdown on stdout; with ``out=``, ``compare.csv`` and ``compare.json``. Its keys: ``CompareKeys``."""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass

from negft.commands.keys import fail, help_text, key, markdown_digits, parse, synopsis, wants_help, write_files
from negft.config import ConfigError, EvalCfg
from negft.fields import bounded


@dataclass(kw_only=True)
class CompareKeys:
    """The keys of ``negft compare`` (``a`` and ``b`` may be given as bare words, in that order)."""
    a: str = key(doc="the first evaluation: a results.json of eval.py, or the folder holding it")
    b: str = key(doc="the second, compared with the first (B − A)")
    out: str = key("", "a folder for compare.csv and compare.json; empty: the Markdown on stdout only")
    bootstrap: int = bounded(EvalCfg.bootstrap, lo=1, doc="resamples for the paired tests (eval.py's default, "
                                                           "so p is the one its base= gives)")
    digits: int = markdown_digits("CSV and JSON keep every digit")


README = (("Tables of models", "negft table, negft compare"),)
WHAT = ("Compare two evaluations metric by metric: A, B, B − A and a paired bootstrap test's p-value over the "
        "same examples (from the per-example values eval.py keeps in examples/values.npz; without them, the "
        "difference alone), each marked better or worse by the metric's direction.")


def synopses() -> list[tuple[str, str]]:
    return [(synopsis("negft compare", CompareKeys, ("out",), positional=True),
             "A, B, B − A and a paired test per metric")]


def help_() -> str:
    return help_text(synopses(), WHAT, CompareKeys, README, "negft/commands/compare.py, negft/results.py (compare)")


def csv_text(rows: list[dict]) -> str:
    """The comparison's rows as CSV (metric, a, b, delta, p, better, significant), floats as Python reads them back
    exactly."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, ["metric", "a", "b", "delta", "p", "better", "significant"], lineterminator="\n")
    writer.writeheader()
    for r in rows:
        writer.writerow({k: "" if v is None else repr(v) if isinstance(v, float) else v for k, v in r.items()})
    return buf.getvalue()


def main(argv: list[str]) -> int:
    """``negft compare A B [key=value ...]``: 0 with the comparison printed (and written with out=), 2 for bad
    input, 1 for a failed write."""
    if wants_help(argv):
        print(help_())
        return 0
    from negft import results
    from negft.tables import compare_table
    try:
        keys = parse(CompareKeys, argv, positional=True)
        a, b = results.read(keys.a), results.read(keys.b)
    except (ConfigError, ValueError) as e:
        return fail(str(e))
    rows = results.compare(a, b, keys.bootstrap)
    if not rows:
        return fail(f"'{a.path}' and '{b.path}' have no metric in common")
    lines = compare_table(rows, a.name, b.name, keys.digits, keys.bootstrap)
    unpaired = [f"{r.name} ({r.path.parent / results.VALUES_FILE})" for r in (a, b) if not r.values]
    if unpaired:
        lines += ["", f"No per-example values for {' and '.join(unpaired)}: differences without p-values."]
    elif any(r["p"] is None for r in rows):
        lines += ["", "p is – where a metric has no per-example values in both over the same examples (a count such "
                      "as skipped_rows; a different dataset or split)."]
    print("\n".join(lines))
    if not keys.out:
        return 0
    payload = {"a": str(a.path), "b": str(b.path), "a_name": a.name, "b_name": b.name, "bootstrap": keys.bootstrap,
               "rows": rows}
    return write_files(keys.out, {"compare.csv": csv_text(rows), "compare.json": json.dumps(payload, indent=2) + "\n"},
                       "compare")
