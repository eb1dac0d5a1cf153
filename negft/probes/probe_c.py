"""Probe-C (004_88b1c9c2a7bbadad, section 3.2, equations 4-6): compositional understanding, Winoground-style.

Each pair is two images and two prompts that differ in one swap, ``composition`` (an attribute replaced by
its antonym: "a large star" / "a small star") or ``object`` (the object replaced: "a red star" / "a red
heart"). Text, image and group scores as in ``relcomp.winoground_scores``, overall and per swap kind, from
``probe_c.csv`` (schema.RELCOMP_CSV_COLUMNS; the world writes it, real pairs convert to it).

Where ours differs from the reference: ties count as chance, not as failures (see ``relcomp``), and pairs
are scored in batches rather than at batch size 1 (the scores are the same).
"""
from __future__ import annotations

from negft.probes import register
from negft.probes.base import Dataset, EvalContext, ProbeResult, csv_texts
from negft.probes.relcomp import captions, score_pairs


@register("probe_c", texts=csv_texts("probe_c.csv", captions))
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    return score_pairs(ctx, dataset, "probe_c.csv", f"probe_c/{dataset.name}")
