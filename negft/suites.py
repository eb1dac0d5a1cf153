"""The probe suites by name (recipes' ``eval.suite``, eval.py's and negft patch's ``suite=``), apart from the probes
themselves (``negft.probes``, which imports every probe module and torch), so that ``--help`` can list them at once.
A probe a suite names that is not registered in this version is left out (``negft.probes.suite``)."""
from __future__ import annotations

DEFAULT_SUITE = ("mcq_neg", "retrieval", "retrieval_neg", "relcomp", "zeroshot", "geometry", "vlu", "snare",
                 "analysis", "probe_r", "probe_b", "probe_c", "aro", "sugarcrepe", "winoground", "sugarcrepe_pp",
                 "mmvp_vlm", "crepe", "spec", "valse", "ccneg", "whatsup", "negrefcocog")

# each a tuple of probe names
SUITES = {
    "default": DEFAULT_SUITE,
    "negbench": ("mcq_neg", "retrieval", "retrieval_neg", "geometry"),
    "aro": ("aro",),
    "sugarcrepe": ("sugarcrepe",),
    "composition": ("aro", "sugarcrepe", "winoground", "snare", "probe_r", "probe_c", "relcomp"),
    "drift": ("zeroshot", "retrieval"),
}
