"""Training losses as components: an objective (``loss.name``) is a list of terms, summed.

Each term is one class in this module (open_clip's ``loss.py`` for the losses, torchtune's components for the
terms) that declares

- its settings: a plain dataclass ``Settings``, whose keys sit in the block of each objective that lists the
  term (``loss.negfull.t2i``), or in a block of the term's own (``block``: ``loss.guard.*``), each field with its
  range and doc (``negft.fields.bounded``, which ``negft.config`` checks: a bad key or value exits 2 naming it),
  and the values that turn it off (``off``); an objective's block (``NegFullCfg``, ``MCQCfg``) is a dataclass
  that is each of its terms' Settings, and ``LossCfg``, the ``loss`` schema, holds the blocks;
- the batch fields it needs on a stream of each task (``fields``): name → a function of the batch's samples'
  json, which the data pipeline calls to add the field to that stream's batches;
- its ``forward(step) -> (weighted value or None, {log key: unweighted value})``.

``negft.train.task.Task`` encodes each step once and sums its objective's terms (``OBJECTIVES``), in order; a
term whose weight is 0 is off (not built, no field asked), so it trains bit-identically to the objective
without it. The world base's cache key hashes the whole ``loss`` subtree. This module imports nothing from the
rest of negft but the shard schema and ``negft.fields``: ``negft.config`` asks it for the schema,
``negft.train.task`` for the terms.

Features come in L2-normalised; ``logit_scale`` is exp'ed.
"""
from __future__ import annotations

import copy
import dataclasses
import math
import re
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from negft.data import schema
from negft.fields import bounded, choice, field_errors

MAX_LOGIT_SCALE = math.log(100.0)       # the logit scale's clamp, as open_clip's: a largest scale of 100
HOST = "host"       # a step's batch's key for the host's copy of it (negft.train.engine.batch_to)


def rows_of(mask: torch.Tensor, device) -> torch.Tensor:
    """The indices of ``mask``'s true rows, on ``device``. Given the host's copy of a mask, the device never waits
    for the host to learn the count (a boolean index on the device does: a nonzero); the values it selects, and
    their gradients, are the boolean index's."""
    rows = mask.nonzero().flatten()
    if rows.device.type == "cpu" and torch.device(device).type == "cuda":
        rows = rows.pin_memory()
    return rows.to(device, non_blocking=True)


class ContrastiveLoss(nn.Module):
    """Symmetric InfoNCE over the global batch (open_clip's ``ClipLoss``).

    ``local_loss`` + ``gather_with_grad`` is the variant that scales: each rank scores its own rows
    against every rank's features, and gradients flow back through the gather, so the averaged
    gradient equals the one-process gradient on the same global batch.
    """

    def __init__(self, rank: int = 0, world_size: int = 1):
        super().__init__()
        from open_clip.loss import ClipLoss     # open_clip's import costs seconds; reading a recipe needs none of it
        self.clip = ClipLoss(local_loss=True, gather_with_grad=True, cache_labels=True,
                             rank=rank, world_size=world_size)

    def forward(self, image_features, text_features, logit_scale):
        return self.clip(image_features, text_features, logit_scale)


def gather_rows(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """Every rank's ``x``, stacked in rank order, with gradients flowing back to each rank's own (a mask is sent as
    bytes and comes back bool)."""
    if world_size == 1:
        return x
    if x.dtype == torch.bool:
        return gather_rows(x.to(torch.uint8), world_size).bool()
    from torch.distributed.nn import all_gather     # only where a process group exists
    return torch.cat(all_gather(x))


def _cross_entropy_rows(logits, columns, labels):
    """Each row's cross-entropy over the ``columns`` (bool, one per column) that are real, and always over its own
    label's: a padding row keeps a finite value (its caller leaves it out) and a finite gradient."""
    keep = columns.expand_as(logits).clone()
    rows = torch.arange(len(labels), device=labels.device)
    keep[rows, labels] = True
    return torch.logsumexp(logits.masked_fill(~keep, float("-inf")), -1) - logits[rows, labels]


class NegCLIPLoss(nn.Module):
    """NegCLIP (the ARO paper, Yuksekgonul et al., ICLR 2023; vinid/open_clip's ``ClipLoss`` as its ``train.py``
    calls it): CLIP's symmetric loss with hard captions added as columns of the image side only,
    ½[CE(image → every caption and hard caption) + CE(caption → every image)], each the mean over its rows.

    The rows are the reference's concatenation, made by the caller: ``images`` (N, D) are the batch's images then
    their hard images, ``captions`` (N, D) each row's caption, ``negatives`` (N, K, D) each row's hard captions (the
    script draws one, K = 1); a hard caption is no image's, so the caption side scores the N captions against the N
    images (the reference's ``logits_per_text[:len(logits_per_image)]``). ``valid`` (N,) marks real rows (a sample
    without a hard image leaves a padding row) and ``negative_mask`` (N, K) real hard captions, a padding row's
    included (its caller says whether they are columns); a padding row or hard caption is no column, and a padding
    row adds no term. An image that is also another row's hard image is a negative of that row, exact ties included,
    as in the reference.

    Across ranks each rank scores its rows against every rank's columns (gathered with their gradients) and divides
    by the global count of real rows, so the averaged gradient is one process's on the global batch. The reference
    gathers but labels row i with the i-th gathered text, a caption or hard caption of rank 0 for another rank's rows
    (its README: the code "will not work with the distributed/multi-gpu setting"); negft labels each row with its own
    caption, the paper's loss.
    """

    def __init__(self, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.rank, self.world_size = rank, world_size

    def forward(self, images, captions, negatives, logit_scale, valid=None, negative_mask=None):
        n = len(images)
        valid = images.new_ones(n, dtype=torch.bool) if valid is None else valid
        if negative_mask is None:
            negative_mask = negatives.new_ones(negatives.shape[:2], dtype=torch.bool)
        all_images, all_captions, all_valid = (gather_rows(x, self.world_size) for x in (images, captions, valid))
        all_negatives = gather_rows(negatives.flatten(0, 1), self.world_size)
        all_negative_mask = gather_rows(negative_mask.flatten(), self.world_size)
        labels = torch.arange(n, device=images.device) + n * self.rank
        per_image = _cross_entropy_rows(logit_scale * images @ torch.cat([all_captions, all_negatives]).T,
                                        torch.cat([all_valid, all_negative_mask]), labels)
        per_caption = _cross_entropy_rows(logit_scale * captions @ all_images.T, all_valid, labels)
        count = all_valid.sum().to(per_image.dtype).clamp(min=1) / self.world_size
        return ((per_image + per_caption) * valid).sum() / (2 * count)


class TripletCLIPLoss(nn.Module):
    """TripletCLIP (Patel et al., NeurIPS 2024; tripletclip/TripletCLIP's ``tripletclip_loss``): NegCLIP's loss
    (``NegCLIPLoss``) on the true pairs with their hard captions as extra columns, L(I, T, T⁻), and on the hard pairs
    (each hard caption's image, generated from it) with the true captions as extra columns, L(I⁻, T⁻, T); a true
    and a hard image never share a softmax.

    ``image``, ``text``, ``negative_image``, ``negative_text`` (B, D); ``has_negative`` (B,) marks the rows that
    have a hard pair: the others' hard caption is no column and their hard image no row.

    The two are averaged (the paper's loss, read as at the scale of NegCLIP's and CLIP's); the
    reference sums them (``reference_sum=True`` keeps that: twice the loss and gradient). The reference neither
    clamps the logit scale (negft's task clamps it before any loss) nor gathers across ranks (it trains on one
    device); negft gathers as ``NegCLIPLoss`` does, so two ranks train as one process on the global batch.
    """

    def __init__(self, rank: int = 0, world_size: int = 1, reference_sum: bool = False):
        super().__init__()
        self.negclip = NegCLIPLoss(rank, world_size)
        self.reference_sum = reference_sum

    def forward(self, image, text, negative_image, negative_text, logit_scale, has_negative=None):
        true_pairs = self.negclip(image, text, negative_text[:, None], logit_scale,
                                  negative_mask=None if has_negative is None else has_negative[:, None])
        hard_pairs = self.negclip(negative_image, negative_text, text[:, None], logit_scale, valid=has_negative)
        total = true_pairs + hard_pairs
        return total if self.reference_sum else total / 2


class MCQLoss(nn.Module):
    """NegBench eq. 1: cross-entropy over C caption options scored by scaled *cosine* similarity.

    The NegBench release scores un-normalised features; the paper (and this class) uses cosine
    similarity, so the loss does not depend on feature norms.
    """

    def forward(self, image_features, option_features, answers, logit_scale, weights=None):
        # image_features (M, D), option_features (M, C, D), both normalised; answers (M,); weights (M,) or None
        logits = logit_scale * torch.einsum("md,mcd->mc", image_features, option_features)
        if weights is None:
            return F.cross_entropy(logits, answers)
        weights = weights.to(logits.dtype)
        return (weights * F.cross_entropy(logits, answers, reduction="none")).sum() / weights.sum().clamp_min(1e-12)


class CoNCLIPLoss(nn.Module):
    """CoN-CLIP (Singh et al., "Learn 'No' to Say 'Yes' Better"), as its authors' ``CustomLossWithNegatives``
    computes it: the mean of three cross-entropies at ``logit_scale · cos``, each a mean over its rows,

    - each image picks its caption among [captions ∥ negated captions];
    - each caption picks its image among [images ∥ distractor images];
    - each distractor image picks its own sample's negated caption among [negated captions ∥ captions].

    A negated caption (CC-Neg's: the caption with an object the image shows negated) is false of its image; the
    distractor (the sample's top-1 COCO image in CC-Neg's ``distractor_image_mapping.pt``) is the image the third
    term pairs with it. The reference has both for every sample. Here a sample may lack either (``has_negated``,
    ``has_distractor`` false; its features any finite values): it is left out of every candidate list and of the
    third term's rows, and the loss is the mean of the terms that have rows. So a batch without distractors scores
    ½(image → [captions ∥ negated] + caption → images), the reference's own loss without distractor images
    (``CustomLoss``, its ``--negative-images=off``).

    Distributed: the reference trains in one process and gathers nothing. Here each rank scores its own rows
    against every rank's features (open_clip's ``gather_features``, ``local_loss`` + ``gather_with_grad``, as
    ``ContrastiveLoss``), with the third term averaged over the global batch's distractors, so the averaged
    gradient equals the one-process gradient on the same global batch. No row is selected by a mask (absent
    candidates are -inf logits): nothing waits for the host.
    """

    def __init__(self, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.rank, self.world_size = rank, world_size

    def gather(self, a, b):
        """Every rank's rows of ``a`` and ``b``, in rank order, with gradients flowing back to their ranks."""
        if self.world_size == 1:
            return a, b
        from open_clip.loss import gather_features
        return gather_features(a, b, local_loss=True, gather_with_grad=True, rank=self.rank,
                               world_size=self.world_size)

    @staticmethod
    def scores(rows, candidates, present, logit_scale):
        """``logit_scale · rows @ candidatesᵀ``, -inf at the candidates that are not there."""
        return (logit_scale * rows @ candidates.T).masked_fill(~present, float("-inf"))

    def forward(self, image, caption, negated, distractor, logit_scale, has_negated=None, has_distractor=None):
        # image, caption, negated, distractor (B, D), normalised, row i of each from sample i; has_* (B,) bool or
        # None (every sample has one)
        b = image.shape[0]
        has_negated = torch.ones(b, dtype=torch.bool, device=image.device) if has_negated is None else has_negated
        has_distractor = torch.ones_like(has_negated) if has_distractor is None else has_distractor
        images, captions = self.gather(image, caption)
        distractors, negateds = self.gather(distractor, negated)
        distractor_present, negated_present = (m > 0 for m in self.gather(has_distractor.to(image.dtype),
                                                                          has_negated.to(image.dtype)))
        texts = torch.cat([captions, negateds])
        text_present = torch.cat([torch.ones_like(negated_present), negated_present])
        pictures = torch.cat([images, distractors])
        picture_present = torch.cat([torch.ones_like(distractor_present), distractor_present])
        own = self.rank * b + torch.arange(b, device=image.device)

        image_to_text = F.cross_entropy(self.scores(image, texts, text_present, logit_scale), own)
        text_to_image = F.cross_entropy(self.scores(caption, pictures, picture_present, logit_scale), own)
        # the third term's rows: a distractor whose sample has a negated caption (others score a zero row, then 0)
        scored = has_distractor & has_negated
        count = (distractor_present & negated_present).sum()       # the global batch's
        logits = self.scores(distractor, texts, text_present, logit_scale).where(scored[:, None], 0.0)
        per_row = F.cross_entropy(logits, len(images) + own, reduction="none")
        distractor_to_negated = (per_row * scored).sum() * self.world_size / count.clamp_min(1)
        return (image_to_text + text_to_image + distractor_to_negated) / (2 + (count > 0))


class ITMTripletLoss(nn.Module):
    """The RelComp image-text matching loss (Probe-R/C/B paper, section 5 and figure 7) as a triplet loss.

    The paper does not publish its loss; ours, with cosine similarities s and margin m:

    - image-anchored: for each image I and its true caption T⁺, the mean over its selective negatives T⁻
      (attribute, predicate or subject/object swaps) of max(0, m − s(I, T⁺) + s(I, T⁻));
    - text-anchored: for each true caption with a hard negative image I⁻ (same objects, another relation
      or attributes), max(0, m − s(I, T⁺) + s(I⁻, T⁺));

    each averaged over the anchors that have one, and summed.
    """

    def __init__(self, margin: float = 0.2):
        super().__init__()
        self.margin = margin

    def forward(self, image, positive, negatives, negative_image=None, has_negative_image=None,
                negative_mask=None, anchors=None, negative_rows=None):
        # image, positive (B, D); negatives (B, K, D); negative_image (B, D); has_negative_image (B,) bool;
        # negative_mask (B, K) bool marks real negatives when a caption has fewer than K; anchors, negative_rows:
        # the rows with a negative caption, and with a negative image (rows_of the host's masks; else read here)
        pos = (image * positive).sum(-1)                                  # s(I, T⁺)
        neg = torch.einsum("bd,bkd->bk", image, negatives)                # s(I, T⁻)
        hinge = F.relu(self.margin - pos.unsqueeze(1) + neg)
        if negative_mask is None:
            loss = hinge.mean()
        else:
            mask = negative_mask.to(hinge.dtype)
            count = mask.sum(1)
            per_anchor = (hinge * mask).sum(1) / count.clamp(min=1)
            if anchors is None:
                anchors = rows_of(count > 0, count.device)
            loss = per_anchor[anchors].mean() if len(anchors) else hinge.sum() * 0
        if negative_image is not None and has_negative_image is not None:
            if negative_rows is None:
                negative_rows = rows_of(has_negative_image, has_negative_image.device)
            if len(negative_rows):
                hard = (negative_image * positive).sum(-1)                    # s(I⁻, T⁺)
                loss = loss + F.relu(self.margin - pos + hard)[negative_rows].mean()
        return loss


class RelCompLoss(nn.Module):
    """RelComp fine-tuning (Probe-R/C/B section 5): w_itm·L_itm + w_clip·L_clip.

    L_itm is the triplet loss above on the RelComp batch; L_clip is the contrastive loss over every true
    image-caption pair of the step (the RelComp captions, plus a contrastive stream's pairs when the recipe
    has one), which keeps the general representation the ITM term alone would erode.
    """

    def __init__(self, margin: float, w_itm: float, w_clip: float, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.w_itm, self.w_clip = w_itm, w_clip
        self.itm = ITMTripletLoss(margin)
        self.contrastive = ContrastiveLoss(rank, world_size)

    def forward(self, logit_scale, itm, contrastive=None):
        """``itm`` = dict(image, positive, negatives, negative_mask, negative_image, has_negative_image)."""
        image, text = itm["image"], itm["positive"]
        if contrastive is not None:
            image, text = torch.cat([image, contrastive[0]]), torch.cat([text, contrastive[1]])
        parts = {"itm": self.itm(**itm), "contrastive": self.contrastive(image, text, logit_scale)}
        total = self.w_itm * parts["itm"] + self.w_clip * parts["contrastive"]
        return total, {k: v.detach() for k, v in parts.items()}


class FocalHardNegativeLoss(nn.Module):
    """FSC-CLIP's global hard-negative loss (Oh et al., EMNLP 2024; ytaek-oh/fsc-clip ``Global_HNLoss``): each image
    picks its caption among [caption, its K hard negative captions] at ``s · v · t``, a (1+K)-way loss of column 0
    with the paper's two calibrations — a focal weight ``(1 − p)^γ`` on every column's ``−log p`` and label
    smoothing ε spread uniformly over the row's real candidates — averaged over the rows that have a negative.

    Defaults are the paper's recipe (γ 2, ε 0.02); the reference's argparse defaults are plain cross-entropy
    without smoothing (γ 0, ε 0 here; its focal loss defaults to γ 1). A missing negative (``negative_mask``
    false) is left out of the softmax: the reference zero-fills its feature, so its logit 0 stays in the softmax
    with target 0 (``zero_fill_missing`` reproduces that). It takes no input from other ranks (each rank's mean
    over its own rows, as the reference)."""

    def __init__(self, gamma: float = 2.0, smoothing: float = 0.02, zero_fill_missing: bool = False):
        super().__init__()
        self.gamma, self.smoothing, self.zero_fill_missing = gamma, smoothing, zero_fill_missing

    def classify(self, logits, negative_mask, rows=None):
        """The loss of column 0 of ``logits`` (B, 1+K) over the real columns (``negative_mask`` (B, K)), averaged
        over ``rows`` (rows_of the host's ``negative_mask.any(-1)``; else read here); 0, keeping the graph, when
        no row has a negative."""
        if rows is None:
            rows = rows_of(negative_mask.any(-1), negative_mask.device)
        if not len(rows):
            return logits.sum() * 0.0
        logits, mask = logits[rows], negative_mask[rows]
        real = torch.cat([torch.ones_like(mask[:, :1]), mask], 1)
        scored = logits.masked_fill(~real, 0.0)              # a zero feature's logit; finite, so no NaN gradient
        kept = scored if self.zero_fill_missing else scored.masked_fill(~real, float("-inf"))
        log_p = scored - torch.logsumexp(kept, -1, keepdim=True)
        focal = -(1 - log_p.exp()).pow(self.gamma) * log_p
        share = real.to(logits.dtype)
        target = share * (self.smoothing / share.sum(-1, keepdim=True))
        target[:, 0] += 1 - self.smoothing
        return (target * focal).sum(-1).mean()

    def forward(self, image, positive, negatives, negative_mask, logit_scale, rows=None):
        # image, positive (B, D); negatives (B, K, D); negative_mask (B, K) bool; rows: as classify's
        candidates = torch.cat([positive[:, None], negatives], 1)
        return self.classify(logit_scale * torch.einsum("bd,bkd->bk", image, candidates), negative_mask, rows)


class TokenPatchHardNegativeLoss(nn.Module):
    """FSC-CLIP's local hard-negative loss (``Local_HNLoss``): the same focal, smoothed (1+K)-way loss as
    ``FocalHardNegativeLoss``, on a token-level score of each (image, caption) pair instead of the global one.

    Each caption token t gets its own visual feature, the image's patches averaged with weights from the
    token-patch similarities (min-max scaled over the patches, then summed to 1; detached, so only the average
    carries a gradient), normalised; the pair's score is ``logsumexp_t s · cos(patches_t, t)`` over the caption's
    tokens (``token_mask``). Tokens and patches come unnormalised: the weights use raw dot products, as the
    reference's. Where a token's similarities are all equal the reference's min-max is 0/0 (NaN); here the
    weights are uniform. Missing negatives and ranks: as ``FocalHardNegativeLoss``."""

    def __init__(self, gamma: float = 2.0, smoothing: float = 0.02, zero_fill_missing: bool = False):
        super().__init__()
        self.focal = FocalHardNegativeLoss(gamma, smoothing, zero_fill_missing)

    @staticmethod
    def patches_per_token(image_tokens, text_tokens):
        """(N, P, D), (N, L, D) → (N, L, D): each token's similarity-weighted average of its image's patches."""
        sim = torch.einsum("nld,npd->nlp", text_tokens, image_tokens).detach()
        low, high = sim.aminmax(dim=-1, keepdim=True)
        span = high - low
        weights = torch.where(span > 0, (sim - low) / span, torch.ones_like(sim))
        weights = weights / weights.sum(-1, keepdim=True)
        return F.normalize(torch.einsum("nlp,npd->nld", weights, image_tokens), dim=-1)

    def score(self, image_tokens, text_tokens, token_mask, logit_scale):
        """(N,): ``logsumexp`` over each caption's tokens of the scaled cosine to its patches. A caption with no
        token (a missing negative's padding) scores over all its positions, so finitely: it is masked out after."""
        cos = (self.patches_per_token(image_tokens, text_tokens) * F.normalize(text_tokens, dim=-1)).sum(-1)
        mask = token_mask | ~token_mask.any(-1, keepdim=True)
        return torch.logsumexp((logit_scale * cos).masked_fill(~mask, float("-inf")), -1)

    def forward(self, image_tokens, text_tokens, token_mask, negative_tokens, negative_token_mask, negative_mask,
                logit_scale, rows=None):
        # image_tokens (B, P, D) patches; text_tokens (B, L, D), token_mask (B, L) bool; negative_tokens
        # (B, K, L, D), negative_token_mask (B, K, L); negative_mask (B, K) bool; rows: as classify's
        if rows is None:
            rows = rows_of(negative_mask.any(-1), negative_mask.device)
        if not len(rows):
            return (image_tokens.sum() + text_tokens.sum() + negative_tokens.sum()) * 0.0
        k = negative_tokens.shape[1]
        positive = self.score(image_tokens, text_tokens, token_mask, logit_scale)
        negative = self.score(image_tokens.repeat_interleave(k, 0), negative_tokens.flatten(0, 1),
                              negative_token_mask.flatten(0, 1), logit_scale).view(-1, k)
        return self.focal.classify(torch.cat([positive[:, None], negative], 1), negative_mask, rows)


class FSCCLIPLoss(nn.Module):
    """FSC-CLIP fine-tuning: L_clip + w_global·L_global_hn + w_local·L_local_hn (the reference's ``Local_HNLoss``
    with ``--apply-global-neg-loss --apply-local-neg-loss``).

    L_clip is the B×B contrastive loss of the images and their captions (the hard negatives enter only the
    HN terms). Defaults are the paper's COCO ViT-B/32 recipe (w 0.5, 0.2; its CC3M recipe has w_global 1.0, its
    ViT-B/16 and L/14 ones w_local 0.5). The reference gathers L_clip's features without a gradient (a rank's
    own rows carry it), so its averaged gradient is 1/world_size of one process's; here the gather carries it
    (``ContrastiveLoss``), so it equals one process's. A batch with no negative (the reference crashes) gives
    L_clip alone. ``w_local`` 0 skips the token inputs."""

    def __init__(self, w_global: float = 0.5, w_local: float = 0.2, gamma: float = 2.0, smoothing: float = 0.02,
                 zero_fill_missing: bool = False, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.w_global, self.w_local = w_global, w_local
        self.contrastive = ContrastiveLoss(rank, world_size)
        self.global_hn = FocalHardNegativeLoss(gamma, smoothing, zero_fill_missing)
        self.local_hn = TokenPatchHardNegativeLoss(gamma, smoothing, zero_fill_missing)

    def forward(self, logit_scale, image, text, negatives, negative_mask, tokens=None, rows=None):
        """``tokens`` = dict(image_tokens, text_tokens, token_mask, negative_tokens, negative_token_mask) when
        ``w_local`` > 0; ``rows``: rows_of the host's ``negative_mask.any(-1)`` (else read here)."""
        if rows is None:
            rows = rows_of(negative_mask.any(-1), negative_mask.device)
        parts = {"clip": self.contrastive(image, text, logit_scale),
                 "global_hn": self.global_hn(image, text, negatives, negative_mask, logit_scale, rows)}
        total = parts["clip"] + self.w_global * parts["global_hn"]
        if self.w_local:
            parts["local_hn"] = self.local_hn(**tokens, negative_mask=negative_mask, logit_scale=logit_scale,
                                              rows=rows)
            total = total + self.w_local * parts["local_hn"]
        return total, {k: v.detach() for k, v in parts.items()}


class NegFullLoss(nn.Module):
    """NegBench eq. 2: α·L_clip(NegCap batch) + (1−α)·L_mcq(NegMCQ batch)."""

    def __init__(self, alpha: float, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.alpha = alpha
        self.contrastive = ContrastiveLoss(rank, world_size)
        self.mcq = MCQLoss()

    def forward(self, logit_scale, contrastive=None, mcq=None):
        """``contrastive`` = (img, txt) features; ``mcq`` = (img, options, answers[, per-question weights]).
        Either may be None."""
        parts = {}
        if contrastive is not None:
            parts["contrastive"] = self.contrastive(*contrastive, logit_scale)
        if mcq is not None:
            img, options, answers, *weights = mcq
            parts["mcq"] = self.mcq(img, options, answers, logit_scale, weights=weights[0] if weights else None)
        if len(parts) == 2:
            total = self.alpha * parts["contrastive"] + (1 - self.alpha) * parts["mcq"]
        else:
            total = next(iter(parts.values()))
        return total, {k: v.detach() for k, v in parts.items()}


class TextToImageMCQLoss(nn.Module):
    """A text→image MCQ term: each MCQ's right answer ("no X", "a Y but no X", ...) picks, among the batch's
    images, one it is true of — ``−log Σ_{j true} softmax_j(s · t_i · v_j)`` — so a negated object must pull the
    answer away from the images that contain it. ``truth`` (M, M) marks which images each answer is true of
    (the pipeline's ``answer_truth``, from the samples' object labels); the diagonal is always true, and a row that
    is all true (a question without labels) adds exactly 0. Over every option (``option_truth``, (M·C, M)) a
    wrong option may be true of no image of the batch: such a row has nothing to pick and is left out."""

    def forward(self, image_features, answer_features, truth, logit_scale, some=None):
        """``some``: ``truth.any(-1)``, the host's copy where the caller has it (else read from ``truth``)."""
        some = truth.any(-1) if some is None else some
        if not some.all():
            rows = rows_of(some, truth.device)
            answer_features, truth = answer_features[rows], truth[rows]
        if truth.shape[0] == 0:
            return answer_features.sum() * 0.0
        logits = logit_scale * answer_features @ image_features.T
        return (torch.logsumexp(logits, -1) - torch.logsumexp(logits.masked_fill(~truth, float("-inf")), -1)).mean()


class CECLIPLoss(nn.Module):
    """CE-CLIP (Zhang, Awal & Agrawal, CVPR 2024): ``L_hn + cmr_weight·L_cmr + imc_weight·L_imc`` over images v,
    their captions t and each caption's K typed hard negatives n (the reference's data: relation, adjective, noun,
    verb swaps, in that order), all at ``s = logit_scale``. Its authors' code is lezhang7/Enhance-FineGrained
    @ ef87eb7, ``Clip_DALoss`` as its recipe runs it (``--hardnegative --cmr-loss --imc-loss``, thresholds
    ``mean``, weights 0.2 and 0.3, ``--upper-bound 10``).

    - L_hn: CLIP's symmetric InfoNCE with every hard negative appended to the image→text candidates;
    - L_cmr: the cross-modal rank hinge, the mean over the (B, K) pairs of
      ``relu(τ_k + s·v_i·n_ik − s·v_i·t_i)``, a missing negative adding 0. τ (K,), in logits, is the buffer
      ``thresholds``: each call computes its loss with the previous one's τ, then sets τ_k to the global batch's
      mean gap ``s·v·t − s·v·n_k`` over its real type-k pairs, clamped to [0, upper_bound] (the reference's loop
      clamps it, and starts each epoch from 0: zero the buffer for that);
    - L_imc: for each caption, the cross-entropy of its image's logit ``s·v_i·t_i`` among it and the caption's
      similarities to its own negatives ``s·t_i·n_ik``, which pushes a caption away from its negatives in the
      text space: the paper's eq. 3 as we read it, and what the reference's ``get_imc_loss`` is handed and
      documents (the positive logits, the text-text matrix "served as denominator", the target 0) but does not
      compute.

    ``reference_bugs=True`` reproduces the reference where it departs from that (default off):

    - L_imc scores each caption against every negative of the batch with target 0, the first sample's first
      (relation) negative (its issue #15), so it pulls each caption towards one sample's negative;
    - a type with no real negative in the batch makes its τ 0/0 = NaN, which the clamp keeps and every later loss
      inherits; negft keeps that type's previous τ. Its τ also averages the positives over every row but the
      negatives over the nonzero logits (a real negative orthogonal to its image counts as missing); negft
      averages the gap over the real pairs;
    - missing negatives (its data's ``###`` placeholders) are candidates of L_hn and L_imc; negft masks them out.

    Distributed: the reference's recipe gathers without gradients and has every rank compute the global batch's
    loss through its own rows only, so the ranks' averaged gradient is 1/world_size of one process's. Here, as in
    ``ContrastiveLoss``, each rank scores its own rows against every rank's captions, negatives and images through
    a gather that passes gradients back (open_clip's ``local_loss`` + ``gather_with_grad``), and τ's sums are
    all-reduced, so the averaged gradient and τ equal one process's on the global batch.
    """

    def __init__(self, cmr_weight: float = 0.2, imc_weight: float = 0.3, upper_bound: float = 10.0,
                 n_types: int = 4, reference_bugs: bool = False, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.cmr_weight, self.imc_weight, self.upper_bound = cmr_weight, imc_weight, upper_bound
        self.reference_bugs, self.rank, self.world_size = reference_bugs, rank, world_size
        self.register_buffer("thresholds", torch.zeros(n_types))

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` in rank order; gradients flow back to the rank that holds each row."""
        if self.world_size == 1:
            return x
        return torch.cat(torch.distributed.nn.all_gather(x))

    def _all_sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            torch.distributed.all_reduce(x)
        return x

    def _hard_negative_clip(self, image, text, flat, flat_mask, logit_scale):
        all_texts, all_negatives, all_images = self._gather(text), self._gather(flat), self._gather(image)
        labels = torch.arange(len(image), device=image.device) + len(image) * self.rank
        per_image = logit_scale * image @ torch.cat([all_texts, all_negatives]).T
        if not self.reference_bugs:
            captions = torch.ones(len(all_texts), dtype=torch.bool, device=image.device)
            real = torch.cat([captions, self._gather(flat_mask.to(flat.dtype)).bool()])
            per_image = per_image.masked_fill(~real, float("-inf"))
        per_text = logit_scale * text @ all_images.T
        return (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2

    def _intra_modal(self, text, negatives, flat, negative_mask, positive, logit_scale):
        if self.reference_bugs:
            logits = logit_scale * text @ self._gather(flat).T
        else:
            own = logit_scale * torch.einsum("bd,bkd->bk", text, negatives)
            logits = torch.cat([positive[:, None], own.masked_fill(~negative_mask, float("-inf"))], 1)
        return F.cross_entropy(logits, torch.zeros(len(text), dtype=torch.long, device=text.device))

    @torch.no_grad()
    def _next_thresholds(self, positive, negative, negative_mask):
        """τ_k: the global batch's mean gap s·v·t − s·v·n_k (the reference's, under ``reference_bugs``)."""
        if self.reference_bugs:
            seen = (negative != 0).to(negative.dtype)
            rows = torch.full_like(seen[0], len(positive))
            positives, rows, negatives, seen = self._all_sum(
                torch.stack([positive.sum().expand_as(rows), rows, (negative * seen).sum(0), seen.sum(0)]))
            gap = positives / rows - negatives / seen
        else:
            real = negative_mask.to(negative.dtype)
            gaps, count = self._all_sum(torch.stack([((positive[:, None] - negative) * real).sum(0), real.sum(0)]))
            gap = torch.where(count > 0, gaps / count.clamp(min=1), self.thresholds.to(gaps.dtype))
        return gap.clamp(0, self.upper_bound)

    def forward(self, image, text, negatives, negative_mask, logit_scale):
        """image, text (B, D); negatives (B, K, D), ``negative_mask`` (B, K) bool marking the real ones (a missing
        one is any placeholder row). Returns (total, {hn, cmr, imc}: the unweighted parts, detached) and moves τ."""
        b, k, d = negatives.shape
        if self.thresholds.device != image.device:    # the term is no submodule of the model: its τ moves here
            self.thresholds = self.thresholds.to(image.device)
        flat, flat_mask = negatives.reshape(b * k, d), negative_mask.reshape(b * k)
        positive = logit_scale * (image * text).sum(-1)                                      # (B,)
        negative = logit_scale * torch.einsum("bd,bkd->bk", image, negatives) * negative_mask  # (B, K), 0 if missing
        parts = {
            "hn": self._hard_negative_clip(image, text, flat, flat_mask, logit_scale),
            "cmr": (F.relu(self.thresholds + negative - positive[:, None]) * negative_mask).mean(),
            "imc": self._intra_modal(text, negatives, flat, negative_mask, positive, logit_scale),
        }
        self.thresholds = self._next_thresholds(positive.detach(), negative.detach(), negative_mask)
        total = parts["hn"] + self.cmr_weight * parts["cmr"] + self.imc_weight * parts["imc"]
        return total, {name: value.detach() for name, value in parts.items()}


class HardNegativeLoss(nn.Module):
    """negft's NegCap hard-negative term: ``−log softmax`` of each caption's own image among {its image} ∪ {its
    hard negatives} (``hard`` (M, M): the step's images the caption is false of, ``negcap_hard_negatives``), at
    ``s · t_i · v_j``, averaged over the captions that have one; the plain contrastive loss weighs such an image
    as any other. 0, keeping the graph, when no caption has one."""

    def forward(self, image_features, text_features, hard, logit_scale, some=None):
        """``some``: ``hard.any(-1)``, the host's copy where the caller has it (else read from ``hard``)."""
        logits = logit_scale * text_features @ image_features.T
        some = hard.any(-1) if some is None else some
        if not some.any():
            return logits.sum() * 0.0
        rows = rows_of(some, hard.device)
        logits, candidates = logits[rows], hard[rows].clone()
        candidates[torch.arange(len(rows), device=rows.device), rows] = True
        own = logits.gather(1, rows[:, None]).squeeze(1)
        return (torch.logsumexp(logits.masked_fill(~candidates, float("-inf")), -1) - own).mean()


class DriftGuard(nn.Module):
    """negft's drift guard: keeps the fine-tuned model close to the frozen base where the fine-tuning data says
    nothing new. Every term is zero-weighted by default; its weights are ``loss.guard.*`` (the ``Guard`` term).

    - ``caption``: feature distillation on the affirmative captions of the step's images (the shards' ``caption``),
      ``w · mean(1 − cos(f_θ, f_base))``;
    - ``options``: the same on the step's affirmative MCQ options (``option_templates == positive``);
    - ``kl``: LwF / ZSCL distillation of the batch's image→caption similarity distribution,
      ``w · mean_i KL(p_base(i, ·) ‖ p_θ(i, ·))``, each row a softmax over the batch's affirmative captions at the
      base's logit scale (p_base) and the model's (p_θ);
    - ``l2sp``: an L2-SP anchor on the trained weights, ``w · Σ ‖θ − θ_base‖²`` (summed over every element).

    Features come in unnormalised or normalised (they are normalised here); the base's come from the frozen
    reference under no_grad. Returns (total, logs) with each active term's unweighted value in ``logs``.
    """

    def __init__(self, caption: float = 0.0, options: float = 0.0, kl: float = 0.0, l2sp: float = 0.0):
        super().__init__()
        self.w = {"caption": caption, "options": options, "kl": kl, "l2sp": l2sp}

    @property
    def active(self) -> bool:
        return any(v > 0 for v in self.w.values())

    @property
    def needs_captions(self) -> bool:
        return self.w["caption"] > 0 or self.w["kl"] > 0

    @staticmethod
    def distill(f, f_base):
        """mean(1 − cos(f, f_base)) over rows."""
        return (1 - (F.normalize(f, dim=-1) * F.normalize(f_base, dim=-1)).sum(-1)).mean()

    @staticmethod
    def kl_div(img, txt, scale, img_base, txt_base, scale_base):
        """mean over images of KL(softmax(s_b·img_b·txt_bᵀ) ‖ softmax(s·img·txtᵀ)), rows over the captions."""
        logits = scale * F.normalize(img, dim=-1) @ F.normalize(txt, dim=-1).T
        logits_base = scale_base * F.normalize(img_base, dim=-1) @ F.normalize(txt_base, dim=-1).T
        log_p, log_q = F.log_softmax(logits_base, dim=-1), F.log_softmax(logits, dim=-1)
        return (log_p.exp() * (log_p - log_q)).sum(-1).mean()

    @staticmethod
    def anchor(pairs):
        """Σ ‖θ − θ_base‖² over (parameter, its base value) pairs."""
        return sum(((p.float() - p0.float()) ** 2).sum() for p, p0 in pairs)

    def forward(self, caption=None, options=None, kl=None, l2sp=None):
        """``caption`` / ``options`` = (f_θ, f_base); ``kl`` = (img, txt, scale, img_base, txt_base, scale_base);
        ``l2sp`` = [(param, base value)]. A term whose input is None or whose weight is 0 is left out."""
        parts = {}
        if caption is not None and self.w["caption"] > 0 and len(caption[0]):
            parts["caption"] = self.distill(*caption)
        if options is not None and self.w["options"] > 0 and len(options[0]):
            parts["options"] = self.distill(*options)
        if kl is not None and self.w["kl"] > 0 and len(kl[0]):
            parts["kl"] = self.kl_div(*kl)
        if l2sp is not None and self.w["l2sp"] > 0:
            parts["l2sp"] = self.anchor(l2sp)
        if not parts:
            return None, {}
        total = sum(self.w[k] * v for k, v in parts.items())
        return total, {f"guard_{k}": v.detach() for k, v in parts.items()}


# ----------------------------------------------------------------------------- batch fields, from the samples' json
# A term's ``fields`` map a batch field to a function (the batch's samples' json, the stream's tokenizer) -> tensor,
# which the data pipeline calls on each batch of a stream that reads them (negft.data.pipeline.StreamSpec.fields).

def _mentions(text: str, names) -> set:
    return {n for n in names if re.search(rf"\b{re.escape(n)}s?\b", text.lower())}


def _objects(meta: dict) -> tuple[list, list]:
    objects = meta.get(schema.OBJECTS)
    if not isinstance(objects, dict):
        return [], []
    return [o for o in objects.get("positive", []) if isinstance(o, str)], \
        [o for o in objects.get("negative", []) if isinstance(o, str)]


def answer_truth(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(M, M) bool: whether question i's right answer is true of image j, from the object labels. The answer's
    mentioned objects that image i holds are affirmed, those it lacks negated; the answer is true of image j when
    j holds every affirmed object and none of the negated ones. Where a label is missing (real data without
    ``objects``) the truth is unknown and counted true: an unlabelled question's row is all true, so it adds
    nothing to the text→image term ("no dog" is true of most images; treating them as wrong would teach the
    opposite of negation), and an unlabelled image is never a wrong pick."""
    objects = [_objects(m) for m in metas]
    pos = [set(p) for p, _ in objects]
    neg = [set(n) for _, n in objects]
    labelled = [bool(p or n) for p, n in zip(pos, neg)]
    truth = torch.ones(len(metas), len(metas), dtype=torch.bool)
    for i, m in enumerate(metas):
        if not labelled[i]:
            continue
        answer = m[schema.MCQ]["options"][m[schema.MCQ]["answer"]]
        said = _mentions(answer, pos[i] | neg[i])
        affirmed, negated = said & pos[i], said & neg[i]
        for j in range(len(metas)):
            if labelled[j] and j != i:
                truth[i, j] = affirmed <= pos[j] and not (negated & pos[j])
    return truth


def option_truth(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(M·C, M) bool, rows in (question, option) order: whether option c of question i is true of image j, from
    the option's recorded [affirmed, negated] objects (``mcq.option_objects``) and image j's labels: j holds the
    affirmed object and not the negated one. A question without ``option_objects``, or an image without labels,
    is unknown and counted true (an all-true row adds 0 to the term), as in ``answer_truth``."""
    pos = [set(_objects(m)[0]) for m in metas]
    n = len(metas)
    truth = torch.ones(n, schema.N_OPTIONS, n, dtype=torch.bool)
    for i, m in enumerate(metas):
        said = m[schema.MCQ].get("option_objects")
        if not (isinstance(said, list) and len(said) == schema.N_OPTIONS
                and all(isinstance(o, list) and len(o) == 2 for o in said)):
            continue
        for c, (affirmed, negated) in enumerate(said):
            for j in range(n):
                if pos[j]:
                    truth[i, c, j] = (affirmed is None or affirmed in pos[j]) and negated not in pos[j]
    return truth.flatten(0, 1)


def negcap_hard_negatives(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(M, M) bool: whether image j (j ≠ i) holds an object that the NegCap caption drawn for sample i negates
    (one of i's labelled ``objects.negative`` the caption mentions, which image i lacks), so the caption is false
    of it. A sample without a drawn NegCap caption (another stream's) or without labels has no hard negatives,
    and an unlabelled image is none: the labels alone say an image holds the object."""
    objects = [_objects(m) for m in metas]
    held = [set(pos) for pos, _ in objects]
    hard = torch.zeros(len(metas), len(metas), dtype=torch.bool)
    for i, m in enumerate(metas):
        caption = m.get(schema.DRAWN_NEGCAP)
        negated = _mentions(caption, objects[i][1]) if isinstance(caption, str) else set()
        for j, h in enumerate(held):
            hard[i, j] = j != i and bool(negated & h)
    return hard


def _caption(meta: dict) -> str:
    caption = meta.get(schema.CAPTION)
    return caption if isinstance(caption, str) else ""


def caption_tokens(metas: list[dict], tokenize) -> torch.Tensor:
    """The tokens of each sample's affirmative ``caption`` ("" where it has none)."""
    return tokenize([_caption(m) for m in metas])


def has_caption(metas: list[dict], tokenize=None) -> torch.Tensor:
    return torch.tensor([bool(_caption(m)) for m in metas])


def option_affirmative(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(M, C) bool: which MCQ options are affirmative (``option_templates`` == positive; none where unrecorded)."""
    rows = []
    for m in metas:
        templates = m[schema.MCQ].get("option_templates")
        rows.append([t == "positive" for t in templates] if isinstance(templates, list)
                    and len(templates) == schema.N_OPTIONS else [False] * schema.N_OPTIONS)
    return torch.tensor(rows)


def question_weights(metas: list[dict], tokenize=None, weight: float = 1.0) -> torch.Tensor:
    """(M,): ``weight`` where the question's right answer is a negation (``answer_template`` = negative), 1
    elsewhere."""
    return torch.tensor([weight if m[schema.MCQ].get("answer_template") == "negative" else 1.0 for m in metas])


def _hard_texts(meta: dict) -> tuple[str, str, str]:
    """A RelComp sample's (drawn hard caption, its negative image's caption, that image's drawn hard caption), ""
    for what it lacks. The pipeline drew the indices for the epoch (``schema.DRAWN_NEGATIVES``)."""
    record = meta.get(schema.RELCOMP)
    drawn = meta.get(schema.DRAWN_NEGATIVES)
    if not isinstance(record, dict) or drawn is None:
        return "", "", ""
    negatives = [n["text"] for n in record.get("negatives") or () if isinstance(n, dict)]
    own = record.get("negative_image_caption")
    own = own if isinstance(own, str) else ""
    theirs = [t for t in record.get("negative_image_negatives") or () if isinstance(t, str) and t]
    return (negatives[drawn[0]] if drawn[0] < len(negatives) else "", own,
            theirs[drawn[1]] if own and drawn[1] < len(theirs) else "")


def hard_caption(metas: list[dict], tokenize) -> torch.Tensor:
    """(B, L): one hard-negative caption of each image, drawn from its ``negatives`` anew each epoch (NegCLIP's T⁻)."""
    return tokenize([_hard_texts(m)[0] for m in metas])


def negative_image_caption(metas: list[dict], tokenize) -> torch.Tensor:
    """(B, L): the caption of each sample's hard-negative image ("" where it has none: TripletCLIP's T⁻ of I⁻)."""
    return tokenize([_hard_texts(m)[1] for m in metas])


def negative_image_hard_caption(metas: list[dict], tokenize) -> torch.Tensor:
    """(B, L): a hard-negative caption of the negative image, drawn anew each epoch (NegCLIP's fourth text block)."""
    return tokenize([_hard_texts(m)[2] for m in metas])


def negative_image_captioned(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(B,) bool: the sample's negative image comes with its own caption."""
    return torch.tensor([bool(_hard_texts(m)[1]) for m in metas])


def negative_image_hard_captioned(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(B,) bool: the sample's negative image comes with its own caption and a hard caption of it."""
    return torch.tensor([all(_hard_texts(m)[1:]) for m in metas])


# ----------------------------------------------------------------------------- terms
@dataclass
class Step:
    """What ``Task.forward`` hands each term: the step encoded once (negft.train.task)."""
    batch: dict                 # the step's batches by stream task (contrastive, mcq, itm)
    scale: torch.Tensor         # exp(logit_scale), clamped, fp32
    features: dict              # normalised features per stream task (task.step_features)
    images: torch.Tensor        # every image's features, unnormalised, in task.step_inputs' order
    texts: torch.Tensor         # every text's features, unnormalised, in task.step_inputs' order
    extra: dict                 # term name -> the features of the texts it asked for (Term.texts)
    encode_text: Callable       # (model, tokens, host's copy or None) -> text features, trimmed
    image_rows: dict = field(default_factory=dict)  # stream task -> the slice of ``images`` that is its batch's
    text_rows: dict = field(default_factory=dict)   # stream task -> the slice of ``texts`` that is its batch's
    host: dict | None = None    # stream task -> the host's copy of its batch (HOST), None where the step has none:
    #                             what sizes an output by the values is read there, with no round trip
    tokens: dict | None = None  # where a term asks (Term.tokens): the itm batch's patch and token features


class Term:
    """One summand of an objective. Subclasses set the class attributes and override what they use."""
    name: ClassVar[str] = ""                # its log key
    block: ClassVar[str | None] = None      # its own settings block ``loss.<block>``; None: the objective's block
    Settings: ClassVar[type | None] = None  # a dataclass of its keys, their defaults and ranges (negft.fields)
    off: ClassVar[dict] = {}                # key -> the value at which it adds nothing (or NegBench's own loss)
    reads: ClassVar[tuple[str, ...]] = ()   # an objective's first term: the stream tasks it scores
    needs: ClassVar[tuple[str, ...]] = ()   # ... and those it cannot do without
    by_image: ClassVar[tuple[str, ...]] = ()  # its fields indexed by the batch's images ((M, M), (M·C, M))
    tokens: bool = False                    # it reads the itm batch's patch and token features (Step.tokens)

    def __init__(self, settings=None, rank: int = 0, world_size: int = 1):
        self.settings = settings

    def on(self) -> bool:
        """False when it adds nothing (a weight of 0): it is then not built."""
        return True

    def fields(self, task: str) -> dict[str, Callable]:
        """The batch fields a stream of ``task`` carries for it: name -> fn(samples' json, tokenizer)."""
        return {}

    def texts(self, batch: dict) -> list[torch.Tensor]:
        """Token rows of its own to encode in the step's one text pass (``Step.extra[name]``)."""
        return []

    def attach(self, clip: nn.Module, tower: str) -> None:
        """Called once the model is built, before training (``tower``: the towers that train)."""

    def state(self) -> dict[str, torch.Tensor]:
        """What it carries from one step to the next: a checkpoint keeps it, and a resumed run goes on from it."""
        return {}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take back what ``state`` gave (from a checkpoint)."""

    def forward(self, step: Step) -> tuple[torch.Tensor | None, dict]:
        raise NotImplementedError

    def __call__(self, step: Step):
        return self.forward(step)


def weight(doc: str) -> Any:
    """A term's weight: >= 0, 0 = off (the default)."""
    return bounded(0.0, lo=0.0, fix="must be >= 0 (0: off)", doc=doc)


def _flag(doc: str) -> Any:
    """A switch, off by default."""
    return choice(False, (False, True), doc=doc)


def _negation_weight() -> Any:
    return bounded(1.0, lo=0.0, fix="must be >= 0 (1: NegBench's unweighted mean)",
                   doc="the weight of negation-type questions (the right answer negates: NegBench's ``negative`` "
                       "template) in the MCQ loss, the others' 1 (a weighted mean); 1 = NegBench's unweighted mean")


@dataclass
class MCQSettings:
    negation_weight: float = _negation_weight()


def _question_weight_fields(settings, task: str) -> dict:
    """mcq_weight on an mcq stream when negation-type questions are weighted."""
    w = settings.negation_weight
    return {"mcq_weight": partial(question_weights, weight=w)} if task == "mcq" and w != 1.0 else {}


class Contrastive(Term):
    """``clip``: open_clip's symmetric InfoNCE over the contrastive streams' pairs."""
    name = "contrastive"
    reads = needs = ("contrastive",)

    def __init__(self, settings=None, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = ContrastiveLoss(rank, world_size)

    def forward(self, step):
        loss = self.loss(*step.features["contrastive"], step.scale)
        return loss, {"contrastive": loss.detach()}


class MCQ(Term):
    """``mcq``: NegBench's MCQ loss alone (eq. 1) on the mcq stream."""
    name = "mcq"
    reads = needs = ("mcq",)
    Settings = MCQSettings
    off = {"negation_weight": 1.0}

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = MCQLoss()

    def fields(self, task):
        return _question_weight_fields(self.settings, task)

    def forward(self, step):
        img, options, answers, weights = step.features["mcq"]
        loss = self.loss(img, options, answers, step.scale, weights=weights)
        return loss, {"mcq": loss.detach()}


@dataclass
class NegFullSettings:
    alpha: float = bounded(0.5, lo=0.0, hi=1.0, fix="must lie in [0, 1] (the weight of the contrastive loss)",
                           doc="α, the weight of the contrastive loss")
    negation_weight: float = _negation_weight()     # as loss.mcq.negation_weight


class NegFull(Term):
    """``negfull``: NegBench eq. 2, α·L_clip(contrastive streams) + (1−α)·L_mcq(mcq stream)."""
    name = "negfull"
    reads = needs = ("contrastive", "mcq")
    Settings = NegFullSettings
    off = MCQ.off

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = NegFullLoss(settings.alpha, rank, world_size)

    def fields(self, task):
        return _question_weight_fields(self.settings, task)

    def forward(self, step):
        return self.loss(step.scale, contrastive=step.features["contrastive"], mcq=step.features["mcq"])


@dataclass
class RelCompCfg:
    """``loss.relcomp``: the settings of RelComp, the relcomp objective's one term."""
    margin: float = bounded(0.2, lo=0.0, fix="must be >= 0", doc="m, the triplet loss's margin")
    w_itm: float = bounded(1.0, lo=0.0, fix="must be >= 0", doc="the weight of the ITM triplet loss")
    w_clip: float = bounded(1.0, lo=0.0, fix="must be >= 0", doc="the weight of the contrastive loss")


class RelComp(Term):
    """``relcomp``: w_itm·L_itm(itm stream) + w_clip·L_clip(every true pair of the step), L_itm a triplet loss of
    margin m."""
    name = "relcomp"
    reads = ("itm", "contrastive")
    needs = ("itm",)
    Settings = RelCompCfg

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = RelCompLoss(settings.margin, settings.w_itm, settings.w_clip, rank, world_size)

    def forward(self, step):
        return self.loss(step.scale, itm=step.features["itm"], contrastive=step.features.get("contrastive"))


class WeightedTerm(Term):
    """A term that is one weight times a loss of one batch field of one stream task's batches: its Settings hold
    that weight alone, under the term's ``name`` (0, the default, is off); it asks for ``batch_field`` (made by
    ``make_field``) on the ``task`` streams, adds nothing to a step whose batch lacks it, and logs its unweighted
    value under its name. Subclasses say what they score (``score``)."""
    task: ClassVar[str] = ""                    # the stream task whose batches carry its field
    batch_field: ClassVar[str] = ""             # that field, indexed by the batch's images (``by_image``)
    make_field: ClassVar[Callable]              # fn(samples' json, tokenizer) -> the field (a staticmethod)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.by_image = (cls.batch_field,)
        cls.off = {cls.name: 0.0}

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.weight = getattr(settings, self.name)

    def on(self):
        return self.weight > 0

    def fields(self, task):
        return {self.batch_field: self.make_field} if task == self.task else {}

    def score(self, step: Step, value: torch.Tensor, host: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """(its unweighted value, more logs) given the step, its batch field and the host's copy of it (or None)."""
        raise NotImplementedError

    def forward(self, step):
        batch = step.batch.get(self.task, {})
        if self.batch_field not in batch:
            return None, {}
        host = step.host[self.task][self.batch_field] if step.host else None
        term, logs = self.score(step, batch[self.batch_field], host)
        return self.weight * term, {self.name: term.detach(), **logs}


@dataclass
class TextToImageSettings:
    t2i: float = weight("negft's text→image MCQ term (TextToImageMCQLoss), added with this weight: each MCQ's right "
                        "answer picks, among the step's MCQ images, one it is true of (the samples' object labels "
                        "say which); 0 = off")


class TextToImage(WeightedTerm):
    """``t2i``: each right answer picks, among the step's MCQ images, one it is true of (``answer_truth``)."""
    name = "t2i"
    Settings = TextToImageSettings
    task, batch_field, make_field = "mcq", "answer_truth", staticmethod(answer_truth)

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = TextToImageMCQLoss()

    def pickers(self, options: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        """The text features that pick images: each question's right answer."""
        return options[torch.arange(len(answers), device=options.device), answers]

    def score(self, step, truth, host):
        img, options, answers, _ = step.features["mcq"]
        return self.loss(img, self.pickers(options, answers), truth, step.scale,
                         some=None if host is None else host.any(-1)), {}


@dataclass
class TextToImageOptionsSettings:
    t2i_options: float = weight("the same term over every option, the wrong ones too (\"a cat but no dog\" picks an "
                                "image with a cat and without a dog): needs each option's [affirmed, negated] "
                                "objects (``mcq.option_objects``, which ``negft data negate`` and the world write; "
                                "NegBench's CSVs do not have them, and such rows add 0); 0 = off")


class TextToImageOptions(TextToImage):
    """``t2i_options``: every option picks, among the step's MCQ images, one it is true of (``option_truth``)."""
    name = "t2i_options"
    Settings = TextToImageOptionsSettings
    task, batch_field, make_field = "mcq", "option_truth", staticmethod(option_truth)

    def pickers(self, options, answers):
        return options.flatten(0, 1)


@dataclass
class HardNegativesSettings:
    hard_negatives: float = weight("negft's NegCap hard-negative term (HardNegativeLoss), added with this weight: "
                                   "each NegCap caption against its own image and the step's images that hold an "
                                   "object it negates (the samples' object labels say which; unlabelled data has "
                                   "none); 0 = off")


class NegCapHardNegatives(WeightedTerm):
    """``hard_negatives``: each NegCap caption picks its own image over the step's images that hold an object it
    negates (``negcap_hard_negatives``); also logs the share of the step's captions that had one."""
    name = "hard_negatives"
    Settings = HardNegativesSettings
    task, batch_field, make_field = "contrastive", "negcap_hard_negatives", staticmethod(negcap_hard_negatives)

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = HardNegativeLoss()

    def score(self, step, hard, host):
        term = self.loss(*step.features["contrastive"], hard, step.scale, some=None if host is None else host.any(-1))
        return term, {"hard_negative_share": hard.any(-1).float().mean()}


class HardNegativeTerm(Term):
    """A baseline method's loss (NegCLIP, CoN-CLIP, TripletCLIP, FSC-CLIP, CE-CLIP) over a RelComp-format stream
    (task ``itm``, field ``relcomp``): each image with its caption, its typed hard captions (``negatives``, a mask
    for fewer than K), and, where it has one, a hard-negative image with that image's own caption and a hard caption
    of it (``text_fields``: tokens the pipeline adds to the batch, encoded in the step's one text pass). The
    world's relcomp split carries all of it; a converted dataset carries what its release has."""
    reads = needs = ("itm",)
    text_fields: ClassVar[tuple[str, ...]] = ()      # of TEXT_FIELDS

    def fields(self, task):
        if task != "itm" or not self.text_fields:
            return {}
        return {**{f: TEXT_FIELDS[f] for f in self.text_fields}, self._captioned().__name__: self._captioned()}

    def _captioned(self):
        """The mask of the samples whose negative image has what the term reads of it."""
        return negative_image_hard_captioned if "negative_image_hard_caption" in self.text_fields \
            else negative_image_captioned

    def texts(self, batch):
        return [batch["itm"][f] for f in self.text_fields]

    def hard_texts(self, step: Step) -> dict[str, torch.Tensor]:
        """The normalised features of ``text_fields``, (B, D) each."""
        if not self.text_fields:
            return {}
        feats = F.normalize(step.extra[self.name], dim=-1)
        return dict(zip(self.text_fields, feats.chunk(len(self.text_fields))))

    def has_negative_image(self, step: Step) -> torch.Tensor:
        """(B,) bool: the sample has a negative image with what the term reads of it (its caption, and for NegCLIP a
        hard caption of it)."""
        itm = step.batch["itm"]
        return itm["has_negative_image"] & itm[self._captioned().__name__]


TEXT_FIELDS = {f.__name__: f for f in (hard_caption, negative_image_caption, negative_image_hard_caption)}


class CoNCLIP(HardNegativeTerm):
    """``conclip``: CoN-CLIP's three cross-entropies (CoNCLIPLoss). Its negated caption is the negative image's own
    caption (false of the image) and its distractor the negative image: on the world, a RelComp swap and the image
    drawn from it rather than CC-Neg's negation and its retrieved COCO image (a converted CC-Neg carries those)."""
    name = "conclip"
    text_fields = ("negative_image_caption",)

    def __init__(self, settings=None, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = CoNCLIPLoss(rank, world_size)

    def forward(self, step):
        itm, has = step.features["itm"], self.has_negative_image(step)
        negated = self.hard_texts(step)["negative_image_caption"]
        loss = self.loss(itm["image"], itm["positive"], negated, itm["negative_image"], step.scale,
                         has_negated=has, has_distractor=has)
        return loss, {"conclip": loss.detach()}


class NegCLIP(HardNegativeTerm):
    """``negclip``: NegCLIP's loss (NegCLIPLoss) over the images and their hard images (2B) against their captions,
    the hard images' captions and a hard caption of each (4B): the stream's negative image stands for the nearest
    neighbour NegCLIP draws, its caption and a drawn hard caption of it come with it."""
    name = "negclip"
    text_fields = ("hard_caption", "negative_image_caption", "negative_image_hard_caption")

    def __init__(self, settings=None, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = NegCLIPLoss(rank, world_size)

    def forward(self, step):
        itm, texts, has = step.features["itm"], self.hard_texts(step), self.has_negative_image(step)
        every = torch.ones_like(has)
        loss = self.loss(torch.cat([itm["image"], itm["negative_image"]]),
                         torch.cat([itm["positive"], texts["negative_image_caption"]]),
                         torch.cat([texts["hard_caption"], texts["negative_image_hard_caption"]])[:, None],
                         step.scale, valid=torch.cat([every, has]), negative_mask=torch.cat([every, has])[:, None])
        return loss, {"negclip": loss.detach()}


@dataclass
class TripletCLIPCfg:
    """``loss.tripletclip``: how its two NegCLIP terms are combined."""
    reference_sum: bool = _flag("the reference's sum of its two terms (false: their mean, the paper's; the sum "
                                "doubles the loss and its gradients)")


class TripletCLIP(HardNegativeTerm):
    """``tripletclip``: TripletCLIP's NegCLIP(I, T, T⁻) and NegCLIP(I⁻, T⁻, T) (TripletCLIPLoss), I⁻ the image of
    the hard caption T⁻ (the world renders it: the negative image and its own caption)."""
    name = block = "tripletclip"
    Settings = TripletCLIPCfg
    text_fields = ("negative_image_caption",)

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = TripletCLIPLoss(rank, world_size, reference_sum=settings.reference_sum)

    def forward(self, step):
        itm = step.features["itm"]
        loss = self.loss(itm["image"], itm["positive"], itm["negative_image"],
                         self.hard_texts(step)["negative_image_caption"], step.scale,
                         has_negative=self.has_negative_image(step))
        return loss, {"tripletclip": loss.detach()}


@dataclass
class CECLIPCfg:
    """``loss.ceclip``: CE-CLIP's weights and threshold bound, its recipe by default."""
    cmr_weight: float = bounded(0.2, lo=0.0, fix="must be >= 0", doc="the weight of the cross-modal rank hinge")
    imc_weight: float = bounded(0.3, lo=0.0, fix="must be >= 0", doc="the weight of the intra-modal contrast")
    upper_bound: float = bounded(10.0, lo=0.0, fix="must be >= 0", doc="the adaptive thresholds' upper bound")
    reference_bugs: bool = _flag("the reference's behaviour (Clip_DALoss): the intra-modal target at the first sample's "
                                 "negative, a NaN threshold after a batch without a negative of its type, missing "
                                 "negatives as candidates")


# a relcomp kind -> its CE-CLIP type (schema.CECLIP_TYPES): the converted ceclip-coco data's kinds are the types;
# the world's three each take a type of their own, so each keeps its own threshold as CE-CLIP's types do: subject
# and object exchanged is CE-CLIP's relation swap (which exchanges the caption's first two nouns), a colour
# replaced its adjective swap, the opposite predicate its verb swap (the word relating the two objects replaced)
CECLIP_TYPE_OF = {**{t: t for t in schema.CECLIP_TYPES}, "exchange": "relation", "attribute": "adjective",
                  "predicate": "verb"}


def ceclip_slots(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(B, T) long, T = len(schema.CECLIP_TYPES) = schema.MAX_NEGATIVES: for each CE-CLIP type, the position in
    the batch's ``negatives`` of the sample's negative of that type, so that the term puts each negative in its
    type's slot with a gather on the device (positions no longer mean types where a release's missing negatives are
    left out). A negative whose kind has no type (another dataset's: NegCLIP's ``swap``) or repeats one takes the
    first free type, in order; the types left free get the padding positions, which the mask leaves out."""
    rows = []
    for meta in metas:
        kinds = [n.get("kind") for n in meta[schema.RELCOMP]["negatives"]]
        slots: list[int | None] = [None] * len(schema.CECLIP_TYPES)
        others = []
        for k, kind in enumerate(kinds):
            t = CECLIP_TYPE_OF.get(kind)
            t = None if t is None else schema.CECLIP_TYPES.index(t)
            if t is not None and slots[t] is None:
                slots[t] = k
            else:
                others.append(k)
        free = iter([*others, *range(len(kinds), schema.MAX_NEGATIVES)])
        rows.append([next(free) if k is None else k for k in slots])
    return torch.tensor(rows, dtype=torch.long)


class CECLIP(HardNegativeTerm):
    """``ceclip``: CE-CLIP's hard-negative CLIP loss + the rank hinge with per-type adaptive thresholds + the
    intra-modal contrast (CECLIPLoss) over each image's caption and its typed hard captions (the stream's
    ``negatives``, each placed in its type's slot by the batch field ``ceclip_slots``, a missing type masked). The
    thresholds live in the loss object: they start at 0 with the run (the reference also resets them at each epoch)
    and are kept in checkpoints, so a resumed run goes on with them as the uninterrupted one does."""
    name = block = "ceclip"
    Settings = CECLIPCfg

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        c = settings
        self.loss = CECLIPLoss(c.cmr_weight, c.imc_weight, c.upper_bound, len(schema.CECLIP_TYPES),
                               c.reference_bugs, rank, world_size)

    def fields(self, task):
        return {ceclip_slots.__name__: ceclip_slots} if task == "itm" else {}

    def state(self):
        return {"thresholds": self.loss.thresholds}

    def load_state(self, state):
        self.loss.thresholds.copy_(state["thresholds"])

    def forward(self, step):
        itm, slots = step.features["itm"], step.batch["itm"][ceclip_slots.__name__]
        negatives = itm["negatives"].gather(1, slots[..., None].expand(-1, -1, itm["negatives"].shape[-1]))
        return self.loss(itm["image"], itm["positive"], negatives, itm["negative_mask"].gather(1, slots), step.scale)


@dataclass
class FSCCLIPCfg:
    """``loss.fscclip``: FSC-CLIP's weights and calibrations, the paper's COCO ViT-B/32 recipe by default."""
    w_global: float = bounded(0.5, lo=0.0, fix="must be >= 0 (its CC3M recipe: 1.0)",
                              doc="the weight of the global focal hard-negative loss")
    w_local: float = bounded(0.2, lo=0.0, fix="must be >= 0 (0: off; its ViT-B/16 and L/14 recipes: 0.5)",
                             doc="the weight of the local token-patch hard-negative loss (needs a ViT image tower)")
    gamma: float = bounded(2.0, lo=0.0, fix="must be >= 0 (0: cross-entropy)", doc="the focal loss's γ")
    smoothing: float = bounded(0.02, lo=0.0, hi=1.0, fix="must lie in [0, 1)", doc="label smoothing ε")
    zero_fill_missing: bool = _flag("the reference's handling of a missing negative: a zero feature whose logit 0 "
                                    "stays in the softmax (false: left out, the paper's intent)")


class FSCCLIP(HardNegativeTerm):
    """``fscclip``: FSC-CLIP's L_clip + w_global·L_global_hn + w_local·L_local_hn (FSCCLIPLoss) over each image's
    caption and its typed hard captions (the stream's ``negatives``)."""
    name = block = "fscclip"
    Settings = FSCCLIPCfg

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        c = settings
        self.loss = FSCCLIPLoss(c.w_global, c.w_local, c.gamma, c.smoothing, c.zero_fill_missing, rank, world_size)
        self.tokens = c.w_local > 0

    def attach(self, clip, tower):
        from open_clip.transformer import VisionTransformer
        if self.tokens and not isinstance(getattr(clip, "visual", None), VisionTransformer):
            raise ValueError(f"loss.fscclip.w_local = {self.loss.w_local} scores token-patch pairs, and this model's "
                             f"image tower ({type(clip.visual).__name__}) has no patch tokens: choose a ViT model or "
                             "set loss.fscclip.w_local=0")

    def forward(self, step):
        itm = step.features["itm"]
        tokens = step.tokens["itm"] if self.tokens else None
        return self.loss(step.scale, itm["image"], itm["positive"], itm["negatives"], itm["negative_mask"],
                         tokens=tokens, rows=itm["anchors"])


@dataclass
class GuardCfg:
    """negft's drift guard (DriftGuard), a term the clip, mcq and negfull objectives add to their loss when any
    weight is > 0; every weight 0 = off (NegBench's recipes, bit-identical training)."""
    caption: float = weight("w · mean(1 − cos(f_θ, f_base)) on the affirmative captions of the step's images")
    options: float = weight("the same on the step's affirmative MCQ options")
    kl: float = weight("KL(p_base ‖ p_θ) of each image's softmax over the step's affirmative captions")
    l2sp: float = weight("w · Σ ‖θ − θ_base‖² over the trained weights")


CAPTIONED_TASKS = ("contrastive", "mcq")      # the stream tasks whose images' captions the guard reads


def _captioned(batch: dict) -> list[str]:
    """The step's stream tasks whose batches carry their images' captions, in the order the guard encodes them."""
    return [k for k in CAPTIONED_TASKS if k in batch and "captions" in batch[k]]


def frozen_reference(clip: nn.Module, tower: str) -> nn.Module:
    """A frozen copy of the base model for the drift guard: eval mode, no gradients, and without the image tower
    when only the text tower trains (the model's own image features are the base's then)."""
    visual = clip.visual
    if "v" not in tower:
        clip.visual = None          # not copied
    try:
        ref = copy.deepcopy(clip)
    finally:
        clip.visual = visual
    ref.requires_grad_(False)
    return ref.eval()


class Guard(Term):
    """``loss.guard``: the drift guard (DriftGuard) against a frozen copy of the base's trained tower(s) and, for
    l2sp, of the trained weights. The term is a plain object, not a module: neither copy is in the task's
    state_dict() or parameters(), so neither is saved in checkpoints or seen by the optimizer or DeepSpeed. The
    model's features carry the gradient; the reference's are computed under no_grad (only they: features taken
    under no_grad would carry none, and the term would not act). Its batches' rows among the step's images and
    texts are the step's (``Step.image_rows`` / ``text_rows``)."""
    name = block = "guard"
    Settings = GuardCfg
    off = {f.name: 0.0 for f in dataclasses.fields(GuardCfg)}

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = DriftGuard(settings.caption, settings.options, settings.kl, settings.l2sp)
        self.reference = self.anchors = None
        self.tower = "vt"

    def on(self):
        return self.loss.active

    def fields(self, task):
        if task not in CAPTIONED_TASKS:
            return {}
        out = {"captions": caption_tokens, "has_caption": has_caption}
        if task == "mcq":
            out["option_affirmative"] = option_affirmative
        return out

    def attach(self, clip, tower):
        """Freeze a copy of the model as it is now (the base)."""
        self.tower = tower
        self.reference = frozen_reference(clip, tower)
        if self.loss.w["l2sp"] > 0:
            self.anchors = [(p, p.detach().clone()) for p in clip.parameters() if p.requires_grad]

    def texts(self, batch):
        """The affirmative captions, in the step's text pass (for the caption and kl terms)."""
        return [batch[k]["captions"] for k in _captioned(batch)] if self.loss.needs_captions else []

    def forward(self, step):
        ref, img, batch = self.reference, step.images, step.batch
        host = step.host or batch       # the masks' host copies where the step has them
        if next(ref.parameters()).device != img.device:
            ref.to(img.device)
        caption = options = kl = None
        cap = step.extra.get(self.name)
        if cap is not None:
            captioned = _captioned(batch)
            tokens = torch.cat([batch[k]["captions"] for k in captioned])
            has_host = torch.cat([host[k]["has_caption"] for k in captioned]).bool()
            has = rows_of(has_host, img.device)
            tokens_host = torch.cat([host[k]["captions"] for k in captioned])[has_host] if step.host else None
            own = torch.cat([img[step.image_rows[k]] for k in captioned])[has]
            with torch.no_grad():
                cap_base = step.encode_text(ref, tokens[has], tokens_host).float()
                if "v" in self.tower:
                    img_base = ref.encode_image(torch.cat([batch[k]["images"] for k in captioned])[has]).float()
                else:
                    img_base = own.detach()
                scale_base = ref.logit_scale.float().clamp(0, MAX_LOGIT_SCALE).exp()
            caption = (cap[has], cap_base)
            kl = (own, cap[has], step.scale, img_base, cap_base, scale_base)
        mcq = batch.get("mcq")
        if mcq is not None and "option_affirmative" in mcq and self.loss.w["options"] > 0:
            keep_host = host["mcq"]["option_affirmative"].flatten().bool()
            if keep_host.any():
                keep = rows_of(keep_host, img.device)
                opt = step.texts[step.text_rows["mcq"]][keep]
                options_host = host["mcq"]["options"].flatten(0, 1)[keep_host] if step.host else None
                with torch.no_grad():
                    opt_base = step.encode_text(ref, mcq["options"].flatten(0, 1)[keep], options_host).float()
                options = (opt, opt_base)
        return self.loss(caption=caption, options=options, kl=kl, l2sp=self.anchors)


# ----------------------------------------------------------------------------- the registry
@dataclass(frozen=True)
class Objective:
    """A ``loss.name``: its terms, summed in order; the first is its own loss (its ``reads`` and ``needs`` are the
    objective's: the stream tasks a recipe may have and must have), the others add to it."""
    name: str
    terms: tuple[type[Term], ...]

    @property
    def reads(self) -> tuple[str, ...]:
        return self.terms[0].reads

    @property
    def needs(self) -> tuple[str, ...]:
        return self.terms[0].needs

    def blocks(self) -> tuple[str, ...]:
        """Every block of ``loss`` it reads: its own (``loss.<name>``, where its terms' settings sit) and its
        terms' own blocks."""
        own = (self.name,) if any(t.Settings and not t.block for t in self.terms) else ()
        return own + tuple(t.block for t in self.terms if t.block)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("clip", (Contrastive, Guard)),
    Objective("mcq", (MCQ, TextToImage, TextToImageOptions, Guard)),
    Objective("negfull", (NegFull, TextToImage, TextToImageOptions, NegCapHardNegatives, Guard)),
    Objective("relcomp", (RelComp,)),
    Objective("negclip", (NegCLIP,)),
    Objective("conclip", (CoNCLIP,)),
    Objective("tripletclip", (TripletCLIP,)),
    Objective("fscclip", (FSCCLIP,)),
    Objective("ceclip", (CECLIP,)),
)}


# The settings of an objective's block are those of its terms that have no block of their own, one dataclass that
# is each of theirs (a dataclass lists its bases' fields from the last base to the first: the terms' order reversed).
@dataclass
class MCQCfg(TextToImageOptionsSettings, TextToImageSettings, MCQSettings):
    """``loss.mcq``: the settings of MCQ, TextToImage and TextToImageOptions."""


@dataclass
class NegFullCfg(HardNegativesSettings, TextToImageOptionsSettings, TextToImageSettings, NegFullSettings):
    """``loss.negfull``: the settings of NegFull, TextToImage, TextToImageOptions and NegCapHardNegatives."""


@dataclass
class LossCfg:
    """``loss``: the objective (``name``, a key of OBJECTIVES; default clip: plain contrastive fine-tuning, what a
    recipe of caption streams alone means) and one block per objective or term that has settings; a block the
    chosen objective does not read may not be set."""
    name: str = "clip"
    mcq: MCQCfg = field(default_factory=MCQCfg)
    negfull: NegFullCfg = field(default_factory=NegFullCfg)
    relcomp: RelCompCfg = field(default_factory=RelCompCfg)
    tripletclip: TripletCLIPCfg = field(default_factory=TripletCLIPCfg)
    fscclip: FSCCLIPCfg = field(default_factory=FSCCLIPCfg)
    ceclip: CECLIPCfg = field(default_factory=CECLIPCfg)
    guard: GuardCfg = field(default_factory=GuardCfg)


def _block_terms() -> dict[str, tuple[type[Term], ...]]:
    """block -> the terms whose settings it holds: the objectives' blocks, then the terms' own."""
    blocks: dict[str, tuple] = {o.name: tuple(t for t in o.terms if t.Settings and not t.block)
                                for o in OBJECTIVES.values() if o.name in o.blocks()}
    for o in OBJECTIVES.values():
        blocks.update({t.block: (t,) for t in o.terms if t.block})
    return blocks


BLOCKS = _block_terms()
BLOCK_CFGS = {f.name: f.default_factory for f in dataclasses.fields(LossCfg) if f.name != "name"}


def _check_blocks() -> None:
    """Each block of LossCfg holds exactly its terms' settings, in their order (a term added to an objective
    without its Settings among the block's bases fails here, at import)."""
    assert list(BLOCK_CFGS) == list(BLOCKS), f"LossCfg's blocks {list(BLOCK_CFGS)} are not {list(BLOCKS)}"
    for block, terms in BLOCKS.items():
        want = [f.name for t in terms for f in dataclasses.fields(t.Settings)]
        have = [f.name for f in dataclasses.fields(BLOCK_CFGS[block])]
        assert have == want, f"loss.{block}: {BLOCK_CFGS[block].__name__} has {have}, its terms declare {want}"


_check_blocks()


def off_values(block: str) -> dict:
    """key -> the value at which it turns its term off (or leaves NegBench's loss as it is), for ``loss.<block>``'s
    keys that have one (the terms' ``off``)."""
    return {k: v for t in BLOCKS.get(block, ()) for k, v in t.off.items()}


def setting_errors(loss_cfg) -> list[str]:
    """Each ``loss`` value outside its range (the fields' ``negft.fields.bounded``), named with the key and a value
    that would do."""
    return field_errors(loss_cfg, "loss.")


def build_terms(loss_cfg, rank: int = 0, world_size: int = 1) -> list[Term]:
    """The ``loss.name`` objective's terms that are on, in summing order, given their settings."""
    objective = OBJECTIVES[loss_cfg.name]
    terms = []
    for t in objective.terms:
        settings = getattr(loss_cfg, t.block or objective.name) if t.Settings else None
        terms.append(t(settings, rank, world_size))
    return [t for t in terms if t.on()]


BY_IMAGE = {f for o in OBJECTIVES.values() for t in o.terms for f in t.by_image}


def join_field(key: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """One field of several streams' batches that share a task: stacked, but block-diagonal for a field indexed
    by the batch's images (``Term.by_image``: ``answer_truth`` (M, M), ``option_truth`` (M·C, M),
    ``negcap_hard_negatives`` (M, M)), false off the diagonal blocks: a question is true of no image of another
    stream's batch, and no such image is a caption's hard negative."""
    if isinstance(parts[0], dict):      # the batches' host copies (HOST), joined alike
        return {k: join_field(k, [p[k] for p in parts]) for k in parts[0]}
    return torch.block_diag(*parts) if key in BY_IMAGE else torch.cat(parts)


def batch_fields(loss_cfg, task: str) -> dict[str, Callable]:
    """The batch fields a stream of ``task`` carries for the objective's terms (name -> its function)."""
    out = {}
    for term in build_terms(loss_cfg):
        out.update(term.fields(task))
    return out
