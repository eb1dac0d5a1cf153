"""The statistics over world seeds that the selection protocol (experiments/frontier.py) reports: intervals pooled
over seeds and paired differences over the same examples (negft.probes.stats)."""
import numpy as np
import pytest

from negft.probes.stats import bootstrap_ci, pooled_interval, pooled_paired


def test_pooled_interval_of_one_seed_is_the_probes_bootstrap_interval_and_pooling_narrows_it():
    rng = np.random.default_rng(0)
    seeds = [rng.binomial(1, 0.6, 400).astype(float) for _ in range(3)]
    assert pooled_interval(seeds[:1]) == pytest.approx(bootstrap_ci(seeds[0], 1000, 0), abs=1e-12)
    lo, hi = pooled_interval(seeds)
    one_lo, one_hi = pooled_interval(seeds[:1])
    assert lo < np.mean([s.mean() for s in seeds]) < hi and hi - lo < one_hi - one_lo


def test_paired_difference_is_per_seed_over_the_same_examples():
    rng = np.random.default_rng(1)
    b = [rng.random(300), rng.random(200)]
    d = pooled_paired([x + 0.1 for x in b], b)
    assert d["mean"] == pytest.approx(0.1) and d["ci95"] == pytest.approx([0.1, 0.1]) and d["p"] == 0.0
    assert pooled_paired(b, b)["p"] == 1.0
    mixed = pooled_paired([b[0] + 0.2, b[1] - 0.1], b)       # seeds disagree: their mean, with both listed
    assert mixed["mean"] == pytest.approx(0.05) and mixed["per_seed"] == pytest.approx([0.2, -0.1])
