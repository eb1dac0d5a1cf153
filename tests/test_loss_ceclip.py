"""CECLIPLoss against CE-CLIP's formula re-derived here with loops (float64, two steps so the thresholds carry), its
gradients, each reference bug (``reference_bugs``) on the case that triggers it and equality elsewhere, and two
ranks against one process. The parity with the authors' own ``Clip_DALoss`` is bench/parity/loss-ceclip.md."""
import math

import pytest
import torch
import torch.nn.functional as F

from negft.losses import CECLIPLoss

B, K, D = 4, 4, 6
SCALES = (1 / 0.07, 100.0)
UPPER = 10.0


def _lse(xs):
    return torch.logsumexp(torch.stack(xs), 0)


def _expected(img, txt, neg, mask, s, tau, bugs):
    """(total, next τ) by the paper's formula, or the reference's where ``bugs``; loops over rows and pairs."""
    b, k = mask.shape
    sim = lambda x, y: s * (x * y).sum()                                        # noqa: E731
    real = [(j, t) for j in range(b) for t in range(k) if bugs or mask[j, t]]
    hn = sum(_lse([sim(img[i], txt[j]) for j in range(b)] + [sim(img[i], neg[j, t]) for j, t in real])
             - sim(img[i], txt[i]) for i in range(b)) / b
    hn = (hn + sum(_lse([sim(txt[i], img[j]) for j in range(b)]) - sim(txt[i], img[i]) for i in range(b)) / b) / 2
    cmr = sum(torch.relu(tau[t] + sim(img[i], neg[i, t]) - sim(img[i], txt[i]))
              for i in range(b) for t in range(k) if mask[i, t]) / (b * k)
    if bugs:    # every negative of the batch, target the first sample's first one
        imc = sum(_lse([sim(txt[i], neg[j, t]) for j in range(b) for t in range(k)]) - sim(txt[i], neg[0, 0])
                  for i in range(b)) / b
    else:       # the image's logit among it and the caption's own real negatives
        imc = sum(_lse([sim(img[i], txt[i])] + [sim(txt[i], neg[i, t]) for t in range(k) if mask[i, t]])
                  - sim(img[i], txt[i]) for i in range(b)) / b
    nxt = []
    with torch.no_grad():
        for t in range(k):
            if bugs:    # positives over every row, negatives over the real ones whose logit is not 0
                negs = [sim(img[i], neg[i, t]) for i in range(b) if mask[i, t] and sim(img[i], neg[i, t]) != 0]
                mean_neg = sum(negs) / len(negs) if negs else torch.tensor(math.nan, dtype=img.dtype)
                gap = sum(sim(img[i], txt[i]) for i in range(b)) / b - mean_neg
            else:
                gaps = [sim(img[i], txt[i]) - sim(img[i], neg[i, t]) for i in range(b) if mask[i, t]]
                gap = sum(gaps) / len(gaps) if gaps else tau[t]
            nxt.append(torch.clamp(torch.as_tensor(gap, dtype=img.dtype), 0, UPPER))
    return hn + 0.2 * cmr + 0.3 * imc, torch.stack(nxt)


def _unit(*shape, seed):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64), dim=-1)


def _batch(seed, ties=False):
    """Random unit features; ``ties`` plants exact ones on ±0.5 rows (every product exact): a negative equal to its
    caption (the hinge's kink at τ = 0), two equal negatives of a caption, two equal image-caption pairs."""
    img, txt, neg = _unit(B, D, seed=seed), _unit(B, D, seed=seed + 1), _unit(B, K, D, seed=seed + 2)
    if ties:
        half = lambda *v: torch.tensor(v, dtype=torch.float64) / 2                # noqa: E731
        img[0], txt[0], img[1], txt[1] = half(1, 1, 1, 1, 0, 0), half(1, 1, 1, -1, 0, 0), half(1, 0, 1, 1, 1, 0), \
            half(0, 1, 1, 1, 1, 0)
        neg[0, 1], neg[1, 0], neg[1, 2] = txt[0], half(1, 1, 1, 0, -1, 0), half(1, 1, 1, 0, -1, 0)
        img[3], txt[3] = img[2], txt[2]
    return img, txt, neg, torch.ones(B, K, dtype=torch.bool)


def _missing(seed):
    """Three missing negatives (mask false), each the same placeholder feature (the data's "###" caption)."""
    img, txt, neg, mask = _batch(seed)
    mask[1, 2] = mask[3, 0] = mask[3, 3] = False
    neg[1, 2] = neg[3, 0] = neg[3, 3] = F.normalize(torch.ones(D, dtype=torch.float64), dim=0)
    return img, txt, neg, mask


def _run(loss, batch, s):
    """(total, gradients w.r.t. image, text, negatives) of one step of ``loss``."""
    xs = [x.clone().requires_grad_(True) for x in batch[:3]]
    total, _ = loss(*xs, batch[3], torch.tensor(s, dtype=torch.float64))
    return total, torch.autograd.grad(total, xs)


def _formula(batch, s, tau, bugs):
    xs = [x.clone().requires_grad_(True) for x in batch[:3]]
    total, nxt = _expected(*xs, batch[3], s, tau, bugs)
    return total, torch.autograd.grad(total, xs), nxt


@pytest.mark.parametrize("bugs", [False, True])
@pytest.mark.parametrize("make", [lambda i: _batch(10 * i), lambda i: _batch(10 * i, ties=True), _missing],
                         ids=["random", "ties", "missing"])
@pytest.mark.parametrize("s", SCALES, ids=["1/0.07", "100"])
def test_loss_gradients_and_thresholds_equal_the_formula_over_two_steps(make, s, bugs):
    loss = CECLIPLoss(reference_bugs=bugs)
    tau = torch.zeros(K, dtype=torch.float64)
    for step in range(2):
        batch = make(step + 1)
        total, grads = _run(loss, batch, s)
        want, want_grads, tau = _formula(batch, s, tau, bugs)
        torch.testing.assert_close(total, want, rtol=0, atol=1e-9)
        for g, w in zip(grads, want_grads):
            torch.testing.assert_close(g, w, rtol=0, atol=1e-9)
        torch.testing.assert_close(loss.thresholds, tau, rtol=0, atol=1e-9)


def test_gradcheck():
    """On a small batch with a missing negative and thresholds of the previous step (each call a fresh module)."""
    g = torch.Generator().manual_seed(3)
    img, txt, neg = (F.normalize(torch.randn(*shape, D, generator=g, dtype=torch.float64), dim=-1).requires_grad_(True)
                     for shape in ((2,), (2,), (2, 2)))
    mask = torch.tensor([[True, False], [True, True]])
    tau = torch.tensor([0.5, 2.0], dtype=torch.float64)

    def total(img, txt, neg):
        loss = CECLIPLoss(n_types=2)
        loss.thresholds = tau
        return loss(img, txt, neg, mask, torch.tensor(1 / 0.07, dtype=torch.float64))[0]
    assert torch.autograd.gradcheck(total, (img, txt, neg), fast_mode=True)


def test_thresholds_follow_the_features_to_their_device():
    """The term is a plain object, so the model's move to a GPU leaves τ behind; the meta device stands in for the
    GPU (a CPU τ beside meta features fails as it does beside CUDA ones)."""
    loss = CECLIPLoss()
    image, text, negatives, mask = (x.to("meta") for x in _missing(5)[:4])
    total, _ = loss(image, text, negatives, mask, torch.tensor(100.0, dtype=torch.float64, device="meta"))
    assert total.device.type == "meta" and loss.thresholds.device.type == "meta"


def test_parts_are_logged_unweighted_and_summed_with_the_papers_weights():
    batch = _missing(5)
    total, parts = CECLIPLoss()(*batch, torch.tensor(100.0, dtype=torch.float64))
    assert set(parts) == {"hn", "cmr", "imc"} and not any(v.requires_grad for v in parts.values())
    torch.testing.assert_close(total.detach(), parts["hn"] + 0.2 * parts["cmr"] + 0.3 * parts["imc"])


# ----------------------------------------------------------------------------- the reference's bugs, one case each
def _parts(batch, bugs, s=1 / 0.07, tau=None):
    loss = CECLIPLoss(reference_bugs=bugs)
    if tau is not None:
        loss.thresholds = tau.clone()
    return loss(*batch, torch.tensor(s, dtype=torch.float64))[1], loss.thresholds


def test_the_intra_modal_target_is_each_captions_image_not_the_first_samples_negative():
    """Issue #15: the reference's target is column 0 of every negative, the first sample's relation negative."""
    batch = _batch(7)
    fixed, _ = _parts(batch, False)
    ref, _ = _parts(batch, True)
    img, txt, neg, _ = batch
    s = 1 / 0.07
    first = torch.stack([torch.logsumexp(s * txt[i] @ neg.reshape(-1, D).T, 0) - s * txt[i] @ neg[0, 0]
                         for i in range(B)]).mean()
    own = torch.stack([torch.logsumexp(torch.cat([(s * img[i] @ txt[i]).reshape(1), s * neg[i] @ txt[i]]), 0)
                       - s * img[i] @ txt[i] for i in range(B)]).mean()
    torch.testing.assert_close(ref["imc"], first)
    torch.testing.assert_close(fixed["imc"], own)
    assert abs(fixed["imc"] - ref["imc"]) > 0.1


def test_a_type_without_a_real_negative_keeps_its_threshold_where_the_reference_turns_nan():
    img, txt, neg, mask = _batch(9)
    mask[:, 0] = False                                    # no real relation negative in the batch
    tau = torch.tensor([1.5, 0.0, 0.0, 0.0], dtype=torch.float64)
    _, fixed = _parts((img, txt, neg, mask), False, tau=tau)
    _, ref = _parts((img, txt, neg, mask), True, tau=tau)
    assert fixed[0] == 1.5 and torch.isnan(ref[0])
    torch.testing.assert_close(fixed[1:], ref[1:])      # the other types: the same mean gap
    after_fixed, _ = _parts(_batch(11), False, tau=fixed)
    after_ref, _ = _parts(_batch(11), True, tau=ref)
    assert torch.isfinite(after_fixed["cmr"]) and torch.isnan(after_ref["cmr"])   # NaN at the next step


@pytest.mark.parametrize("bugs", [False, True])
def test_the_reference_nan_lasts_one_step_and_trains_as_the_reference(bugs):
    """A normal batch, one without a real relation negative, two normal ones. ``reference_bugs``: the second step
    trains with the first's τ and sets τ_relation to NaN; the third step's hinge (its logged ``cmr``, the formula's
    total) is NaN but its gradients are the formula's, finite (relu passes the gradient at NaN: each real relation
    pair pulls as if it broke the margin), and its total is finite, those pairs entering as s·v·n − s·v·t; the τ it
    sets is its own batch's, finite, so the fourth step is as any other (the reference's own Clip_DALoss does the
    same: bench/parity/loss-ceclip.md). The default is finite throughout; every step equals the formula."""
    none = _batch(31)
    none[3][:, 0] = False
    s = torch.tensor(1 / 0.07, dtype=torch.float64)
    loss, tau = CECLIPLoss(reference_bugs=bugs), torch.zeros(K, dtype=torch.float64)
    for step, batch in enumerate([_batch(21), none, _batch(41), _batch(51)], 1):
        xs = [x.clone().requires_grad_(True) for x in batch[:3]]
        total, logs = loss(*xs, batch[3], s)
        grads = torch.autograd.grad(total, xs)
        nan_step = bugs and step == 3
        want, want_grads, nxt = _formula(batch, s, tau, bugs)
        assert torch.isnan(want) == nan_step == torch.isnan(logs["cmr"]) and torch.isfinite(total)
        if nan_step:    # the formula without the relation pairs' hinge, plus their s·v·n − s·v·t
            img, txt, neg, mask = batch
            gaps = sum(s * img[i] @ neg[i, 0] - s * img[i] @ txt[i] for i in range(B) if mask[i, 0]) / (B * K)
            want = _formula(batch, s, tau.nan_to_num(nan=-math.inf), bugs)[0] + 0.2 * gaps
        torch.testing.assert_close(total, want, rtol=0, atol=1e-9)
        for g, w in zip(grads, want_grads):
            assert torch.isfinite(w).all()
            torch.testing.assert_close(g, w, rtol=0, atol=1e-9)
        tau = nxt
        torch.testing.assert_close(loss.thresholds, tau, rtol=0, atol=1e-12, equal_nan=True)
        assert torch.isnan(loss.thresholds).tolist() == [bugs and step == 2, False, False, False]


def test_missing_negatives_leave_the_candidates_where_the_reference_keeps_them():
    batch = _missing(13)
    fixed, _ = _parts(batch, False)
    ref, _ = _parts(batch, True)
    assert abs(fixed["hn"] - ref["hn"]) > 1e-3
    torch.testing.assert_close(fixed["cmr"], ref["cmr"])   # the hinge masks them in both


def test_a_real_negative_at_logit_zero_counts_in_the_threshold():
    """The reference finds real negatives by a nonzero logit: one orthogonal to its image is left out of τ."""
    img, txt, neg, mask = _batch(15)
    img[2] = torch.tensor([1.0, 0, 0, 0, 0, 0], dtype=torch.float64)
    neg[2, 1] = torch.tensor([0, 1.0, 0, 0, 0, 0], dtype=torch.float64)
    _, fixed = _parts((img, txt, neg, mask), False)
    _, ref = _parts((img, txt, neg, mask), True)
    assert abs(fixed[1] - ref[1]) > 1e-3
    torch.testing.assert_close(fixed[[0, 2, 3]], ref[[0, 2, 3]])


@pytest.mark.parametrize("ties", [False, True])
def test_without_a_triggering_case_the_two_agree_but_for_the_intra_modal_target(ties):
    batch = _batch(17, ties=ties)
    tau = torch.tensor([0.5, 1.0, 0.0, 2.0], dtype=torch.float64)
    fixed, fixed_tau = _parts(batch, False, s=100.0, tau=tau)
    ref, ref_tau = _parts(batch, True, s=100.0, tau=tau)
    for name in ("hn", "cmr"):
        torch.testing.assert_close(fixed[name], ref[name], rtol=0, atol=1e-12)
    torch.testing.assert_close(fixed_tau, ref_tau, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- two ranks equal one process
def _two_steps(loss, batches, rank, world):
    """Each step's loss, (image, text, negatives) gradients and thresholds, on rank ``rank``'s share of the rows."""
    out = []
    for img, txt, neg, mask in batches:
        n = len(img) // world
        rows = slice(rank * n, (rank + 1) * n)
        xs = [x[rows].clone().requires_grad_(True) for x in (img, txt, neg)]
        total, _ = loss(*xs, mask[rows], torch.tensor(1 / 0.07, dtype=torch.float64))
        out.append((total.detach(), torch.autograd.grad(total, xs), loss.thresholds.clone()))
    return out


def _two_rank_batches():
    return [_missing(21), _batch(23, ties=True)]


def two_rank_case(rank, world):
    return {bugs: _two_steps(CECLIPLoss(reference_bugs=bugs, rank=rank, world_size=world), _two_rank_batches(),
                             rank, world) for bugs in (False, True)}


def test_two_ranks_equal_one_process(two_ranks):
    """The ranks' mean loss, their feature gradients averaged (what DDP / DeepSpeed do to the weights') and
    concatenated, and their thresholds equal one process on the whole batch, over two steps, in both modes."""
    ranks = two_ranks["tests.test_loss_ceclip:two_rank_case"]
    for bugs in (False, True):
        expected = _two_steps(CECLIPLoss(reference_bugs=bugs), _two_rank_batches(), 0, 1)
        for step, (total, grads, tau) in enumerate(expected):
            torch.testing.assert_close(sum(r[bugs][step][0] for r in ranks) / 2, total, rtol=0, atol=1e-12)
            for part, want in enumerate(grads):
                got = torch.cat([r[bugs][step][1][part] for r in ranks]) / 2
                torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
            for r in ranks:
                torch.testing.assert_close(r[bugs][step][2], tau, rtol=0, atol=1e-12)
