"""The module DeepSpeed trains: an open_clip model plus one objective, chosen by ``loss.name``.

A step's batch is keyed by stream task (``contrastive``, ``mcq``, ``itm``; streams sharing a task are
concatenated first). ``Task.forward`` encodes every image and text of the step in one pass per tower and
normalises the features in fp32; each subclass scores them with its loss. Adding a loss is one subclass here,
one config block in ``negft.config.LossCfg`` (if it has settings) and one line in ``LOSSES``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from negft.losses import ContrastiveLoss, MCQLoss, NegFullLoss, RelCompLoss
from negft.models import encode_text_trimmed

MAX_LOGIT_SCALE = math.log(100.0)
STREAM_TASKS = ("contrastive", "mcq", "itm")     # the kinds of batch a stream yields, in encoding order


def step_inputs(batch: dict[str, dict]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The images and token rows of a step, in ``STREAM_TASKS`` order (``step_features`` splits them back)."""
    images, texts = [], []
    if "contrastive" in batch:
        images.append(batch["contrastive"]["images"])
        texts.append(batch["contrastive"]["texts"])
    if "mcq" in batch:
        images.append(batch["mcq"]["images"])
        texts.append(batch["mcq"]["options"].flatten(0, 1))
    if "itm" in batch:
        itm = batch["itm"]
        images += [itm["images"], itm["negative_images"][itm["has_negative_image"]]]
        texts += [itm["texts"], itm["negatives"].flatten(0, 1)]
    return images, texts


def step_features(batch: dict[str, dict], img: torch.Tensor, txt: torch.Tensor) -> dict:
    """Normalised features per stream task: ``contrastive`` = (images, texts); ``mcq`` = (images, options
    (M, C, D), answers); ``itm`` = the keyword arguments of ``ITMTripletLoss``."""
    img, txt = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    parts = {}
    if "contrastive" in batch:
        b = batch["contrastive"]["images"].shape[0]
        parts["contrastive"] = (img[:b], txt[:b])
        img, txt = img[b:], txt[b:]
    if "mcq" in batch:
        mcq = batch["mcq"]
        m, c = mcq["options"].shape[:2]
        parts["mcq"] = (img[:m], txt[:m * c].view(m, c, -1), mcq["answers"])
        img, txt = img[m:], txt[m * c:]
    if "itm" in batch:
        itm = batch["itm"]
        b, k = itm["negatives"].shape[:2]
        has = itm["has_negative_image"]
        negative_image = torch.zeros_like(img[:b])
        negative_image[has] = img[b:]
        parts["itm"] = {"image": img[:b], "positive": txt[:b], "negatives": txt[b:].view(b, k, -1),
                        "negative_mask": itm["negative_mask"], "negative_image": negative_image,
                        "has_negative_image": has}
    return parts


class Task(nn.Module):
    """One objective over a dual encoder: ``forward(batch) -> (loss, logs)``.

    The base class encodes the step (every image in one pass of the image tower, every text in one pass of the
    text tower, trimmed to the step's longest) and hands the normalised features to ``score``; a term that
    every objective can add (a regulariser on the features) belongs in ``forward``, after ``score``.

    ``logit_scale`` is clamped here, in forward: under ZeRO an in-place clamp of the parameter would be
    overwritten from the fp32 master copy.

    The loss is computed in fp32 from the towers' features (a no-op for an fp32 model; autocast is off for it
    under ``train.autocast``): bf16 cosine similarities keep about 3 significant digits (MCQ options closer
    than about 0.004 tie at any scale), the loss is rounded to 1/32 near ln 256, and the clamp at ln 100
    rounds to 4.594 (a largest scale of 98.9).
    """

    reads: tuple[str, ...] = ()     # the stream tasks whose batches it scores (config refuses other streams)
    needs: tuple[str, ...] = ()     # the stream tasks it cannot do without
    block: str | None = None        # the block of ``loss`` it reads (``loss.<block>``), None if it has none

    def __init__(self, clip: nn.Module):
        super().__init__()
        self.clip = clip

    def forward(self, batch: dict[str, dict]):
        unread = [k for k in batch if k not in self.reads]
        if unread:
            raise ValueError(f"{type(self).__name__} reads {', '.join(self.reads)} batches, not {', '.join(unread)}")
        scale = self.clip.logit_scale.float().clamp(0, MAX_LOGIT_SCALE).exp()
        images, texts = step_inputs(batch)
        img = self.clip.encode_image(torch.cat(images)).float()
        txt = encode_text_trimmed(self.clip, torch.cat(texts)).float()
        with torch.autocast(img.device.type, enabled=False):     # the scores in fp32 under train.autocast too
            total, logs = self.score(scale, step_features(batch, img, txt))
        logs["logit_scale"] = scale.detach()
        return total, logs

    def score(self, scale: torch.Tensor, features: dict) -> tuple[torch.Tensor, dict]:
        """(loss, {term: detached value}) from ``step_features``' output."""
        raise NotImplementedError


class ClipTask(Task):
    """``clip``: open_clip's symmetric InfoNCE over the contrastive streams' pairs."""
    reads = needs = ("contrastive",)

    def __init__(self, clip: nn.Module, rank: int = 0, world_size: int = 1):
        super().__init__(clip)
        self.loss = ContrastiveLoss(rank, world_size)

    def score(self, scale, features):
        loss = self.loss(*features["contrastive"], scale)
        return loss, {"contrastive": loss.detach()}


class MCQTask(Task):
    """``mcq``: NegBench's MCQ loss alone (eq. 1) on the mcq stream."""
    reads = needs = ("mcq",)

    def __init__(self, clip: nn.Module, rank: int = 0, world_size: int = 1):
        super().__init__(clip)
        self.loss = MCQLoss()

    def score(self, scale, features):
        loss = self.loss(*features["mcq"], scale)
        return loss, {"mcq": loss.detach()}


class NegFullTask(Task):
    """``negfull``: NegBench eq. 2, α·L_clip(contrastive streams) + (1−α)·L_mcq(mcq stream); ``loss.negfull``."""
    reads = needs = ("contrastive", "mcq")
    block = "negfull"

    def __init__(self, clip: nn.Module, cfg, rank: int = 0, world_size: int = 1):
        super().__init__(clip)
        self.loss = NegFullLoss(cfg.alpha, rank, world_size)

    def score(self, scale, features):
        return self.loss(scale, contrastive=features["contrastive"], mcq=features["mcq"])


class RelCompTask(Task):
    """``relcomp``: w_itm·L_itm(itm stream) + w_clip·L_clip(every true pair of the step); ``loss.relcomp``."""
    reads = ("itm", "contrastive")
    needs = ("itm",)
    block = "relcomp"

    def __init__(self, clip: nn.Module, cfg, rank: int = 0, world_size: int = 1):
        super().__init__(clip)
        self.loss = RelCompLoss(cfg.margin, cfg.w_itm, cfg.w_clip, rank, world_size)

    def score(self, scale, features):
        return self.loss(scale, itm=features["itm"], contrastive=features.get("contrastive"))


LOSSES: dict[str, type[Task]] = {"clip": ClipTask, "mcq": MCQTask, "negfull": NegFullTask, "relcomp": RelCompTask}


def build_task(clip: nn.Module, loss_cfg, rank: int = 0, world_size: int = 1) -> Task:
    """The ``loss.name`` objective over ``clip``, given its ``loss.<block>`` settings."""
    cls = LOSSES[loss_cfg.name]
    args = (getattr(loss_cfg, cls.block),) if cls.block else ()
    return cls(clip, *args, rank=rank, world_size=world_size)
