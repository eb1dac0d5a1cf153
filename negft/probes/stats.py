"""Tie-aware scoring and bootstrap intervals shared by the probes.

Ties never favour the right answer: a right answer tied with k−1 others earns 1/k (the expected
score under a random tie-break), so all-equal scores give chance, not 100%. (NegBench's eval CSVs
put the right answer at index 0 and its argmax then wins every tie.)
"""
from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np
import torch


def _count(mask: torch.Tensor) -> torch.Tensor:
    """True entries per row of a (N, C) bool mask; summing bools into int32 is several times faster than
    the default int64 sum (a retrieval probe counts millions per evaluation)."""
    return mask.sum(1, dtype=torch.int32)


def choice_credit(scores: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
    """Per-row credit for picking ``answers`` by argmax of ``scores`` (N, C), ties shared."""
    best = scores.max(dim=1, keepdim=True).values
    at_max = scores >= best
    right_is_max = at_max.gather(1, answers.view(-1, 1)).squeeze(1)
    return right_is_max.float() / _count(at_max).float()


def pair_credits(pos: torch.Tensor, neg: torch.Tensor, tie_to_positive: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(negft's credit, the reference's ``_official`` one) per example of choosing the positive scored ``pos``
    over the negative scored ``neg``. negft's gives a tie ½, a fair coin's expected credit, so that a model
    that scores both alike is not counted right or wrong; the reference's is all or nothing: its strict ``>``
    loses a tie, its argmax over [positive, negative] (``tie_to_positive``) takes the first and wins it."""
    tie_aware = (pos > neg).double() + 0.5 * (pos == neg).double()
    return tie_aware, ((pos >= neg) if tie_to_positive else (pos > neg)).double()


def part_means(parts: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(micro, macro) per-example values of ``parts`` pooled: micro's mean is the mean over every example, macro's
    the mean of the parts' means (each part's values weighted N / (k · n_i)), so both get a bootstrap interval."""
    micro = torch.cat(parts)
    weights = torch.cat([torch.full((len(p),), len(micro) / (len(parts) * len(p)), dtype=torch.float64)
                         for p in parts])
    return micro, micro * weights


def choice_shares(scores: torch.Tensor) -> torch.Tensor:
    """(N, C) share of each option in the pick, ties split evenly (rows sum to 1)."""
    at_max = (scores >= scores.max(dim=1, keepdim=True).values).float()
    return at_max / at_max.sum(1, keepdim=True)


def recall_at_k(scores: torch.Tensor, targets: torch.Tensor, ks=(1, 5, 10)) -> dict[int, torch.Tensor]:
    """Per-query hit probability that ``targets`` ranks within top-k of ``scores`` (Q, N), ties random."""
    target = scores.gather(1, targets.view(-1, 1))
    greater = _count(scores > target).float()
    tied = _count(scores == target).float()          # includes the target itself
    return {k: ((k - greater) / tied).clamp(0, 1) for k in ks}


def recall_any_at_k(scores: torch.Tensor, positives: torch.Tensor, ks=(1, 5, 10)) -> dict[int, torch.Tensor]:
    """Per-row probability that any of the row's ``positives`` (a (Q, N) bool mask) ranks within top-k
    of ``scores`` (Q, N) under a random tie-break (image→text, where any of an image's captions counts)."""
    only_positives = scores.masked_fill(~positives, float("-inf"))
    best = only_positives.max(1, keepdim=True).values
    greater = _count(scores > best)                         # all negatives: no positive is above the best
    tied_pos = _count(only_positives == best)
    tied_neg = _count(scores == best) - tied_pos
    out = {}
    for k in ks:
        m = k - greater                                     # top-k slots left for the tied block
        hits = (m > tied_neg).double()                      # more slots than tied negatives: a positive is in
        for i in ((m > 0) & (m <= tied_neg)).nonzero().flatten().tolist():    # ties: 1 − P(the first m of the
            mi, n, p = int(m[i]), int(tied_neg[i]), int(tied_pos[i])          # tied block are negatives)
            hits[i] = 1.0 - math.comb(n, mi) / math.comb(n + p, mi)
        out[k] = hits
    return out


def one_blas_thread():
    """A context in which numpy's and scipy's BLAS run on one thread. Right after a torch op, torch's OpenMP
    threads still spin, and a multi-threaded BLAS call competes with them: on 2 cores a small numpy product
    after a torch one took 30 ms instead of 2, and the probes' scoring 1.1 s instead of 0.65. The probes' numpy
    work is small enough for one thread; torch keeps its own."""
    from threadpoolctl import threadpool_limits
    return threadpool_limits(1, user_api="blas")


_COUNTS: "OrderedDict[tuple, np.ndarray]" = OrderedDict()
COUNTS_BUDGET = 256 << 20      # bytes of resample counts kept: a world evaluation's intervals and paired tests
MAX_COUNTS = 1 << 24           # resamples × examples up to which the counts are drawn and kept (64 MB)


def _resample_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    """(n_boot, n) counts of each example in each resample, drawn as the uncached path draws them; the least
    recently used are dropped beyond ``COUNTS_BUDGET`` (one entry is at most 64 MB)."""
    key = (n, n_boot, seed)
    if key in _COUNTS:
        _COUNTS.move_to_end(key)
        return _COUNTS[key]
    _COUNTS[key] = counts = _draw_counts(n, n_boot, seed)
    while len(_COUNTS) > 1 and sum(c.nbytes for c in _COUNTS.values()) > COUNTS_BUDGET:
        _COUNTS.popitem(last=False)
    return counts


def _draw_counts(n: int, n_boot: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.empty((n_boot, n), dtype=np.float32)
    chunk = max(1, 2_000_000 // n)
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        idx = rng.integers(0, n, (stop - start, n)) + n * np.arange(stop - start)[:, None]
        counts[start:stop] = np.bincount(idx.ravel(), minlength=(stop - start) * n).reshape(stop - start, n)
    return counts


def resampled_means(x: np.ndarray, n_boot: int, seed: int) -> np.ndarray:
    """The mean of ``x`` (n,), or of each column of ``x`` (n, m), in each of ``n_boot`` resamples of its rows
    (with replacement) drawn from ``seed``: (n_boot,) or (n_boot, m)."""
    n = x.shape[0]
    if n * n_boot <= MAX_COUNTS:
        return (_resample_counts(n, n_boot, seed) @ x.astype(np.float32)).astype(np.float64) / n
    rng = np.random.default_rng(seed)
    means = np.empty((n_boot, *x.shape[1:]))
    chunk = max(1, 2_000_000 // x.size)
    for start in range(0, n_boot, chunk):
        stop = min(n_boot, start + chunk)
        means[start:stop] = x[rng.integers(0, n, (stop - start, n))].mean(1)
    return means


def bootstrap_ci(values, n_boot: int = 1000, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-example ``values``.

    A probe reports many metrics over the same examples, so the resamples of a given size are drawn once
    (as counts per example, up to ``MAX_COUNTS`` of them) and each metric's resampled means are one matrix product."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (float("nan"), float("nan"))
    means = resampled_means(x, n_boot, seed)
    lo, hi = np.percentile(means, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)


def paired_p_value(before, after, n_boot: int = 1000, seed: int = 0) -> float:
    """Two-sided paired bootstrap p-value for mean(after − before) = 0 over the same examples
    (inverting the percentile interval of the mean difference); 1.0 when nothing changed."""
    return paired_p_values({"m": before}, {"m": after}, n_boot, seed)["m"]


def paired_p_values(before: dict, after: dict, n_boot: int = 1000, seed: int = 0) -> dict[str, float]:
    """``paired_p_value`` of every metric in both with the same number of examples. The metrics over one
    set of examples share one matrix product with the resample counts, which is read once instead of once per
    metric (a run's report tests about a hundred metrics after every epoch); with the intervals' ``n_boot``
    and seed the counts are those the intervals already drew."""
    diffs = {k: np.asarray(v, dtype=np.float64) - np.asarray(before[k], dtype=np.float64)
             for k, v in after.items() if k in before and np.shape(before[k]) == np.shape(v)}
    out = {k: 1.0 for k, d in diffs.items() if d.size == 0 or not d.any()}
    by_size: dict[int, list[str]] = {}
    for k, d in diffs.items():
        if k not in out:
            by_size.setdefault(d.size, []).append(k)
    for keys in by_size.values():
        means = resampled_means(np.stack([diffs[k] for k in keys], axis=1), n_boot, seed)
        p = np.minimum(1.0, 2 * np.minimum((means <= 0).mean(0), (means >= 0).mean(0)))
        out.update(zip(keys, p.tolist()))
    return out


def pooled_interval(per_seed: list, n_boot: int = 1000, seed: int = 0) -> tuple[float, float]:
    """95% interval of the mean over seeds of each seed's example mean: each seed's examples (``per_seed[i]``, its
    own split) resampled within the seed from ``seed + i``, the resampled means averaged over seeds. Over one seed it
    is ``bootstrap_ci``'s interval."""
    means = np.mean([resampled_means(np.asarray(v, dtype=np.float64), n_boot, seed + i)
                     for i, v in enumerate(per_seed)], axis=0)
    lo, hi = np.percentile(means, [2.5, 97.5])
    return float(lo), float(hi)


def pooled_paired(a: list, b: list, n_boot: int = 1000) -> dict:
    """The seed mean of mean(a − b) over each seed's same examples (``a[i]`` and ``b[i]``: seed i's values, paired
    by example), its pooled 95% interval (as ``pooled_interval``) and a two-sided p-value (the share of resamples on
    the other side of 0, doubled; 1.0 when the mean is 0), with each seed's own mean difference."""
    diffs = [np.asarray(x, dtype=np.float64) - np.asarray(y, dtype=np.float64) for x, y in zip(a, b)]
    means = np.mean([resampled_means(d, n_boot, i) for i, d in enumerate(diffs)], axis=0)
    mean = float(np.mean([d.mean() for d in diffs]))
    lo, hi = np.percentile(means, [2.5, 97.5])
    p = 1.0 if mean == 0 else min(1.0, 2 * float(np.mean(means <= 0 if mean > 0 else means >= 0)))
    return {"mean": mean, "ci95": [float(lo), float(hi)], "p": p, "per_seed": [float(d.mean()) for d in diffs]}


def statistic_ci(values, statistic, n_boot: int = 1000, seed: int = 0, level: float = 0.95,
                 chunk: int = 100) -> tuple[float, float]:
    """Percentile bootstrap interval of ``statistic(resamples, axis=1)`` (a spread or a median: no mean, so
    ``bootstrap_ci``'s shared counts do not apply), resampled ``chunk`` at a time to bound memory."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        return (float("nan"), float("nan"))
    rng = np.random.default_rng(seed)
    stats = np.concatenate([statistic(x[rng.integers(0, x.size, (min(chunk, n_boot - i), x.size))], axis=1)
                            for i in range(0, n_boot, chunk)]) if n_boot > 0 else np.array([statistic(x, axis=0)])
    lo, hi = np.percentile(stats, [(1 - level) / 2 * 100, (1 + level) / 2 * 100])
    return float(lo), float(hi)
