"""The module DeepSpeed trains: an open_clip model plus the recipe's loss, one forward per step."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from negft.losses import NegFullLoss, RelCompLoss
from negft.models import encode_text_trimmed

MAX_LOGIT_SCALE = math.log(100.0)


def build_loss(loss_cfg, tasks: set[str], rank: int = 0, world_size: int = 1) -> nn.Module:
    """RelComp's loss when the recipe has an ``itm`` stream, NegBench's α-weighted one otherwise."""
    if "itm" in tasks:
        return RelCompLoss(loss_cfg.margin, loss_cfg.w_itm, loss_cfg.w_clip, rank, world_size)
    return NegFullLoss(loss_cfg.alpha, rank, world_size)


class DualEncoderTask(nn.Module):
    """Encodes every image and text of a step in one pass per tower (texts trimmed to the step's longest),
    then applies the loss.

    ``logit_scale`` is clamped here, in forward: under ZeRO an in-place clamp of the parameter
    would be overwritten from the fp32 master copy.

    The loss is computed in fp32 from the towers' features (a no-op for an fp32 model; autocast is off for it
    under ``train.autocast``): bf16 cosine similarities keep about 3 significant digits (MCQ options closer
    than about 0.004 tie at any scale), the loss is rounded to 1/32 near ln 256, and the clamp at ln 100
    rounds to 4.594 (a largest scale of 98.9).
    """

    def __init__(self, clip: nn.Module, loss: nn.Module):
        super().__init__()
        self.clip = clip
        self.loss = loss

    def forward(self, contrastive: dict | None = None, mcq: dict | None = None, itm: dict | None = None):
        scale = self.clip.logit_scale.float().clamp(0, MAX_LOGIT_SCALE).exp()
        images, texts = [], []
        if contrastive is not None:
            images.append(contrastive["images"])
            texts.append(contrastive["texts"])
        if mcq is not None:
            images.append(mcq["images"])
            texts.append(mcq["options"].flatten(0, 1))
        if itm is not None:
            images += [itm["images"], itm["negative_images"][itm["has_negative_image"]]]
            texts += [itm["texts"], itm["negatives"].flatten(0, 1)]
        img = self.clip.encode_image(torch.cat(images)).float()
        txt = encode_text_trimmed(self.clip, torch.cat(texts)).float()
        with torch.autocast(img.device.type, enabled=False):     # the scores in fp32 under train.autocast too
            return self._score(scale, img, txt, contrastive, mcq, itm)

    def _score(self, scale, img, txt, contrastive, mcq, itm):
        img, txt = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
        parts = {}
        if contrastive is not None:
            b = contrastive["images"].shape[0]
            parts["contrastive"] = (img[:b], txt[:b])
            img, txt = img[b:], txt[b:]
        if mcq is not None:
            m, c = mcq["options"].shape[:2]
            parts["mcq"] = (img[:m], txt[:m * c].view(m, c, -1), mcq["answers"])
            img, txt = img[m:], txt[m * c:]
        if itm is not None:
            b, k = itm["negatives"].shape[:2]
            has = itm["has_negative_image"]
            negative_image = torch.zeros_like(img[:b])
            negative_image[has] = img[b:]
            parts["itm"] = {"image": img[:b], "positive": txt[:b], "negatives": txt[b:].view(b, k, -1),
                            "negative_mask": itm["negative_mask"], "negative_image": negative_image,
                            "has_negative_image": has}
        total, logs = self.loss(scale, **parts)
        logs["logit_scale"] = scale.detach()
        return total, logs
