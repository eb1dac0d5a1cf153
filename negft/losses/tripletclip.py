"""TripletCLIP (``tripletclip``; Patel et al., NeurIPS 2024): NegCLIP's loss on the true pairs and on the hard
pairs, each image of a hard caption rendered from it."""
from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from .core import HardNegativeTerm, _flag
from .negclip import NegCLIPLoss


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
