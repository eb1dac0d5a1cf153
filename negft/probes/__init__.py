"""The probe registry: a probe family is one module that calls ``register``.

A probe is ``run(ctx: EvalContext, dataset: Dataset) -> ProbeResult`` and names its metrics
``<probe>/<dataset>/<metric>`` (or ``<probe>_<task>/<dataset>/<metric>``). Adding a probe is a module here
(every module of this package is imported at the end of this file, and a probe module registers itself) and a
line naming it under ``probes:`` in the manifest of each real dataset it reads (README: Adding a probe).

``register`` records, besides ``run``:

- ``texts(dataset) -> list[str]``, the texts ``run`` will encode, built by the same functions ``run`` calls:
  an evaluation encodes every declared text first, in one pass sorted by length, and each probe then finds its
  features cached. One pass wastes less on padding and partial batches, and an evaluation of a given suite on
  given data always batches its texts the same way, so its features (and metrics) are the same to the last bit
  whether it runs in training, in ``eval.py`` or in a patching sweep. A text left undeclared is encoded when
  asked for, in a batch of its probe's own.
- which of its metrics are better lower (``lower``) or have no better direction (``unordered``: counts, shares
  of picks, feature effects); every other metric is better higher. ``direction`` reads the record: the
  patching rule's gain and drift and the metric tables' marks.

A probe whose whole input is absent raises ``base.DataNotFound`` (``base.require``): the registry writes the
skip, ``<probe>/<dataset>``, with the path looked for and its manifest.
"""
from __future__ import annotations

import fnmatch
import functools
from typing import Callable

PROBES: dict[str, Callable] = {}
FIGURES: dict[str, Callable] = {}     # probe name -> figure(records, path), drawn from its records
TEXTS: dict[str, Callable] = {}       # probe name -> texts(dataset), the texts its run will encode
DIRECTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}   # probe name -> (lower, unordered) patterns
UNORDERED = ("skipped_rows",)         # every probe's: a count of rows a reader left out
DEFAULT_SUITE = ("mcq_neg", "retrieval", "retrieval_neg", "relcomp", "zeroshot", "geometry", "vlu", "snare",
                 "analysis", "probe_r", "probe_b", "probe_c", "aro", "sugarcrepe", "winoground")


def register(name: str, texts: Callable | None = None, lower: tuple[str, ...] = (),
             unordered: tuple[str, ...] = ()):
    """Register ``run`` as probe ``name`` (a name registered twice is an error). ``lower`` / ``unordered``:
    patterns (``fnmatch``, ``*`` any part) of the metric names, the part after ``<probe>/<dataset>/`` without
    ``_official``, that are better lower / have no better direction."""
    def wrap(fn):
        if name in PROBES:
            raise ValueError(f"probe '{name}' is registered twice: by {PROBES[name].__module__} and by "
                             f"{fn.__module__}")

        @functools.wraps(fn)
        def run(ctx, dataset):
            from negft.probes.base import DataNotFound, ProbeResult
            try:
                return fn(ctx, dataset)
            except DataNotFound as absent:          # the one place a "data not found" skip is written
                result = ProbeResult()
                result.skipped[f"{name}/{dataset.name}"] = str(absent)
                return result

        PROBES[name] = run
        DIRECTIONS[name] = (tuple(lower), tuple(unordered))
        if texts is not None:
            TEXTS[name] = texts
        return run
    return wrap


def register_figure(name: str):
    def wrap(fn):
        FIGURES[name] = fn
        return fn
    return wrap


def direction(key: str) -> int:
    """+1 if metric ``key`` (``<family>/<dataset>/<metric>``) is better higher, −1 if better lower, 0 if it
    has no better direction, as its probe registered it; a family no probe registers is taken as better
    higher."""
    parts = key.split("/", 2)
    family, metric = parts[0], parts[-1].removesuffix("_official")
    owners = [p for p in DIRECTIONS if family == p or family.startswith(p + "_")]
    lower, unordered = DIRECTIONS[max(owners, key=len)] if owners else ((), ())
    if any(fnmatch.fnmatchcase(metric, p) for p in (*unordered, *UNORDERED)):
        return 0
    return -1 if any(fnmatch.fnmatchcase(metric, p) for p in lower) else 1


# suites by name (recipes' eval.suite, eval.py's suite=): each a tuple of probe names; a probe family not
# registered in this version is left out
SUITES = {
    "default": DEFAULT_SUITE,
    "negbench": ("mcq_neg", "retrieval", "retrieval_neg", "geometry"),
    "aro": ("aro",),
    "sugarcrepe": ("sugarcrepe",),
    "composition": ("aro", "sugarcrepe", "winoground", "snare", "probe_r", "probe_c", "relcomp"),
    "drift": ("zeroshot", "retrieval"),
}


def suite(spec: str) -> list[str]:
    """Probe names for ``none`` | ``all`` | a suite name | a comma-separated mix of suite and probe names
    (unknown names are an error)."""
    if spec == "none":      # smoke runs: the ledger still gets its lines, with no metrics
        return []
    if spec == "all":
        return list(PROBES)
    names = []
    for part in (s.strip() for s in spec.split(",") if s.strip()):
        if part in SUITES:
            names += [n for n in SUITES[part] if n in PROBES]
        elif part in PROBES:
            names.append(part)
        else:
            raise ValueError(f"unknown probe or suite '{part}' in suite=. Valid choices: none, all, "
                             f"{', '.join(SUITES)}, {', '.join(PROBES)}")
    return list(dict.fromkeys(names))


def _import_probe_modules() -> None:
    """Import every module of this package (in name order, so the registry's order is fixed): each probe
    module registers itself; the others (base, stats, released, ...) register nothing."""
    import importlib
    import pkgutil
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_import_probe_modules()
