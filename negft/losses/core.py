"""The core every loss term shares: what a term is handed (``Step``) and what it is (``Term``; ``WeightedTerm``, one
weight times a loss of one batch field; ``HardNegativeTerm``, the baselines' base over an ``itm`` stream), open_clip's
contrastive loss and its term (``clip``), and the gathering that lets several ranks train as one process.

Features come in L2-normalised; ``logit_scale`` is exp'ed."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from negft.fields import bounded, choice

from .batch import (hard_caption, negative_image_caption, negative_image_captioned, negative_image_hard_caption,
                    negative_image_hard_captioned)


MAX_LOGIT_SCALE = math.log(100.0)       # the logit scale's clamp, as open_clip's: a largest scale of 100
HOST = "host"       # a step's batch's key for the host's copy of it (negft.train.engine.batch_to)


def rows_of(mask: torch.Tensor, device) -> torch.Tensor:
    """The indices of ``mask``'s true rows, on ``device``. Given the host's copy of a mask, the device never waits
    for the host to learn the count (a boolean index on the device does: a nonzero); the values it selects, and
    their gradients, are the boolean index's."""
    rows = mask.nonzero().flatten()
    if rows.device.type == "cpu" and torch.device(device).type == "cuda":
        rows = rows.pin_memory()
    return rows.to(device, non_blocking=True)


class ContrastiveLoss(nn.Module):
    """Symmetric InfoNCE over the global batch (open_clip's ``ClipLoss``).

    ``local_loss`` + ``gather_with_grad`` is the variant that scales: each rank scores its own rows
    against every rank's features, and gradients flow back through the gather, so the averaged
    gradient equals the one-process gradient on the same global batch.
    """

    def __init__(self, rank: int = 0, world_size: int = 1):
        super().__init__()
        from open_clip.loss import ClipLoss     # open_clip's import costs seconds; reading a recipe needs none of it
        self.clip = ClipLoss(local_loss=True, gather_with_grad=True, cache_labels=True,
                             rank=rank, world_size=world_size)

    def forward(self, image_features, text_features, logit_scale):
        return self.clip(image_features, text_features, logit_scale)


def gather_rows(x: torch.Tensor, world_size: int) -> torch.Tensor:
    """Every rank's ``x``, stacked in rank order, with gradients flowing back to each rank's own (a mask is sent as
    bytes and comes back bool)."""
    if world_size == 1:
        return x
    if x.dtype == torch.bool:
        return gather_rows(x.to(torch.uint8), world_size).bool()
    from torch.distributed.nn import all_gather     # only where a process group exists
    return torch.cat(all_gather(x))


@dataclass
class Step:
    """What ``Task.forward`` hands each term: the step encoded once (negft.train.task)."""
    batch: dict                 # the step's batches by stream task (contrastive, mcq, itm)
    scale: torch.Tensor         # exp(logit_scale), clamped, fp32
    features: dict              # normalised features per stream task (task.step_features)
    images: torch.Tensor        # every image's features, unnormalised, in task.step_inputs' order
    texts: torch.Tensor         # every text's features, unnormalised, in task.step_inputs' order
    extra: dict                 # term name -> the features of the texts it asked for (Term.texts)
    encode_text: Callable       # (model, tokens, host's copy or None) -> text features, trimmed
    image_rows: dict = field(default_factory=dict)  # stream task -> the slice of ``images`` that is its batch's
    text_rows: dict = field(default_factory=dict)   # stream task -> the slice of ``texts`` that is its batch's
    host: dict | None = None    # stream task -> the host's copy of its batch (HOST), None where the step has none:
    #                             what sizes an output by the values is read there, with no round trip
    tokens: dict | None = None  # where a term asks (Term.tokens): the itm batch's patch and token features


class Term:
    """One summand of an objective. Subclasses set the class attributes and override what they use."""
    name: ClassVar[str] = ""                # its log key
    block: ClassVar[str | None] = None      # its own settings block ``loss.<block>``; None: the objective's block
    Settings: ClassVar[type | None] = None  # a dataclass of its keys, their defaults and ranges (negft.fields)
    off: ClassVar[dict] = {}                # key -> the value at which it adds nothing (or NegBench's own loss)
    reads: ClassVar[tuple[str, ...]] = ()   # an objective's first term: the stream tasks it scores
    needs: ClassVar[tuple[str, ...]] = ()   # ... and those it cannot do without
    by_image: ClassVar[tuple[str, ...]] = ()  # its fields indexed by the batch's images ((M, M), (M·C, M))
    tokens: bool = False                    # it reads the itm batch's patch and token features (Step.tokens)

    def __init__(self, settings=None, rank: int = 0, world_size: int = 1):
        self.settings = settings

    def on(self) -> bool:
        """False when it adds nothing (a weight of 0): it is then not built."""
        return True

    def fields(self, task: str) -> dict[str, Callable]:
        """The batch fields a stream of ``task`` carries for it: name -> fn(samples' json, tokenizer)."""
        return {}

    def texts(self, batch: dict) -> list[torch.Tensor]:
        """Token rows of its own to encode in the step's one text pass (``Step.extra[name]``)."""
        return []

    def attach(self, clip: nn.Module, tower: str) -> None:
        """Called once the model is built, before training (``tower``: the towers that train)."""

    def state(self) -> dict[str, torch.Tensor]:
        """What it carries from one step to the next: a checkpoint keeps it, and a resumed run goes on from it."""
        return {}

    def load_state(self, state: dict[str, torch.Tensor]) -> None:
        """Take back what ``state`` gave (from a checkpoint)."""

    def forward(self, step: Step) -> tuple[torch.Tensor | None, dict]:
        raise NotImplementedError

    def __call__(self, step: Step):
        return self.forward(step)


def weight(doc: str) -> Any:
    """A term's weight: >= 0, 0 = off (the default)."""
    return bounded(0.0, lo=0.0, fix="must be >= 0 (0: off)", doc=doc)


def _flag(doc: str) -> Any:
    """A switch, off by default."""
    return choice(False, (False, True), doc=doc)


class Contrastive(Term):
    """``clip``: open_clip's symmetric InfoNCE over the contrastive streams' pairs."""
    name = "contrastive"
    reads = needs = ("contrastive",)

    def __init__(self, settings=None, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = ContrastiveLoss(rank, world_size)

    def forward(self, step):
        loss = self.loss(*step.features["contrastive"], step.scale)
        return loss, {"contrastive": loss.detach()}


class WeightedTerm(Term):
    """A term that is one weight times a loss of one batch field of one stream task's batches: its Settings hold
    that weight alone, under the term's ``name`` (0, the default, is off); it asks for ``batch_field`` (made by
    ``make_field``) on the ``task`` streams, adds nothing to a step whose batch lacks it, and logs its unweighted
    value under its name. Subclasses say what they score (``score``)."""
    task: ClassVar[str] = ""                    # the stream task whose batches carry its field
    batch_field: ClassVar[str] = ""             # that field, indexed by the batch's images (``by_image``)
    make_field: ClassVar[Callable]              # fn(samples' json, tokenizer) -> the field (a staticmethod)
    loss_type: ClassVar[Callable]               # the loss module it scores with, built without arguments

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.by_image = (cls.batch_field,)
        cls.off = {cls.name: 0.0}

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.weight = getattr(settings, self.name)
        self.loss = self.loss_type()

    def on(self):
        return self.weight > 0

    def fields(self, task):
        return {self.batch_field: self.make_field} if task == self.task else {}

    def score(self, step: Step, value: torch.Tensor, host: torch.Tensor | None) -> tuple[torch.Tensor, dict]:
        """(its unweighted value, more logs) given the step, its batch field and the host's copy of it (or None)."""
        raise NotImplementedError

    def forward(self, step):
        batch = step.batch.get(self.task, {})
        if self.batch_field not in batch:
            return None, {}
        host = step.host[self.task][self.batch_field] if step.host else None
        term, logs = self.score(step, batch[self.batch_field], host)
        return self.weight * term, {self.name: term.detach(), **logs}


# the texts a baseline term encodes in the step's text pass (HardNegativeTerm.text_fields), by name
TEXT_FIELDS = {f.__name__: f for f in (hard_caption, negative_image_caption, negative_image_hard_caption)}


class HardNegativeTerm(Term):
    """A baseline method's loss (NegCLIP, CoN-CLIP, TripletCLIP, FSC-CLIP, CE-CLIP) over a RelComp-format stream
    (task ``itm``, field ``relcomp``): each image with its caption, its typed hard captions (``negatives``, a mask
    for fewer than K), and, where it has one, a hard-negative image with that image's own caption and a hard caption
    of it (``text_fields``: tokens the pipeline adds to the batch, encoded in the step's one text pass). The
    world's method splits (negft/world/methods.py) carry each method's own kind; a converted dataset carries what
    its release has."""
    reads = needs = ("itm",)
    text_fields: ClassVar[tuple[str, ...]] = ()      # of TEXT_FIELDS

    def fields(self, task):
        if task != "itm" or not self.text_fields:
            return {}
        return {**{f: TEXT_FIELDS[f] for f in self.text_fields}, self._captioned().__name__: self._captioned()}

    def _captioned(self):
        """The mask of the samples whose negative image has what the term reads of it."""
        return negative_image_hard_captioned if "negative_image_hard_caption" in self.text_fields \
            else negative_image_captioned

    def texts(self, batch):
        return [batch["itm"][f] for f in self.text_fields]

    def hard_texts(self, step: Step) -> dict[str, torch.Tensor]:
        """The normalised features of ``text_fields``, (B, D) each."""
        if not self.text_fields:
            return {}
        feats = F.normalize(step.extra[self.name], dim=-1)
        return dict(zip(self.text_fields, feats.chunk(len(self.text_fields))))

    def has_negative_image(self, step: Step) -> torch.Tensor:
        """(B,) bool: the sample has a negative image with what the term reads of it (its caption, and for NegCLIP a
        hard caption of it)."""
        itm = step.batch["itm"]
        return itm["has_negative_image"] & itm[self._captioned().__name__]
