"""``negft table``: the table papers print, one row per model (an evaluation's ``results.json``), one column per
benchmark score (``negft.tables.PAPER_COLUMNS``), as Markdown and, with ``out=``, a CSV with each cell's 95% interval
beside it. Its keys: ``TableKeys``; the results files are its bare words."""
from __future__ import annotations

import csv
import io
from dataclasses import dataclass

from negft.commands.keys import (fail, help_text, is_bare, key, markdown_digits, parse, synopsis, wants_help, wrap,
                                 write_files)
from negft.config import ConfigError
from negft.fields import choice
from negft.tables import RULES


@dataclass(kw_only=True)
class TableKeys:
    """The keys of ``negft table`` (the results files are its bare words)."""
    out: str = key("", "a folder for table.md and table.csv; empty: the Markdown on stdout only")
    names: str = key("", "the rows' names, comma-separated, one per results file; empty: the checkpoint each records")
    rule: str = choice("official", RULES, doc="official: each benchmark's own rule, as papers print it; negft: "
                                              "negft's tie-aware rule")
    ci: bool = key(False, "true: each Markdown cell with its 95% interval (the CSV has them always)")
    digits: int = markdown_digits("the CSV keeps every digit")


WHAT = ("The table papers print: one row per model (a results.json of eval.py, or the folder holding it), one "
        "column per benchmark score (ARO, SugarCrepe, NegBench, zero-shot ImageNet, ...); a column no results file "
        "has is left out.")
README = (("Tables of models", "negft table, its columns, negft compare"),)


def synopses() -> list[tuple[str, str]]:
    return [(synopsis("negft table RESULTS.json [RESULTS.json ...]", TableKeys, ("out", "names")),
             "the table papers print, one row per model")]


def help_() -> str:
    from negft.tables import PAPER_COLUMNS
    columns = [wrap(f"  {c.header}: {c.key} (official: {c.metric('official')})", 4) for c in PAPER_COLUMNS]
    return help_text(synopses(), WHAT, TableKeys, README, "negft/commands/table.py, negft/tables.py (PAPER_COLUMNS)",
                     ["", "columns (negft/tables.py PAPER_COLUMNS; a world evaluation's in one of its own, headed "
                          "<family>/world/...):",
                      *columns])


def _exact(x) -> str:
    """A float as Python reads it back exactly (``repr``); empty for None."""
    return "" if x is None else repr(float(x))


def csv_text(headers: list[str], rows: list[list]) -> str:
    """``paper_rows`` as CSV: ``model``, then per column its value, ``<col>_lo`` and ``<col>_hi`` (``_exact``); an
    absent cell is empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["model", *(f"{h}{s}" for h in headers for s in ("", "_lo", "_hi"))])
    for name, *cells in rows:
        line = [name]
        for c in cells:
            value, ci = c or (None, None)
            line += [_exact(value), *map(_exact, ci or (None, None))]
        writer.writerow(line)
    return buf.getvalue()


def main(argv: list[str]) -> int:
    """``negft table FILES [key=value ...]``: 0 with the table printed (and written with out=), 2 for bad input,
    1 for a failed write."""
    if wants_help(argv):
        print(help_())
        return 0
    from negft import results
    from negft.tables import paper_rows, paper_table
    files = [w for w in argv if is_bare(w)]
    try:
        keys = parse(TableKeys, [w for w in argv if not is_bare(w)])
        if not files:
            raise ConfigError("no results file: name one or more (eval.py's OUT/results.json)")
        names = keys.names.split(",") if keys.names else [""] * len(files)
        if len(names) != len(files):
            raise ConfigError(f"names= gives {len(names)} names for {len(files)} results files")
        read = [results.read(f, n) for f, n in zip(files, names)]
    except (ConfigError, ValueError) as e:
        return fail(str(e))
    headers, rows = paper_rows([(r.name, r.metrics, r.ci95) for r in read], keys.rule)
    if not headers:
        return fail("none of the results files has a metric of the table's columns (negft table --help lists them)")
    markdown = "\n".join(paper_table(headers, rows, keys.ci, keys.digits)) + "\n"
    print(markdown, end="")
    if not keys.out:
        return 0
    return write_files(keys.out, {"table.md": markdown, "table.csv": csv_text(headers, rows)}, "table")
