"""The probe registry: a probe family is one module that calls ``register``.

A probe is ``run(ctx: EvalContext, dataset: Dataset) -> ProbeResult`` and names its metrics
``<probe>/<dataset>/<metric>`` (or ``<probe>_<task>/<dataset>/<metric>``). Adding a probe is a module here
(every module of this package is imported at the end of this file, and a probe module registers itself) and a
line naming it under ``probes:`` in the manifest of each real dataset it reads (README: Adding a benchmark).

``register`` records, besides ``run``:

- ``texts(dataset) -> list[str]``, the texts ``run`` will encode, built by the same functions ``run`` calls:
  an evaluation encodes every declared text first, in one pass sorted by length, and each probe then finds its
  features cached. One pass wastes less on padding and partial batches, and an evaluation of a given suite on
  given data always batches its texts the same way, so its features (and metrics) are the same to the last bit
  whether it runs in training, in ``eval.py`` or in a patching sweep. A text left undeclared is encoded when
  asked for, in a batch of its probe's own.
- ``metrics``, the metric names it reports, per family (``<family>/<dataset>/<metric>``; a family is the
  probe's name or starts with it and ``_``), as patterns where ``<x>`` stands for a name (``acc_<x>``), without
  ``_official`` (a benchmark's own rule, beside negft's) and without ``skipped_rows``, which every family may
  report. The README's metric table lists them (``python -m negft.docs`` writes it; a test compares), and a
  test checks that every metric a probe emits is declared (``declared``).
- which of those are better lower (``lower``) or have no better direction (``unordered``: counts, shares of
  picks, feature effects); every other metric is better higher. ``direction`` reads the record: the patching
  rule's gain and drift and the metric tables' marks.
- its ``version``, recorded beside its numbers in every ledger line, ``results.json`` and model card
  (``versions``, ``negft.provenance``), as lm-evaluation-harness records each task's version.

A probe whose whole input is absent raises ``base.DataNotFound`` (``base.require``): the registry writes the
skip, ``<probe>/<dataset>``, with the path looked for and its manifest.
"""
from __future__ import annotations

import functools
import re
from typing import Callable

PROBES: dict[str, Callable] = {}
FIGURES: dict[str, Callable] = {}     # probe name -> figure(records, path), drawn from its records
TEXTS: dict[str, Callable] = {}       # probe name -> texts(dataset), the texts its run will encode
DIRECTIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}   # probe name -> (lower, unordered) names
METRICS: dict[str, dict[str, tuple[str, ...]]] = {}   # probe name -> {family: metric name patterns}
VERSIONS: dict[str, int] = {}         # probe name -> version
UNORDERED = ("skipped_rows",)         # every family's: a count of rows a reader left out
# the probes every epoch runs; SVO-Probes, VL-CheckList, ImageCoDe and EqBen (FSC-CLIP's and CE-CLIP's composition
# suite) run in `composition` and `all`, which a comparison reads, and cost each epoch's evaluation nothing here
DEFAULT_SUITE = ("mcq_neg", "retrieval", "retrieval_neg", "relcomp", "zeroshot", "geometry", "vlu", "snare",
                 "analysis", "probe_r", "probe_b", "probe_c", "aro", "sugarcrepe", "winoground", "sugarcrepe_pp",
                 "mmvp_vlm", "crepe", "spec", "valse", "ccneg", "whatsup", "negrefcocog")


def register(name: str, texts: Callable | None = None, metrics: dict | tuple = (), lower: tuple[str, ...] = (),
             unordered: tuple[str, ...] = (), version: int = 1):
    """Register ``run`` as probe ``name`` (a name registered twice is an error).

    ``metrics``: {family: metric names} (a tuple alone: the family ``name``), as patterns where ``<x>`` (any
    word in angle brackets) stands for a name of lower-case letters, digits and ``_``; ``lower`` / ``unordered``:
    those of its names (as declared, in any family) that are better lower / have no better direction.

    ``version`` (an int, 1 for a new probe): bump it when the numbers the probe reports can differ for the same
    model and the same files — a scoring or tie rule, which rows count and how, how its files are read or its
    images and videos decoded, a metric added or redefined — so that two results of one version compare number
    for number. A change that leaves every number equal (speed, messages, a refactor) keeps the version."""
    families = dict(metrics) if isinstance(metrics, dict) else ({name: tuple(metrics)} if metrics else {})

    def wrap(fn):
        if name in PROBES:
            raise ValueError(f"probe '{name}' is registered twice: by {PROBES[name].__module__} and by "
                             f"{fn.__module__}")
        _check_declaration(name, families, lower, unordered, version)

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
        METRICS[name] = {family: tuple(names) for family, names in families.items()}
        VERSIONS[name] = version
        if texts is not None:
            TEXTS[name] = texts
        return run
    return wrap


def _check_declaration(name: str, families: dict, lower, unordered, version) -> None:
    """A registration's metric names, directions and version are well formed (else ValueError, naming it)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise ValueError(f"probe '{name}': version={version!r}, expected an int >= 1")
    for family in families:
        if family != name and not family.startswith(name + "_"):
            raise ValueError(f"probe '{name}': metric family '{family}' must be '{name}' or start with '{name}_'")
    names = {m for ms in families.values() for m in ms}
    undeclared = [m for m in (*lower, *unordered) if m not in names]
    if undeclared:
        raise ValueError(f"probe '{name}': lower/unordered name {', '.join(undeclared)}, which its metrics= does "
                         "not declare")


@functools.lru_cache(maxsize=None)
def _pattern(name: str) -> re.Pattern:
    """A declared metric name as a regular expression: ``<x>`` matches a name of [a-z0-9_]."""
    parts = re.split(r"<[a-z]+>", name)
    return re.compile("[a-z0-9_]+".join(map(re.escape, parts)) + r"\Z")


def owner(family: str) -> str | None:
    """The probe that reports metric family ``family``: the longest registered name that is the family or starts
    it followed by ``_`` (``retrieval_neg`` for ``retrieval_neg``, ``aro`` for ``aro_vg_relation``); None if none."""
    owners = [p for p in PROBES if family == p or family.startswith(p + "_")]
    return max(owners, key=len) if owners else None


def _matches(metric: str, names) -> bool:
    return any(_pattern(n).match(metric) for n in names)


def declared(key: str) -> bool:
    """Whether metric ``key`` (``<family>/<dataset>/<metric>``, ``_official`` or not) is one its probe declares."""
    parts = key.split("/", 2)
    family, metric = parts[0], parts[-1].removesuffix("_official")
    probe = owner(family)
    return probe is not None and (metric in UNORDERED or _matches(metric, METRICS[probe].get(family, ())))


def direction(key: str) -> int:
    """+1 if metric ``key`` (``<family>/<dataset>/<metric>``) is better higher, −1 if better lower, 0 if it
    has no better direction, as its probe registered it; a family no probe registers is taken as better
    higher."""
    parts = key.split("/", 2)
    family, metric = parts[0], parts[-1].removesuffix("_official")
    probe = owner(family)
    lower, unordered = DIRECTIONS[probe] if probe else ((), ())
    if metric in UNORDERED or _matches(metric, unordered):
        return 0
    return -1 if _matches(metric, lower) else 1


def versions(keys) -> dict[str, int]:
    """{probe: version} of the probes that report ``keys`` (metric or skip keys, ``<family>/...``), in registry
    order; keys no probe reports are passed over."""
    probes = {owner(key.split("/", 1)[0]) for key in keys}
    return {name: VERSIONS[name] for name in PROBES if name in probes}


def pattern_errors(key: str, patterns) -> list[str]:
    """Why ``patterns`` (``<family>/<dataset>/<metric>``, ``*`` and the like allowed in the dataset) cannot name a
    metric any probe reports: a pattern of the wrong shape, or a family / metric no probe declares."""
    errors = []
    for pattern in patterns:
        parts = str(pattern).split("/")
        if len(parts) != 3 or not all(parts):
            errors.append(f"bad value '{pattern}' in '{key}': a metric is <family>/<dataset>/<metric> (e.g. "
                          "zeroshot/imagenet/top1; * for the dataset matches any)")
        elif not any(c in parts[0] + parts[2] for c in "*?[") and not declared(f"{parts[0]}/x/{parts[2]}"):
            family = owner(parts[0])
            names = (", ".join(f"{f}/<dataset>/{m}" for f, ms in METRICS[family].items() for m in ms)
                     if family else "families: " + ", ".join(sorted({f for ms in METRICS.values() for f in ms})))
            errors.append(f"bad value '{pattern}' in '{key}': no probe reports it. Valid: {names} (each also "
                          "_official)")
    return errors


def register_figure(name: str):
    def wrap(fn):
        FIGURES[name] = fn
        return fn
    return wrap


# suites by name (recipes' eval.suite, eval.py's suite=): each a tuple of probe names; a probe family not
# registered in this version is left out
SUITES = {
    "default": DEFAULT_SUITE,
    "negbench": ("mcq_neg", "retrieval", "retrieval_neg", "geometry"),
    "aro": ("aro",),
    "sugarcrepe": ("sugarcrepe",),
    "composition": ("aro", "sugarcrepe", "winoground", "snare", "probe_r", "probe_c", "relcomp", "svo_probes",
                    "vl_checklist", "imagecode", "eqben"),
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
