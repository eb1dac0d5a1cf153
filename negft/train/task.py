"""The module DeepSpeed trains: an open_clip model plus the recipe's loss, one forward per step."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from negft.losses import NegFullLoss

MAX_LOGIT_SCALE = math.log(100.0)


class DualEncoderTask(nn.Module):
    """Encodes every image and text of a step in one pass per tower, then applies the loss.

    ``logit_scale`` is clamped here, in forward: under ZeRO an in-place clamp of the parameter
    would be overwritten from the fp32 master copy.
    """

    def __init__(self, clip: nn.Module, alpha: float, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.clip = clip
        self.loss = NegFullLoss(alpha, rank, world_size)

    def forward(self, contrastive: dict | None = None, mcq: dict | None = None):
        scale = self.clip.logit_scale.clamp(0, MAX_LOGIT_SCALE).exp()
        images, texts = [], []
        if contrastive is not None:
            images.append(contrastive["images"])
            texts.append(contrastive["texts"])
        if mcq is not None:
            images.append(mcq["images"])
            texts.append(mcq["options"].flatten(0, 1))
        img = F.normalize(self.clip.encode_image(torch.cat(images)), dim=-1)
        txt = F.normalize(self.clip.encode_text(torch.cat(texts)), dim=-1)
        parts = {}
        if contrastive is not None:
            b = contrastive["images"].shape[0]
            parts["contrastive"] = (img[:b], txt[:b])
            img, txt = img[b:], txt[b:]
        if mcq is not None:
            m, c = mcq["options"].shape[:2]
            parts["mcq"] = (img, txt.view(m, c, -1), mcq["answers"])
        total, logs = self.loss(scale, **parts)
        logs["logit_scale"] = scale.detach()
        return total, logs
