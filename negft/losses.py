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

    def forward(self, image, positive, negatives, negative_image=None, has_negative_image=None,
                negative_mask=None):
        # image, positive (B, D); negatives (B, K, D); negative_image (B, D); has_negative_image (B,) bool;
        # negative_mask (B, K) bool marks real negatives when a caption has fewer than K
        pos = (image * positive).sum(-1)                                  # s(I, T⁺)
        neg = torch.einsum("bd,bkd->bk", image, negatives)                # s(I, T⁻)
        hinge = F.relu(self.margin - pos.unsqueeze(1) + neg)
        if negative_mask is None:
            loss = hinge.mean()
        else:
            mask = negative_mask.to(hinge.dtype)
            count = mask.sum(1)
            per_anchor = (hinge * mask).sum(1) / count.clamp(min=1)
            loss = per_anchor[count > 0].mean() if (count > 0).any() else hinge.sum() * 0
        if negative_image is not None and has_negative_image is not None and has_negative_image.any():
            hard = (negative_image * positive).sum(-1)                    # s(I⁻, T⁺)
            loss = loss + F.relu(self.margin - pos + hard)[has_negative_image].mean()
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
