"""The RelComp fine-tuning objective (``relcomp``; the Probe-R/C/B paper, section 5): an image-text matching
triplet loss on an ``itm`` stream plus the contrastive loss over the step's true pairs."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from negft.fields import bounded

from .core import ContrastiveLoss, Term, rows_of


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
