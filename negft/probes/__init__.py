"""The probe registry: a probe family is one module that calls ``register``.

A probe is ``run(ctx: EvalContext, dataset: Dataset) -> ProbeResult`` and names its metrics
``<probe>/<dataset>/<metric>``. Adding a probe is adding a module here and importing it below.

A probe may also declare ``texts(dataset) -> list[str]``, the texts its ``run`` will encode: an evaluation
encodes every declared text first, in one pass sorted by length, and each probe then finds its features
cached. One pass wastes less on padding and partial batches, and an evaluation of a given suite on given
data always batches its texts the same way, so its features (and metrics) are the same to the last bit
whether it runs in training, in ``eval.py`` or in a patching sweep. A text left undeclared is encoded when
asked for, in a batch of its probe's own.
"""
from __future__ import annotations

from typing import Callable

PROBES: dict[str, Callable] = {}
FIGURES: dict[str, Callable] = {}     # probe name -> figure(records, path), drawn from its records
TEXTS: dict[str, Callable] = {}       # probe name -> texts(dataset), the texts its run will encode
DEFAULT_SUITE = ("mcq_neg", "retrieval", "retrieval_neg", "relcomp", "zeroshot", "geometry", "vlu", "snare",
                 "analysis", "probe_r", "probe_b", "probe_c", "aro", "sugarcrepe", "winoground")


def register(name: str, texts: Callable | None = None):
    def wrap(fn):
        PROBES[name] = fn
        if texts is not None:
            TEXTS[name] = texts
        return fn
    return wrap


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


from negft.probes import analysis, aro, geometry, mcq_neg, probe_b, probe_c, probe_r, relcomp, retrieval, snare, \
    sugarcrepe, vlu, winoground, zeroshot  # noqa: E402,F401  (registration)
