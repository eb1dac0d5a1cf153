"""The module DeepSpeed trains: an open_clip model plus one objective, chosen by ``loss.name``.

A step's batch is keyed by stream task (``contrastive``, ``mcq``, ``itm``; streams sharing a task are
concatenated first). ``Task.forward`` encodes every image and text of the step in one pass per tower and
normalises the features in fp32; each subclass scores them with its loss. Adding a loss is one subclass here,
one config block in ``negft.config.LossCfg`` (if it has settings) and one line in ``LOSSES``.
"""
from __future__ import annotations

import copy
import hashlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from negft.losses import ContrastiveLoss, DriftGuard, MCQLoss, NegFullLoss, RelCompLoss, TextToImageMCQLoss
from negft.models import encode_text_trimmed

MAX_LOGIT_SCALE = math.log(100.0)
MAX_CACHED_IMAGES = 100_000     # FrozenImageFeatures' bound: 100k × 512 fp32 features is 200 MB
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
    (M, C, D), answers, per-question weights or None); ``itm`` = the keyword arguments of ``ITMTripletLoss``."""
    img, txt = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    parts = {}
    if "contrastive" in batch:
        b = batch["contrastive"]["images"].shape[0]
        parts["contrastive"] = (img[:b], txt[:b])
        img, txt = img[b:], txt[b:]
    if "mcq" in batch:
        mcq = batch["mcq"]
        m, c = mcq["options"].shape[:2]
        parts["mcq"] = (img[:m], txt[:m * c].view(m, c, -1), mcq["answers"], mcq.get("mcq_weight"))
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
    terms: tuple[str, ...] = ()     # the term blocks it reads too (``loss.guard``: the drift guard)
    w_t2i: float = 0.0              # the text→image MCQ term's weight (mcq and negfull: ``loss.<block>.t2i``)
    w_t2i_options: float = 0.0      # ... over every option (``loss.<block>.t2i_options``)

    def __init__(self, clip: nn.Module):
        super().__init__()
        self.clip = clip
        # the drift guard (losses.DriftGuard) and its frozen reference: a copy of the base's trained tower(s)
        # and, for l2sp, of the trained weights, held outside the module tree (object.__setattr__), so neither
        # is in state_dict() or parameters(): not saved in checkpoints, never seen by the optimizer or DeepSpeed
        object.__setattr__(self, "guard", None)
        object.__setattr__(self, "reference", None)
        object.__setattr__(self, "anchors", None)
        # a FrozenImageFeatures when the image tower is frozen and the images are not augmented (use_image_cache)
        object.__setattr__(self, "image_features", None)
        self.tower = "vt"

    @classmethod
    def blocks(cls) -> tuple[str, ...]:
        """Every block of ``loss`` this objective reads (its own and its terms')."""
        return ((cls.block,) if cls.block else ()) + cls.terms

    def use_image_cache(self) -> None:
        """Keep the frozen image tower's features (FrozenImageFeatures); the caller checks that the tower is
        frozen, in eval mode, on the CPU, and that the training transform does not augment."""
        object.__setattr__(self, "image_features", FrozenImageFeatures())

    def add_guard(self, guard: DriftGuard, tower: str) -> None:
        """Turn the drift guard on (its weights > 0): freeze a copy of the model as it is now (the base)."""
        if not guard.active:
            return
        object.__setattr__(self, "guard", guard)
        object.__setattr__(self, "reference", frozen_reference(self.clip, tower))
        if guard.w["l2sp"] > 0:
            object.__setattr__(self, "anchors", [(p, p.detach().clone()) for p in self.clip.parameters()
                                                 if p.requires_grad])
        self.tower = tower

    def forward(self, batch: dict[str, dict]):
        unread = [k for k in batch if k not in self.reads]
        if unread:
            raise ValueError(f"{type(self).__name__} reads {', '.join(self.reads)} batches, not {', '.join(unread)}")
        scale = self.clip.logit_scale.float().clamp(0, MAX_LOGIT_SCALE).exp()
        images, texts = step_inputs(batch)
        guarded = [batch[k] for k in ("contrastive", "mcq") if self.guard is not None and k in batch
                   and "captions" in batch[k]]
        n_cap = sum(b["captions"].shape[0] for b in guarded) if self.guard is not None \
            and self.guard.needs_captions else 0
        if n_cap:       # the affirmative captions in the same text pass
            texts = texts + [b["captions"] for b in guarded]
        images = torch.cat(images)
        if self.image_features is not None:
            img = self.image_features(self.clip.encode_image, images)
        else:
            img = self.clip.encode_image(images).float()
        txt = encode_text_trimmed(self.clip, torch.cat(texts)).float()
        cap = None
        if n_cap:
            txt, cap = txt[:-n_cap], txt[-n_cap:]
        with torch.autocast(img.device.type, enabled=False):     # the scores in fp32 under train.autocast too
            features = step_features(batch, img, txt)
            total, logs = self.score(scale, features)
            if self.w_t2i > 0 and "answer_truth" in batch.get("mcq", {}):
                m_img, opts, answers, _ = features["mcq"]
                term = TextToImageMCQLoss()(m_img, opts[torch.arange(len(answers), device=opts.device), answers],
                                            batch["mcq"]["answer_truth"], scale)
                total, logs["t2i"] = total + self.w_t2i * term, term.detach()
            if self.w_t2i_options > 0 and "option_truth" in batch.get("mcq", {}):
                m_img, opts, _, _ = features["mcq"]
                term = TextToImageMCQLoss()(m_img, opts.flatten(0, 1), batch["mcq"]["option_truth"], scale)
                total, logs["t2i_options"] = total + self.w_t2i_options * term, term.detach()
            if self.guard is not None:
                extra, guard_logs = self._guard(scale, img, txt, cap, guarded, batch)
                if extra is not None:
                    total = total + extra
                    logs.update(guard_logs)
        logs["logit_scale"] = scale.detach()
        return total, logs

    def _guard(self, scale, img, txt, cap, guarded, batch):
        """The drift guard's terms: the model's features carry the gradient, the frozen reference's are computed
        under no_grad (only they: features taken under no_grad would carry none, and the term would not act)."""
        ref = self.reference
        if next(ref.parameters()).device != img.device:
            ref.to(img.device)
        caption = options = kl = None
        if cap is not None:
            tokens = torch.cat([b["captions"] for b in guarded])
            has = torch.cat([b["has_caption"] for b in guarded]).bool()
            # the guarded batches' images, in step_inputs' order (contrastive, then mcq)
            rows, start = [], 0
            for k in ("contrastive", "mcq"):
                if k in batch:
                    n = batch[k]["images"].shape[0]
                    if "captions" in batch[k]:
                        rows.append(torch.arange(start, start + n, device=img.device))
                    start += n
            rows = torch.cat(rows)[has]
            with torch.no_grad():
                cap_base = encode_text_trimmed(ref, tokens[has]).float()
                if "v" in self.tower:
                    img_base = ref.encode_image(torch.cat([b["images"] for b in guarded])[has]).float()
                else:
                    img_base = img[rows].detach()
                scale_base = ref.logit_scale.float().clamp(0, MAX_LOGIT_SCALE).exp()
            caption = (cap[has], cap_base)
            kl = (img[rows], cap[has], scale, img_base, cap_base, scale_base)
        mcq = batch.get("mcq")
        if mcq is not None and "option_affirmative" in mcq and self.guard.w["options"] > 0:
            m, c = mcq["options"].shape[:2]
            keep = mcq["option_affirmative"].flatten().bool()
            if keep.any():
                start = batch["contrastive"]["texts"].shape[0] if "contrastive" in batch else 0
                opt = txt[start:start + m * c][keep]
                with torch.no_grad():
                    opt_base = encode_text_trimmed(ref, mcq["options"].flatten(0, 1)[keep]).float()
                options = (opt, opt_base)
        return self.guard(caption=caption, options=options, kl=kl, l2sp=self.anchors)

    def score(self, scale: torch.Tensor, features: dict) -> tuple[torch.Tensor, dict]:
        """(loss, {term: detached value}) from ``step_features``' output."""
        raise NotImplementedError


def frozen_reference(clip: nn.Module, tower: str) -> nn.Module:
    """A frozen copy of the base model for the drift guard: eval mode, no gradients, and without the image tower
    when only the text tower trains (the model's own image features are the base's then)."""
    visual = clip.visual
    if "v" not in tower:
        clip.visual = None          # not copied
    try:
        ref = copy.deepcopy(clip)
    finally:
        clip.visual = visual
    ref.requires_grad_(False)
    return ref.eval()


class FrozenImageFeatures:
    """The features of a frozen image tower, kept by the images' pixel content. When the image tower does not train
    and the training transform does not augment (the world's default), a sample's image always gives the same
    features; the NegCap and NegMCQ streams read the same images and every epoch reads them again, so the demo
    encodes each image about three times. Only the misses are encoded (in one batch); at most
    ``MAX_CACHED_IMAGES`` are kept (then new images are encoded and not kept). CPU only: on a GPU, reading the
    pixels back to hash them would cost about what encoding them does."""

    def __init__(self, limit: int = MAX_CACHED_IMAGES):
        self.features: dict[bytes, torch.Tensor] = {}
        self.limit = limit

    def __call__(self, encode, images: torch.Tensor) -> torch.Tensor:
        keys = [hashlib.blake2b(row.contiguous().flatten().view(torch.uint8).numpy().tobytes(),
                                digest_size=16).digest() for row in images.detach()]
        miss = [i for i, k in enumerate(keys) if k not in self.features]
        fresh = {}
        if miss:
            encoded = encode(images[miss]).float()
            fresh = dict(zip((keys[i] for i in miss), encoded))
            for k, f in fresh.items():
                if len(self.features) < self.limit:
                    self.features[k] = f
        return torch.stack([fresh[k] if k in fresh else self.features[k] for k in keys])


class ClipTask(Task):
    """``clip``: open_clip's symmetric InfoNCE over the contrastive streams' pairs."""
    reads = needs = ("contrastive",)
    terms = ("guard",)

    def __init__(self, clip: nn.Module, rank: int = 0, world_size: int = 1):
        super().__init__(clip)
        self.loss = ContrastiveLoss(rank, world_size)

    def score(self, scale, features):
        loss = self.loss(*features["contrastive"], scale)
        return loss, {"contrastive": loss.detach()}


class MCQTask(Task):
    """``mcq``: NegBench's MCQ loss alone (eq. 1) on the mcq stream."""
    reads = needs = ("mcq",)
    block = "mcq"
    terms = ("guard",)

    def __init__(self, clip: nn.Module, cfg=None, rank: int = 0, world_size: int = 1):
        super().__init__(clip)
        self.loss = MCQLoss()
        self.w_t2i = cfg.t2i if cfg is not None else 0.0
        self.w_t2i_options = cfg.t2i_options if cfg is not None else 0.0

    def score(self, scale, features):
        img, options, answers, weights = features["mcq"]
        loss = self.loss(img, options, answers, scale, weights=weights)
        return loss, {"mcq": loss.detach()}


class NegFullTask(Task):
    """``negfull``: NegBench eq. 2, α·L_clip(contrastive streams) + (1−α)·L_mcq(mcq stream); ``loss.negfull``."""
    reads = needs = ("contrastive", "mcq")
    block = "negfull"
    terms = ("guard",)

    def __init__(self, clip: nn.Module, cfg, rank: int = 0, world_size: int = 1):
        super().__init__(clip)
        self.loss = NegFullLoss(cfg.alpha, rank, world_size)
        self.w_t2i = cfg.t2i
        self.w_t2i_options = cfg.t2i_options

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


def build_guard(loss_cfg) -> DriftGuard | None:
    """The drift guard of ``loss.guard``, or None when every weight is 0 or the loss does not read it (the loss
    is then NegBench's, unchanged)."""
    if "guard" not in LOSSES[loss_cfg.name].terms:
        return None
    g = loss_cfg.guard
    guard = DriftGuard(g.caption, g.options, g.kl, g.l2sp)
    return guard if guard.active else None


def stream_extras(loss_cfg, task: str) -> dict:
    """The extra fields a stream of this task carries for the loss's terms (data.pipeline.StreamSpec's
    ``guard``, ``t2i``, ``t2i_options`` and ``negation_weight``)."""
    cls = LOSSES[loss_cfg.name]
    block = getattr(loss_cfg, cls.block) if cls.block in ("mcq", "negfull") else None
    return {"guard": build_guard(loss_cfg) is not None and task in ("contrastive", "mcq"),
            "t2i": block is not None and block.t2i > 0 and task == "mcq",
            "t2i_options": block is not None and block.t2i_options > 0 and task == "mcq",
            "negation_weight": block.negation_weight if block is not None and task == "mcq" else 1.0}


def build_task(clip: nn.Module, loss_cfg, rank: int = 0, world_size: int = 1, tower: str = "vt") -> Task:
    """The ``loss.name`` objective over ``clip``, given its ``loss.<block>`` settings, with the drift guard of
    ``loss.guard`` when it reads it and a weight is > 0 (``tower``: the towers that train)."""
    cls = LOSSES[loss_cfg.name]
    args = (getattr(loss_cfg, cls.block),) if cls.block else ()
    task = cls(clip, *args, rank=rank, world_size=world_size)
    guard = build_guard(loss_cfg)
    if guard is not None:
        task.add_guard(guard, tower)
    return task
