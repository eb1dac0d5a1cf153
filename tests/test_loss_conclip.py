"""CoNCLIPLoss against the formula written out here row by row (float64): planted exact ties, a missing negated
caption and a missing distractor, logit scales 1/0.07 and 100; gradients too; two ranks against one process.
(The comparison with the authors' own code is bench/parity/loss-conclip.md.)"""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from negft.losses import CoNCLIPLoss

SCALES = (1 / 0.07, 100.0)


def _ce(target, candidates):
    """−log softmax of ``target`` among ``candidates`` (the target among them)."""
    return torch.logsumexp(torch.stack(candidates), 0) - target


def _written_out(image, caption, negated, distractor, scale, has_negated, has_distractor):
    """CoN-CLIP's three cross-entropies, one row at a time, each averaged over its rows; their mean over the
    terms that have rows. A missing negated caption or distractor is no candidate and no row."""
    b = len(image)
    sim = lambda u, v: scale * (u * v).sum()
    negs = [j for j in range(b) if has_negated[j]]
    dists = [j for j in range(b) if has_distractor[j]]
    image_to_text = [_ce(sim(image[i], caption[i]), [sim(image[i], caption[j]) for j in range(b)]
                         + [sim(image[i], negated[j]) for j in negs]) for i in range(b)]
    text_to_image = [_ce(sim(caption[i], image[i]), [sim(caption[i], image[j]) for j in range(b)]
                         + [sim(caption[i], distractor[j]) for j in dists]) for i in range(b)]
    distractor_to_negated = [_ce(sim(distractor[i], negated[i]), [sim(distractor[i], negated[j]) for j in negs]
                                 + [sim(distractor[i], caption[j]) for j in range(b)])
                             for i in dists if has_negated[i]]
    terms = [torch.stack(t).mean() for t in (image_to_text, text_to_image, distractor_to_negated) if t]
    return sum(terms) / len(terms)


def _features(b=6, d=5, seed=0):
    """image, caption, negated, distractor (b, d), normalised, with exact ties planted: sample 0's negated caption
    is its caption, sample 1's distractor is its image, samples 2 and 3 share one distractor."""
    g = torch.Generator().manual_seed(seed)
    image, caption, negated, distractor = (F.normalize(torch.randn(b, d, generator=g, dtype=torch.float64), dim=-1)
                                           for _ in range(4))
    negated[0], distractor[1], distractor[3] = caption[0], image[1], distractor[2]
    return image, caption, negated, distractor


ALL = torch.ones(6, dtype=torch.bool)
MISSING_NEGATED = torch.tensor([True, True, False, True, True, True])
MISSING_DISTRACTOR = torch.tensor([True, True, True, False, True, True])
MASKS = {"every negative": (ALL, ALL), "a missing negated caption": (MISSING_NEGATED, ALL),
         "a missing distractor": (ALL, MISSING_DISTRACTOR), "both missing": (MISSING_NEGATED, MISSING_DISTRACTOR),
         "no distractor": (ALL, ~ALL)}


def _loss_and_grads(fn, feats, scale, has_negated, has_distractor):
    leaves = [f.clone().requires_grad_() for f in feats]
    s = torch.tensor(scale, dtype=torch.float64, requires_grad=True)
    loss = fn(*leaves, s, has_negated, has_distractor)
    loss.backward()
    return loss.detach(), [torch.zeros_like(x) if x.grad is None else x.grad for x in leaves + [s]]


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("case", MASKS)
def test_loss_and_gradients_equal_the_written_out_formula(case, scale):
    feats = _features()
    has_negated, has_distractor = MASKS[case]
    got, got_grads = _loss_and_grads(CoNCLIPLoss(), feats, scale, has_negated, has_distractor)
    want, want_grads = _loss_and_grads(_written_out, feats, scale, has_negated, has_distractor)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


def test_masks_left_out_default_to_every_negative():
    feats, scale = _features(), torch.tensor(100.0, dtype=torch.float64)
    torch.testing.assert_close(CoNCLIPLoss()(*feats, scale), CoNCLIPLoss()(*feats, scale, ALL, ALL), rtol=0, atol=0)


def test_an_absent_negative_s_features_do_not_matter():
    """Whatever an absent negated caption or distractor holds (zeros, as a loader fills it, or anything finite)
    changes neither the loss nor any gradient of the present features."""
    feats, scale = _features(), 1 / 0.07
    other = [f.clone() for f in feats]
    other[2][2], other[3][3] = 0.0, torch.full((5,), 7.0, dtype=torch.float64)
    a, ga = _loss_and_grads(CoNCLIPLoss(), feats, scale, MISSING_NEGATED, MISSING_DISTRACTOR)
    b, gb = _loss_and_grads(CoNCLIPLoss(), other, scale, MISSING_NEGATED, MISSING_DISTRACTOR)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    for x, y in zip(ga, gb):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-12)
    assert ga[2][2].abs().max() == 0 and ga[3][3].abs().max() == 0


def test_gradcheck():
    feats = [f.clone().requires_grad_() for f in _features(4, 3, seed=1)]
    scale = torch.tensor(1 / 0.07, dtype=torch.float64, requires_grad=True)
    has_distractor = torch.tensor([True, False, True, True])
    assert torch.autograd.gradcheck(lambda *x: CoNCLIPLoss()(*x, None, has_distractor), (*feats, scale),
                                    fast_mode=True)


# ----------------------------------------------------------------------------- two ranks against one process
def _two_rank_inputs():
    """Each rank holds half the batch, with its own missing negatives."""
    return _features(8, 5), 100.0, (torch.tensor([True, True, False, True, True, True, True, True]),  # rank 0 misses a negated
                                    torch.tensor([True, True, True, True, False, True, False, True]))  # rank 1 two distractors


def two_rank_case(rank, world):
    feats, scale, masks = _two_rank_inputs()
    n = feats[0].shape[0] // world
    mine = slice(rank * n, (rank + 1) * n)
    loss, grads = _loss_and_grads(CoNCLIPLoss(rank, world), [f[mine] for f in feats], scale,
                                  *(m[mine] for m in masks))
    *feature_grads, scale_grad = grads
    for x in (loss, scale_grad):            # what DeepSpeed / DDP do: average over ranks
        dist.all_reduce(x)
    rows = [[torch.zeros_like(g) for _ in range(world)] for g in feature_grads]
    for r, g in zip(rows, feature_grads):   # each rank's rows of each feature's gradient, in batch order
        dist.all_gather(r, g)
    return loss / world, [torch.cat(r) / world for r in rows] + [scale_grad / world]


def test_two_ranks_equal_one_process(two_ranks):
    """The ranks' mean loss and the gradients of every feature and of the logit scale, averaged over ranks, are one
    process's on the whole batch."""
    feats, scale, masks = _two_rank_inputs()
    want, want_grads = _loss_and_grads(CoNCLIPLoss(), feats, scale, *masks)
    got, got_grads = two_ranks["tests.test_loss_conclip:two_rank_case"][0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)
