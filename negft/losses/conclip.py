"""CoN-CLIP (``conclip``; Singh et al., "Learn 'No' to Say 'Yes' Better"): three cross-entropies over the
captions, their negated captions, the images and their distractor images."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .core import HardNegativeTerm


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


class CoNCLIP(HardNegativeTerm):
    """``conclip``: CoN-CLIP's three cross-entropies (CoNCLIPLoss). Its negated caption is the negative image's own
    caption (false of the image) and its distractor the negative image: on the world's ``ccneg`` split, CC-Neg's
    form (a caption denying an object the image shows, and the scene rendered without it); a converted CC-Neg
    carries the released captions and retrieved COCO images."""
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
