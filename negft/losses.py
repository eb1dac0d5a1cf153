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
