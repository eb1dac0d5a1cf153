"""FSC-CLIP (``fscclip``; Oh et al., EMNLP 2024; ytaek-oh/fsc-clip): the contrastive loss plus a global and a
local (token-patch) hard-negative loss, each focal and label-smoothed."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from negft.fields import bounded

from .core import ContrastiveLoss, HardNegativeTerm, _flag, rows_of


class FocalHardNegativeLoss(nn.Module):
    """FSC-CLIP's global hard-negative loss (Oh et al., EMNLP 2024; ytaek-oh/fsc-clip ``Global_HNLoss``): each image
    picks its caption among [caption, its K hard negative captions] at ``s · v · t``, a (1+K)-way loss of column 0
    with the paper's two calibrations — a focal weight ``(1 − p)^γ`` on every column's ``−log p`` and label
    smoothing ε spread uniformly over the row's real candidates — averaged over the rows that have a negative.

    Defaults are the paper's recipe (γ 2, ε 0.02); the reference's argparse defaults are plain cross-entropy
    without smoothing (γ 0, ε 0 here; its focal loss defaults to γ 1). A missing negative (``negative_mask``
    false) is left out of the softmax: the reference zero-fills its feature, so its logit 0 stays in the softmax
    with target 0 (``zero_fill_missing`` reproduces that). Alone it is each rank's mean over its own rows, as the
    reference's; ``FSCCLIPLoss`` hands it the global count (``per_rank``), so that the ranks average to one
    process's mean."""

    def __init__(self, gamma: float = 2.0, smoothing: float = 0.02, zero_fill_missing: bool = False):
        super().__init__()
        self.gamma, self.smoothing, self.zero_fill_missing = gamma, smoothing, zero_fill_missing

    def classify(self, logits, negative_mask, rows=None, per_rank=None):
        """The loss of column 0 of ``logits`` (B, 1+K) over the real columns (``negative_mask`` (B, K)), averaged
        over ``rows`` (rows_of the host's ``negative_mask.any(-1)``; else read here): summed over them and divided
        by ``per_rank`` where given (the global batch's number of such rows over the world size), else by their
        number; 0, keeping the graph, when no row has a negative."""
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
        per_row = (target * focal).sum(-1)
        return per_row.mean() if per_rank is None else per_row.sum() / per_rank

    def forward(self, image, positive, negatives, negative_mask, logit_scale, rows=None, per_rank=None):
        # image, positive (B, D); negatives (B, K, D); negative_mask (B, K) bool; rows, per_rank: as classify's
        candidates = torch.cat([positive[:, None], negatives], 1)
        return self.classify(logit_scale * torch.einsum("bd,bkd->bk", image, candidates), negative_mask, rows,
                             per_rank)


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
                logit_scale, rows=None, per_rank=None):
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
        return self.focal.classify(torch.cat([positive[:, None], negative], 1), negative_mask, rows, per_rank)


class FSCCLIPLoss(nn.Module):
    """FSC-CLIP fine-tuning: L_clip + w_global·L_global_hn + w_local·L_local_hn (the reference's ``Local_HNLoss``
    with ``--apply-global-neg-loss --apply-local-neg-loss``).

    L_clip is the B×B contrastive loss of the images and their captions (the hard negatives enter only the
    HN terms). Defaults are the paper's COCO ViT-B/32 recipe (w 0.5, 0.2; its CC3M recipe has w_global 1.0, its
    ViT-B/16 and L/14 ones w_local 0.5). The reference gathers L_clip's features without a gradient (a rank's
    own rows carry it), so its averaged gradient is 1/world_size of one process's; here the gather carries it
    (``ContrastiveLoss``), so it equals one process's. The reference's HN terms are each rank's mean over its own
    rows that have a negative, so ranks holding unequal numbers of them weigh a row by its rank's count; here each
    rank divides its rows' sum by the global count over the world size (``_per_rank``, all-reduced), so the ranks
    average to one process's mean (on one process: the reference's mean). A batch with no negative (the reference
    crashes) gives L_clip alone. ``w_local`` 0 skips the token inputs."""

    def __init__(self, w_global: float = 0.5, w_local: float = 0.2, gamma: float = 2.0, smoothing: float = 0.02,
                 zero_fill_missing: bool = False, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.w_global, self.w_local = w_global, w_local
        self.world_size = world_size
        self.contrastive = ContrastiveLoss(rank, world_size)
        self.global_hn = FocalHardNegativeLoss(gamma, smoothing, zero_fill_missing)
        self.local_hn = TokenPatchHardNegativeLoss(gamma, smoothing, zero_fill_missing)

    def forward(self, logit_scale, image, text, negatives, negative_mask, tokens=None, rows=None):
        """``tokens`` = dict(image_tokens, text_tokens, token_mask, negative_tokens, negative_token_mask) when
        ``w_local`` > 0; ``rows``: rows_of the host's ``negative_mask.any(-1)`` (else read here)."""
        if rows is None:
            rows = rows_of(negative_mask.any(-1), negative_mask.device)
        per_rank = self._per_rank(negative_mask, image)
        parts = {"clip": self.contrastive(image, text, logit_scale),
                 "global_hn": self.global_hn(image, text, negatives, negative_mask, logit_scale, rows, per_rank)}
        total = parts["clip"] + self.w_global * parts["global_hn"]
        if self.w_local:
            parts["local_hn"] = self.local_hn(**tokens, negative_mask=negative_mask, logit_scale=logit_scale,
                                              rows=rows, per_rank=per_rank)
            total = total + self.w_local * parts["local_hn"]
        return total, {k: v.detach() for k, v in parts.items()}

    def _per_rank(self, negative_mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor | None:
        """The global batch's number of rows with a negative over the world size (every rank all-reduces its
        count, on the device: nothing waits for it, with or without rows of its own), None on one process."""
        if self.world_size == 1:
            return None
        count = negative_mask.any(-1).sum().to(like.dtype)
        torch.distributed.all_reduce(count)
        return count / self.world_size


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
