"""NegCLIP (``negclip``; Yuksekgonul et al., ICLR 2023): CLIP's loss with hard captions as extra columns of the
image side. TripletCLIP's loss is two of it (``negft.losses.tripletclip``)."""
from __future__ import annotations

import torch
from torch import nn

from .core import HardNegativeTerm, gather_rows


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
