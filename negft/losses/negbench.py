"""NegBench's objectives (Alhamoud et al., CVPR 2025; m1k2zoo/negbench): the MCQ loss alone (``mcq``, eq. 1) and
α·L_clip + (1−α)·L_mcq (``negfull``, eq. 2), and the terms negft adds to them: the text→image MCQ terms (``t2i``,
``t2i_options``) and the NegCap hard negatives (``hard_negatives``), each off at a weight of 0.

Their settings sit in the objective's block (``loss.mcq``, ``loss.negfull``: ``negft.losses.registry``'s
``MCQCfg`` and ``NegFullCfg`` join them)."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from negft.fields import bounded, choice

from .batch import answer_truth, negcap_hard_negatives, option_truth, question_weights
from .core import ContrastiveLoss, Step, Term, WeightedTerm, rows_of, weight


class MCQLoss(nn.Module):
    """NegBench eq. 1: cross-entropy over C caption options scored by ``s · v · t``, the (weighted) mean over the
    questions.

    Handed normalised features it scores cosines, the paper's eq. 1 and negft's default; handed the towers' own
    features it scores raw dot products, as NegBench's released ``train.py`` does (``process_mcq_batch`` passes
    ``encode_image`` / ``encode_text`` un-normalised to its ``MCQLoss``): the terms choose with ``similarity``.
    """

    def forward(self, image_features, option_features, answers, logit_scale, weights=None):
        # image_features (M, D), option_features (M, C, D); answers (M,); weights (M,) or None
        logits = logit_scale * torch.einsum("md,mcd->mc", image_features, option_features)
        if weights is None:
            return F.cross_entropy(logits, answers)
        weights = weights.to(logits.dtype)
        return (weights * F.cross_entropy(logits, answers, reduction="none")).sum() / weights.sum().clamp_min(1e-12)


class NegFullLoss(nn.Module):
    """NegBench eq. 2: α·L_clip(NegCap batch) + (1−α)·L_mcq(NegMCQ batch)."""

    def __init__(self, alpha: float, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.alpha = alpha
        self.contrastive = ContrastiveLoss(rank, world_size)
        self.mcq = MCQLoss()

    def forward(self, logit_scale, contrastive=None, mcq=None):
        """``contrastive`` = (img, txt) features; ``mcq`` = (img, options, answers[, per-question weights]).
        Either may be None."""
        parts = {}
        if contrastive is not None:
            parts["contrastive"] = self.contrastive(*contrastive, logit_scale)
        if mcq is not None:
            img, options, answers, *weights = mcq
            parts["mcq"] = self.mcq(img, options, answers, logit_scale, weights=weights[0] if weights else None)
        if len(parts) == 2:
            total = self.alpha * parts["contrastive"] + (1 - self.alpha) * parts["mcq"]
        else:
            total = next(iter(parts.values()))
        return total, {k: v.detach() for k, v in parts.items()}


class TextToImageMCQLoss(nn.Module):
    """A text→image MCQ term: each MCQ's right answer ("no X", "a Y but no X", ...) picks, among the batch's
    images, one it is true of — ``−log Σ_{j true} softmax_j(s · t_i · v_j)`` — so a negated object must pull the
    answer away from the images that contain it. ``truth`` (M, M) marks which images each answer is true of
    (the pipeline's ``answer_truth``, from the samples' object labels); the diagonal is always true, and a row that
    is all true (a question without labels) adds exactly 0. Over every option (``option_truth``, (M·C, M)) a
    wrong option may be true of no image of the batch: such a row has nothing to pick and is left out."""

    def forward(self, image_features, answer_features, truth, logit_scale, some=None):
        """``some``: ``truth.any(-1)``, the host's copy where the caller has it (else read from ``truth``)."""
        some = truth.any(-1) if some is None else some
        if not some.all():
            rows = rows_of(some, truth.device)
            answer_features, truth = answer_features[rows], truth[rows]
        if truth.shape[0] == 0:
            return answer_features.sum() * 0.0
        logits = logit_scale * answer_features @ image_features.T
        return (torch.logsumexp(logits, -1) - torch.logsumexp(logits.masked_fill(~truth, float("-inf")), -1)).mean()


class HardNegativeLoss(nn.Module):
    """negft's NegCap hard-negative term: ``−log softmax`` of each caption's own image among {its image} ∪ {its
    hard negatives} (``hard`` (M, M): the step's images the caption is false of, ``negcap_hard_negatives``), at
    ``s · t_i · v_j``, averaged over the captions that have one; the plain contrastive loss weighs such an image
    as any other. 0, keeping the graph, when no caption has one."""

    def forward(self, image_features, text_features, hard, logit_scale, some=None):
        """``some``: ``hard.any(-1)``, the host's copy where the caller has it (else read from ``hard``)."""
        logits = logit_scale * text_features @ image_features.T
        some = hard.any(-1) if some is None else some
        if not some.any():
            return logits.sum() * 0.0
        rows = rows_of(some, hard.device)
        logits, candidates = logits[rows], hard[rows].clone()
        candidates[torch.arange(len(rows), device=rows.device), rows] = True
        own = logits.gather(1, rows[:, None]).squeeze(1)
        return (torch.logsumexp(logits.masked_fill(~candidates, float("-inf")), -1) - own).mean()


def _negation_weight() -> Any:
    return bounded(1.0, lo=0.0, fix="must be >= 0 (1: NegBench's unweighted mean)",
                   doc="the weight of negation-type questions (the right answer negates: NegBench's ``negative`` "
                       "template) in the MCQ loss, the others' 1 (a weighted mean); 1 = NegBench's unweighted mean")


SIMILARITIES = ("cosine", "dot")


def _similarity() -> Any:
    return choice("cosine", SIMILARITIES,
                  doc="what the MCQ loss scales by the logit scale: cosine, the cosine of the image and the option "
                      "(the paper's eq. 1); dot, the dot product of the towers' un-normalised features, as "
                      "NegBench's released train.py computes it (its MCQLoss on encode_image / encode_text), so "
                      "the features' norms enter the logits")


@dataclass
class MCQSettings:
    negation_weight: float = _negation_weight()
    similarity: str = _similarity()


def mcq_features(step: Step, similarity: str) -> tuple:
    """The mcq stream's (images, options (M, C, D), answers, weights or None) as the MCQ loss scores them: normalised
    for ``cosine``; for ``dot`` the towers' own features (``Step.images`` / ``texts``), as NegBench's train.py hands
    them to its loss."""
    img, options, answers, weights = step.features["mcq"]
    if similarity == "dot":
        img = step.images[step.image_rows["mcq"]]
        options = step.texts[step.text_rows["mcq"]].view(options.shape)
    return img, options, answers, weights


def _question_weight_fields(settings, task: str) -> dict:
    """mcq_weight on an mcq stream when negation-type questions are weighted."""
    w = settings.negation_weight
    return {"mcq_weight": partial(question_weights, weight=w)} if task == "mcq" and w != 1.0 else {}


class MCQ(Term):
    """``mcq``: NegBench's MCQ loss alone (eq. 1) on the mcq stream."""
    name = "mcq"
    reads = needs = ("mcq",)
    Settings = MCQSettings
    off = {"negation_weight": 1.0}

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = MCQLoss()

    def fields(self, task):
        return _question_weight_fields(self.settings, task)

    def forward(self, step):
        img, options, answers, weights = mcq_features(step, self.settings.similarity)
        loss = self.loss(img, options, answers, step.scale, weights=weights)
        return loss, {"mcq": loss.detach()}


@dataclass
class NegFullSettings:
    alpha: float = bounded(0.5, lo=0.0, hi=1.0, fix="must lie in [0, 1] (the weight of the contrastive loss)",
                           doc="α, the weight of the contrastive loss")
    negation_weight: float = _negation_weight()     # as loss.mcq.negation_weight
    similarity: str = _similarity()                 # as loss.mcq.similarity


class NegFull(Term):
    """``negfull``: NegBench eq. 2, α·L_clip(contrastive streams) + (1−α)·L_mcq(mcq stream)."""
    name = "negfull"
    reads = needs = ("contrastive", "mcq")
    Settings = NegFullSettings
    off = MCQ.off

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = NegFullLoss(settings.alpha, rank, world_size)

    def fields(self, task):
        return _question_weight_fields(self.settings, task)

    def forward(self, step):
        return self.loss(step.scale, contrastive=step.features["contrastive"],
                         mcq=mcq_features(step, self.settings.similarity))


@dataclass
class TextToImageSettings:
    t2i: float = weight("negft's text→image MCQ term (TextToImageMCQLoss), added with this weight: each MCQ's right "
                        "answer picks, among the step's MCQ images, one it is true of (the samples' object labels "
                        "say which); 0 = off")


class TextToImage(WeightedTerm):
    """``t2i``: each right answer picks, among the step's MCQ images, one it is true of (``answer_truth``)."""
    name = "t2i"
    Settings = TextToImageSettings
    task, batch_field, make_field = "mcq", "answer_truth", staticmethod(answer_truth)
    loss_type = TextToImageMCQLoss

    def pickers(self, options: torch.Tensor, answers: torch.Tensor) -> torch.Tensor:
        """The text features that pick images: each question's right answer."""
        return options[torch.arange(len(answers), device=options.device), answers]

    def score(self, step, truth, host):
        img, options, answers, _ = step.features["mcq"]
        return self.loss(img, self.pickers(options, answers), truth, step.scale,
                         some=None if host is None else host.any(-1)), {}


@dataclass
class TextToImageOptionsSettings:
    t2i_options: float = weight("the same term over every option, the wrong ones too (\"a cat but no dog\" picks an "
                                "image with a cat and without a dog): needs each option's [affirmed, negated] "
                                "objects (``mcq.option_objects``, which ``negft data negate`` and the world write; "
                                "NegBench's CSVs do not have them, and such rows add 0); 0 = off")


class TextToImageOptions(TextToImage):
    """``t2i_options``: every option picks, among the step's MCQ images, one it is true of (``option_truth``)."""
    name = "t2i_options"
    Settings = TextToImageOptionsSettings
    batch_field, make_field = "option_truth", staticmethod(option_truth)     # on the same "mcq" streams

    def pickers(self, options, answers):
        return options.flatten(0, 1)


@dataclass
class HardNegativesSettings:
    hard_negatives: float = weight("negft's NegCap hard-negative term (HardNegativeLoss), added with this weight: "
                                   "each NegCap caption against its own image and the step's images that hold an "
                                   "object it negates (the samples' object labels say which; unlabelled data has "
                                   "none); 0 = off")


class NegCapHardNegatives(WeightedTerm):
    """``hard_negatives``: each NegCap caption picks its own image over the step's images that hold an object it
    negates (``negcap_hard_negatives``); also logs the share of the step's captions that had one."""
    name = "hard_negatives"
    Settings = HardNegativesSettings
    task, batch_field, make_field = "contrastive", "negcap_hard_negatives", staticmethod(negcap_hard_negatives)
    loss_type = HardNegativeLoss

    def score(self, step, hard, host):
        term = self.loss(*step.features["contrastive"], hard, step.scale, some=None if host is None else host.any(-1))
        return term, {"hard_negative_share": hard.any(-1).float().mean()}
