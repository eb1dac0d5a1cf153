"""Training losses, one class each. Features come in L2-normalised; ``logit_scale`` is exp'ed."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss
from torch import nn


class ContrastiveLoss(nn.Module):
    """Symmetric InfoNCE over the global batch (open_clip's ``ClipLoss``).

    ``local_loss`` + ``gather_with_grad`` is the variant that scales: each rank scores its own rows
    against every rank's features, and gradients flow back through the gather, so the averaged
    gradient equals the one-process gradient on the same global batch.
    """

    def __init__(self, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.clip = ClipLoss(local_loss=True, gather_with_grad=True, cache_labels=True,
                             rank=rank, world_size=world_size)

    def forward(self, image_features, text_features, logit_scale):
        return self.clip(image_features, text_features, logit_scale)


class MCQLoss(nn.Module):
    """NegBench eq. 1: cross-entropy over C caption options scored by scaled *cosine* similarity.

    The NegBench release scores un-normalised features; the paper (and this class) uses cosine
    similarity, so the loss does not depend on feature norms.
    """

    def forward(self, image_features, option_features, answers, logit_scale):
        # image_features (M, D), option_features (M, C, D), both normalised; answers (M,)
        logits = logit_scale * torch.einsum("md,mcd->mc", image_features, option_features)
        return F.cross_entropy(logits, answers)


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

    def forward(self, image, positive, negatives, negative_image=None, has_negative_image=None):
        # image, positive (B, D); negatives (B, K, D); negative_image (B, D); has_negative_image (B,) bool
        pos = (image * positive).sum(-1)                                  # s(I, T⁺)
        neg = torch.einsum("bd,bkd->bk", image, negatives)                # s(I, T⁻)
        loss = F.relu(self.margin - pos.unsqueeze(1) + neg).mean()
        if negative_image is not None and has_negative_image is not None and has_negative_image.any():
            hard = (negative_image * positive).sum(-1)                    # s(I⁻, T⁺)
            loss = loss + F.relu(self.margin - pos + hard)[has_negative_image].mean()
        return loss


class NegFullLoss(nn.Module):
    """NegBench eq. 2: α·L_clip(NegCap batch) + (1−α)·L_mcq(NegMCQ batch)."""

    def __init__(self, alpha: float, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.alpha = alpha
        self.contrastive = ContrastiveLoss(rank, world_size)
        self.mcq = MCQLoss()

    def forward(self, logit_scale, contrastive=None, mcq=None):
        """``contrastive`` = (img, txt) features; ``mcq`` = (img, options, answers). Either may be None."""
        parts = {}
        if contrastive is not None:
            parts["contrastive"] = self.contrastive(*contrastive, logit_scale)
        if mcq is not None:
            parts["mcq"] = self.mcq(*mcq, logit_scale)
        if len(parts) == 2:
            total = self.alpha * parts["contrastive"] + (1 - self.alpha) * parts["mcq"]
        else:
            total = next(iter(parts.values()))
        return total, {k: v.detach() for k, v in parts.items()}
