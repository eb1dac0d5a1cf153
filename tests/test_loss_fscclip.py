"""FSC-CLIP's terms against a direct re-derivation of its reference's formulas (float64, planted ties, missing
negatives, logit scales 1/0.07 and 100), its deliberate differences on the cases that trigger them, and two
ranks against one process."""
import math

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from negft.losses import FocalHardNegativeLoss, FSCCLIPLoss, TokenPatchHardNegativeLoss

B, K, L, P, D = 4, 3, 5, 4, 6
SCALES = [1 / 0.07, 100.0]


def _batch(seed, b=B):
    """Features (normalised) and unnormalised tokens, float64 leaves; token masks without <sot>, uneven lengths;
    exact ties planted: a negative equal to its caption (tokens too), two equal patches, two equal negatives."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64)  # noqa: E731
    x = dict(image=F.normalize(r(b, D), dim=-1), text=F.normalize(r(b, D), dim=-1),
             negatives=F.normalize(r(b, K, D), dim=-1), image_tokens=r(b, P, D), text_tokens=r(b, L, D),
             negative_tokens=r(b, K, L, D))
    x["negatives"][0, 1], x["negative_tokens"][0, 1] = x["text"][0], x["text_tokens"][0]
    x["image_tokens"][1, 3] = x["image_tokens"][1, 0]
    x["negatives"][b - 1, 0], x["negative_tokens"][b - 1, 0] = x["negatives"][b - 1, 2], x["negative_tokens"][b - 1, 2]
    token_mask = torch.arange(L)[None] < torch.tensor([L, 3, 4, 2] * (b // 4))[:, None]
    token_mask[:, 0] = False
    negative_token_mask = token_mask[:, None].repeat(1, K, 1)
    negative_token_mask[2, 1, 3] = False
    for v in x.values():
        v.requires_grad_(True)
    return x, token_mask, negative_token_mask


def _focal(logits, real, gamma, eps, zero_fill):
    """One row: Σ_j target_j · −(1 − p_j)^γ log p_j over the real candidates (column 0 the caption); the softmax
    runs over the real ones, or over all with a missing one's logit 0 (the reference's zero-filling)."""
    n = sum(real)
    if zero_fill:
        kept = [z if ok else 0.0 * z for z, ok in zip(logits, real)]
    else:
        kept = [z for z, ok in zip(logits, real) if ok]
    norm = torch.logsumexp(torch.stack(kept), 0)
    loss = 0.0
    for j, (z, ok) in enumerate(zip(logits, real)):
        if ok:
            log_p = z - norm
            target = (1 - eps if j == 0 else 0.0) + eps / n
            loss = loss - target * (1 - log_p.exp()) ** gamma * log_p
    return loss


def _mean_over_rows(rows_logits, mask, gamma, eps, zero_fill):
    per_row = [_focal(z, [True] + m.tolist(), gamma, eps, zero_fill) for z, m in zip(rows_logits, mask) if m.any()]
    return sum(per_row) / len(per_row)


def _global_logits(x, s):
    return [[s * x["image"][i] @ x["text"][i]] + [s * x["image"][i] @ x["negatives"][i, k] for k in range(K)]
            for i in range(len(x["image"]))]


def _score(patches, tokens, mask, s):
    """logsumexp over the caption's tokens of s · cos(token, its patches averaged with min-max-scaled, detached
    weights of the raw token-patch dot products; uniform where they are all equal)."""
    terms = []
    for t in range(len(tokens)):
        if not mask[t]:
            continue
        sim = torch.stack([tokens[t] @ patches[p] for p in range(len(patches))]).detach()
        span = sim.max() - sim.min()
        w = (sim - sim.min()) / span if span > 0 else torch.ones_like(sim)
        w = w / w.sum()
        visual = sum(w[p] * patches[p] for p in range(len(patches)))
        terms.append(s * F.cosine_similarity(visual, tokens[t], dim=0))
    return torch.logsumexp(torch.stack(terms), 0)


def _local_logits(x, token_mask, negative_token_mask, s):
    return [[_score(x["image_tokens"][i], x["text_tokens"][i], token_mask[i], s)]
            + [_score(x["image_tokens"][i], x["negative_tokens"][i, k], negative_token_mask[i, k], s)
               for k in range(K)] for i in range(len(x["image"]))]


def _clip(x, s):
    logits = s * x["image"] @ x["text"].T
    labels = torch.arange(len(logits))
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


def _tokens(x, token_mask, negative_token_mask):
    return dict(image_tokens=x["image_tokens"], text_tokens=x["text_tokens"], token_mask=token_mask,
                negative_tokens=x["negative_tokens"], negative_token_mask=negative_token_mask)


def _assert_same(got, expected, x):
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
    leaves = list(x.values())
    for v, a, e in zip(leaves, torch.autograd.grad(got, leaves, retain_graph=True, allow_unused=True),
                       torch.autograd.grad(expected, leaves, allow_unused=True)):
        zero = torch.zeros_like(v)
        torch.testing.assert_close(zero if a is None else a, zero if e is None else e, rtol=0, atol=1e-10)


MISSING = torch.tensor([[True, True, False], [True, True, True], [False, False, False], [False, True, True]])


@pytest.mark.parametrize("s", SCALES)
@pytest.mark.parametrize("gamma,eps", [(2.0, 0.02), (0.0, 0.0), (1.0, 0.0)])
def test_fscclip_equals_the_formula_with_ties_a_missing_negative_and_a_row_without(s, gamma, eps):
    """L_clip + 0.5·L_global + 0.2·L_local, loss and gradients; the paper's recipe, the argparse defaults (plain
    cross-entropy) and focal γ 1 without smoothing."""
    x, tm, ntm = _batch(0)
    got, parts = FSCCLIPLoss(0.5, 0.2, gamma, eps)(torch.tensor(s, dtype=torch.float64), x["image"], x["text"],
                                                    x["negatives"], MISSING, _tokens(x, tm, ntm))
    glob = _mean_over_rows(_global_logits(x, s), MISSING, gamma, eps, False)
    local = _mean_over_rows(_local_logits(x, tm, ntm, s), MISSING, gamma, eps, False)
    _assert_same(got, _clip(x, s) + 0.5 * glob + 0.2 * local, x)
    assert set(parts) == {"clip", "global_hn", "local_hn"}
    torch.testing.assert_close(parts["local_hn"], local.detach(), rtol=0, atol=1e-10)


@pytest.mark.parametrize("s", SCALES)
def test_zero_fill_reproduces_the_reference(s):
    """The reference's bug: a missing negative's feature is zero-filled, so its logit 0 stays in the softmax
    (with target 0); ``zero_fill_missing`` keeps it, and changes nothing when no negative is missing."""
    x, tm, ntm = _batch(1)
    ts = torch.tensor(s, dtype=torch.float64)
    _assert_same(FocalHardNegativeLoss(zero_fill_missing=True)(x["image"], x["text"], x["negatives"], MISSING, ts),
                 _mean_over_rows(_global_logits(x, s), MISSING, 2.0, 0.02, True), x)
    _assert_same(TokenPatchHardNegativeLoss(zero_fill_missing=True)(**_tokens(x, tm, ntm), negative_mask=MISSING,
                                                                    logit_scale=ts),
                 _mean_over_rows(_local_logits(x, tm, ntm, s), MISSING, 2.0, 0.02, True), x)
    full = torch.ones(B, K, dtype=torch.bool)
    _assert_same(FocalHardNegativeLoss(zero_fill_missing=True)(x["image"], x["text"], x["negatives"], full, ts),
                 FocalHardNegativeLoss()(x["image"], x["text"], x["negatives"], full, ts), x)


def test_a_missing_negative_is_left_out_of_the_softmax():
    """Each term differs from the reference's zero-filling where a negative is missing (the local one only where
    its scores are near 0: at s = 100 a logit 0 weighs e^-100 against them)."""
    x, tm, ntm = _batch(1)
    s = torch.tensor(1 / 0.07, dtype=torch.float64)
    glob = [FocalHardNegativeLoss(zero_fill_missing=z)(x["image"], x["text"], x["negatives"], MISSING, s)
            for z in (False, True)]
    local = [TokenPatchHardNegativeLoss(zero_fill_missing=z)(**_tokens(x, tm, ntm), negative_mask=MISSING,
                                                              logit_scale=s) for z in (False, True)]
    assert (glob[0] - glob[1]).abs() > 1e-6 and (local[0] - local[1]).abs() > 1e-8


def test_a_batch_without_negatives_gives_the_clip_loss_with_the_graph_kept():
    """The reference crashes on it (its negatives are never defined); here both HN terms are 0 and backward runs."""
    x, tm, ntm = _batch(2)
    s = torch.tensor(100.0, dtype=torch.float64)
    got, parts = FSCCLIPLoss()(s, x["image"], x["text"], x["negatives"], torch.zeros(B, K, dtype=torch.bool),
                               _tokens(x, tm, ntm))
    assert parts["global_hn"] == 0 and parts["local_hn"] == 0
    _assert_same(got, _clip(x, 100.0), x)
    got.backward()
    assert torch.count_nonzero(x["negative_tokens"].grad) == 0


def test_a_token_tied_over_every_patch_weighs_them_uniformly():
    """The reference's min-max is 0/0 (NaN) for a token whose patch similarities are all equal (here: an image
    whose patches are all equal, a blank one); uniform here."""
    x, tm, ntm = _batch(3)
    with torch.no_grad():
        x["image_tokens"][1] = x["image_tokens"][1, :1]
    s = torch.tensor(1 / 0.07, dtype=torch.float64)
    got = TokenPatchHardNegativeLoss()(**_tokens(x, tm, ntm), negative_mask=MISSING, logit_scale=s)
    assert torch.isfinite(got)
    _assert_same(got, _mean_over_rows(_local_logits(x, tm, ntm, 1 / 0.07), MISSING, 2.0, 0.02, False), x)


def test_the_global_term_passes_gradcheck():
    x, _, _ = _batch(4)
    s = torch.tensor(100.0, dtype=torch.float64)
    loss = FocalHardNegativeLoss()
    assert torch.autograd.gradcheck(lambda i, t, n: loss(i, t, n, MISSING, s), (x["image"], x["text"], x["negatives"]))


def test_patch_weights_carry_no_gradient():
    """Only the weighted average of the patches carries a gradient to the image tokens: the min-max weights are
    constants (the reference detaches them)."""
    x, tm, _ = _batch(5)
    s = torch.tensor(1.0, dtype=torch.float64)
    score = TokenPatchHardNegativeLoss().score(x["image_tokens"], x["text_tokens"], tm, s).sum()
    (g_text,) = torch.autograd.grad(score, x["text_tokens"])
    frozen = x["text_tokens"].detach().requires_grad_(True)
    cos = (TokenPatchHardNegativeLoss.patches_per_token(x["image_tokens"].detach(), x["text_tokens"].detach())
           * F.normalize(frozen, dim=-1)).sum(-1)
    (g_frozen,) = torch.autograd.grad(torch.logsumexp((s * cos).masked_fill(~tm, -math.inf), -1).sum(), frozen)
    torch.testing.assert_close(g_text, g_frozen, rtol=0, atol=1e-12)


# rank 1's half: one row with a negative (rank 0's, MISSING: three)
ONE_ROW = torch.tensor([[False, False, False], [True, False, True], [False, False, False], [False, False, False]])


def _two_rank_batch():
    """8 rows, rank 0's half with three rows that have a negative (one missing, a row without), rank 1's with one:
    unequal counts, where a mean per rank (the reference's) is not one process's mean."""
    x, tm, ntm = _batch(6, b=8)
    return x, tm, ntm, torch.cat([MISSING, ONE_ROW])


def two_rank_case(rank, world):
    x, tm, ntm, mask = _two_rank_batch()
    n = len(tm) // world
    mine = slice(rank * n, (rank + 1) * n)
    local = {k: v.detach()[mine].requires_grad_(True) for k, v in x.items()}
    total, _ = FSCCLIPLoss(rank=rank, world_size=world)(
        torch.tensor(1 / 0.07, dtype=torch.float64), local["image"], local["text"], local["negatives"], mask[mine],
        _tokens(local, tm[mine], ntm[mine]))
    total.backward()
    loss = total.detach().clone()
    dist.all_reduce(loss)                # what DDP / DeepSpeed do: average over ranks
    return {"loss": loss / world, "grads": {k: v.grad / world for k, v in local.items()}}


def test_two_ranks_equal_one_process(two_ranks):
    x, tm, ntm, mask = _two_rank_batch()
    expected, _ = FSCCLIPLoss()(torch.tensor(1 / 0.07, dtype=torch.float64), x["image"], x["text"], x["negatives"],
                                mask, _tokens(x, tm, ntm))
    expected_grads = torch.autograd.grad(expected, list(x.values()))
    got = two_ranks["tests.test_loss_fscclip:two_rank_case"]
    torch.testing.assert_close(got[0]["loss"], expected.detach(), rtol=0, atol=1e-10)
    for key, e in zip(x, expected_grads):
        torch.testing.assert_close(torch.cat([g["grads"][key] for g in got]), e, rtol=0, atol=1e-10)
    # each half's own mean of the HN terms (the reference's per rank) averages to another loss: the counts matter
    s = torch.tensor(1 / 0.07, dtype=torch.float64)
    halves = [FSCCLIPLoss()(s, *(x[k][h] for k in ("image", "text", "negatives")), mask[h],
                            _tokens({k: v[h] for k, v in x.items()}, tm[h], ntm[h]))[1] for h in (slice(0, 4),
                                                                                           slice(4, 8))]
    full = FSCCLIPLoss()(s, x["image"], x["text"], x["negatives"], mask, _tokens(x, tm, ntm))[1]
    for part in ("global_hn", "local_hn"):
        assert abs((halves[0][part] + halves[1][part]) / 2 - full[part]) > 1e-3
