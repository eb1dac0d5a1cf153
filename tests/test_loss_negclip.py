"""NegCLIPLoss and TripletCLIPLoss against their formulas written out row by row (float64: planted exact ties, a
missing negative, logit scales 1/0.07 and 100), their gradients, TripletCLIP's sum (the reference's) against its mean,
and two ranks against one process. The references' own code is compared in bench/parity/loss-negclip.md."""

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from negft.losses import NegCLIPLoss, TripletCLIPLoss

SCALES = [1 / 0.07, 100.0]


def unit(*shape, seed):
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1)


def cross_entropy(query, candidates, right, scale):
    """−log softmax of candidate ``right`` among ``candidates`` (a list of vectors), at ``scale`` · cosine."""
    logits = torch.stack([scale * query @ c for c in candidates])
    return torch.logsumexp(logits, 0) - logits[right]


def negclip_by_rows(images, captions, negatives, scale):
    """NegCLIP written out: lists of the real rows' images and captions (image i's caption is caption i) and the real
    hard captions; ½ (mean over images of CE among every caption and hard caption + mean over captions of CE among
    every image)."""
    texts = captions + negatives
    image_side = sum(cross_entropy(im, texts, i, scale) for i, im in enumerate(images)) / len(images)
    caption_side = sum(cross_entropy(c, images, i, scale) for i, c in enumerate(captions)) / len(captions)
    return (image_side + caption_side) / 2


def negclip_batch(B=4, K=2, seed=0):
    """The batch's images then their hard images (2B rows), each row's caption and K hard captions, with planted
    exact ties: the first hard image is the second image (and its caption the second caption), one hard caption is
    its row's own caption, and two images are alike."""
    images, captions = unit(2 * B, 6, seed=seed), unit(2 * B, 6, seed=seed + 1)
    negatives = unit(2 * B, K, 6, seed=seed + 2)
    images[B], captions[B] = images[1], captions[1]
    negatives[2, 0] = captions[2]
    images[3] = images[0]
    return images, captions, negatives


def negclip_masks(B=4, K=2):
    """A sample without a hard image (its row is padding, and so are its hard captions), a caption with one hard
    caption of two, a row with none."""
    valid = torch.ones(2 * B, dtype=torch.bool)
    valid[B + 2] = False
    mask = valid[:, None].repeat(1, K)
    mask[0, 1] = mask[B + 1] = False
    return valid, mask


def negclip_expected(images, captions, negatives, scale, valid, mask):
    rows = [i for i in range(len(images)) if valid[i]]
    hard = [negatives[i, k] for i in range(len(images)) for k in range(negatives.shape[1]) if mask[i, k]]
    return negclip_by_rows([images[i] for i in rows], [captions[i] for i in rows], hard, scale)


def leaves(*xs):
    return [x.clone().requires_grad_(True) for x in xs]


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("missing", [False, True], ids=["all-negatives", "a-missing-negative"])
def test_negclip_is_its_formula_with_its_gradients(scale, missing):
    images, captions, negatives = negclip_batch()
    valid, mask = negclip_masks() if missing else (torch.ones(8, dtype=torch.bool), torch.ones(8, 2, dtype=torch.bool))
    got_in, want_in = leaves(images, captions, negatives), leaves(images, captions, negatives)
    masks = (valid, mask) if missing else ()        # none given: every row and hard caption is real
    got = NegCLIPLoss()(*got_in, torch.tensor(scale, dtype=torch.float64), *masks)
    want = negclip_expected(*want_in, scale, valid, mask)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    grads = torch.autograd.grad(got, got_in)
    for g, w in zip(grads, torch.autograd.grad(want, want_in)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)
    if missing:     # a padding row and a missing hard caption are no part of the loss
        assert not grads[0][6].any() and not grads[1][6].any() and not grads[2][6].any()
        assert not grads[2][0, 1].any() and not grads[2][5].any()


def test_negclip_gradcheck_with_padding():
    images, captions, negatives = (x[[0, 1, 4, 5, 6]] for x in negclip_batch(B=4, K=1))
    valid = torch.tensor([True, True, True, True, False])
    mask = torch.tensor([[True], [False], [True], [True], [True]])
    scale = torch.tensor(1 / 0.07, dtype=torch.float64)
    torch.autograd.gradcheck(lambda i, c, n, s: NegCLIPLoss()(i, c, n, s, valid, mask),
                             leaves(images, captions, negatives, scale))


def triplet_batch(B=4, seed=10):
    """True pairs and hard pairs with planted exact ties: a hard caption equal to another row's caption, a hard image
    equal to its own true image."""
    image, text, negative_image, negative_text = (unit(B, 6, seed=seed + k) for k in range(4))
    negative_text[0] = text[1]
    negative_image[2] = image[2]
    return image, text, negative_image, negative_text


def triplet_expected(image, text, negative_image, negative_text, scale, has):
    """TripletCLIP written out: NegCLIP(I, T, T⁻) + NegCLIP(I⁻, T⁻, T), over the rows that have a hard pair."""
    rows = [i for i in range(len(image)) if has[i]]
    true_pairs = negclip_by_rows(list(image), list(text), [negative_text[i] for i in rows], scale)
    hard_pairs = negclip_by_rows([negative_image[i] for i in rows], [negative_text[i] for i in rows], list(text), scale)
    return true_pairs + hard_pairs


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("missing", [False, True], ids=["all-negatives", "a-missing-negative"])
def test_tripletclip_is_the_mean_of_two_negclips_and_the_reference_their_sum(scale, missing):
    x = triplet_batch()
    has = torch.tensor([True, not missing, True, True])
    s = torch.tensor(scale, dtype=torch.float64)
    want_in = leaves(*x)
    reference = triplet_expected(*want_in, scale, has)      # the reference's sum
    want_grads = torch.autograd.grad(reference, want_in)
    for reference_sum, factor in ((True, 1.0), (False, 0.5)):
        got_in = leaves(*x)
        got = TripletCLIPLoss(reference_sum=reference_sum)(*got_in, s, has_negative=has if missing else None)
        torch.testing.assert_close(got, factor * reference.detach(), rtol=0, atol=1e-10)
        for g, w in zip(torch.autograd.grad(got, got_in), want_grads):
            torch.testing.assert_close(g, factor * w, rtol=0, atol=1e-10)
    assert TripletCLIPLoss()(*x, s) != TripletCLIPLoss(reference_sum=True)(*x, s)     # negft's mean differs


def test_tripletclip_without_any_hard_pair_is_plain_clip_halved_with_finite_gradients():
    x = leaves(*triplet_batch())
    none = torch.zeros(4, dtype=torch.bool)
    got = TripletCLIPLoss()(*x, torch.tensor(100.0, dtype=torch.float64), has_negative=none)
    want = negclip_by_rows(list(x[0]), list(x[1]), [], 100.0) / 2
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    grads = torch.autograd.grad(got, x)
    assert all(torch.isfinite(g).all() for g in grads) and not grads[2].any() and not grads[3].any()


def test_tripletclip_gradcheck_with_a_missing_pair():
    x = triplet_batch(B=3)
    has = torch.tensor([True, False, True])
    torch.autograd.gradcheck(lambda *a: TripletCLIPLoss()(*a[:4], a[4], has_negative=has),
                             leaves(*x, torch.tensor(1 / 0.07, dtype=torch.float64)))


# ----------------------------------------------------------------------------- two ranks
def _shares(rank, world, B):
    """Rank ``rank``'s rows of the NegCLIP tensors (its samples' images, then their hard images) and of TripletCLIP's:
    the batch's B samples split in ``world``."""
    h = B // world
    mine = list(range(rank * h, (rank + 1) * h))
    return mine + [B + i for i in mine], mine


def _halves(rank, world, x):
    negclip, triplet = x
    rows, mine = _shares(rank, world, len(triplet[0]))
    return [t[rows] for t in negclip], [t[mine] for t in triplet]


def _losses(negclip, triplet, scale, rank, world):
    images, captions, negatives, valid, mask = negclip
    *pairs, has = triplet
    return (NegCLIPLoss(rank, world)(images, captions, negatives, scale, valid, mask)
            + TripletCLIPLoss(rank, world)(*pairs, scale, has_negative=has))


def _step(x, rank, world):
    """The summed loss of both terms on this rank's share, and its gradients w.r.t. every feature and the scale."""
    negclip, triplet = _halves(rank, world, x)
    feats = leaves(*negclip[:3]) + leaves(*triplet[:4])
    scale = torch.tensor(1 / 0.07, dtype=torch.float64, requires_grad=True)
    loss = _losses(feats[:3] + negclip[3:], feats[3:] + triplet[4:], scale, rank, world)
    return loss.detach(), list(torch.autograd.grad(loss, feats + [scale]))


def two_rank_case(rank, world):
    loss, grads = _step(_uneven_batch(), rank, world)
    dist.all_reduce(loss)           # the loss and the scale's gradient averaged over ranks, as DeepSpeed / DDP do
    dist.all_reduce(grads[-1])
    shares = [[None] * world for _ in grads[:-1]]
    for share, g in zip(shares, grads[:-1]):    # each rank's features' gradient, averaged over the ranks' losses
        dist.all_gather_object(share, g / world)
    return loss / world, shares, grads[-1] / world


def _uneven_batch():
    """Rank 1's share has NegCLIP's padding row, rank 0's two of TripletCLIP's hard pairs to rank 1's one: the ranks
    count different real rows."""
    images, captions, negatives = negclip_batch()
    valid, mask = negclip_masks()
    triplet = (*triplet_batch(), torch.tensor([True, True, False, True]))
    return (images, captions, negatives, valid, mask), triplet


def test_two_ranks_equal_one_process_for_both_terms(two_ranks):
    one_loss, one_grads = _step(_uneven_batch(), 0, 1)
    loss, shares, scale_grad = two_ranks["tests.test_loss_negclip:two_rank_case"][0]
    torch.testing.assert_close(loss, one_loss, rtol=0, atol=1e-10)
    torch.testing.assert_close(scale_grad, one_grads[-1], rtol=0, atol=1e-10)
    rows = [sum((_shares(rank, 2, 4)[side] for rank in range(2)), []) for side in (0, 1)]
    for k, share in enumerate(shares):      # rank 0's rows then rank 1's, in one process's order
        torch.testing.assert_close(torch.cat(share), one_grads[k][rows[k >= 3]], rtol=0, atol=1e-10)


def test_the_references_two_rank_labels_are_not_one_process():
    """The reference's ClipLoss across two ranks labels rank r's image row i with the (2h·r + i)-th gathered text: for
    rank 1 a row of rank 0's hard captions. Written out, its loss is not one process's, which negft's is (above)."""
    images, captions, negatives = negclip_batch(K=1)
    B, h = len(images) // 2, len(images) // 4
    per_rank = [_shares(r, 2, B)[0] for r in range(2)]
    gathered = [t for rows in per_rank for t in [captions[i] for i in rows] + [negatives[i, 0] for i in rows]]
    ranks = [sum(cross_entropy(images[row], gathered, 2 * h * r + i, 100.0) for i, row in enumerate(rows))
             / len(rows) for r, rows in enumerate(per_rank)]
    one_process = sum(cross_entropy(images[i], list(captions) + list(negatives[:, 0]), i, 100.0)
                      for i in range(2 * B)) / (2 * B)
    assert abs(sum(ranks) / 2 - one_process) > 1.0
