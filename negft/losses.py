"""Training losses, one class each. Features come in L2-normalised; ``logit_scale`` is exp'ed."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from open_clip.loss import ClipLoss
from torch import nn


class ContrastiveLoss(nn.Module):
    """Symmetric InfoNCE over the global batch (open_clip's ``ClipLoss``).

    ``local_loss`` + ``gather_with_grad`` is the variant that scales: each rank scores its own rows
    against every rank's features, and gradients flow back through the gather, so the averaged
    gradient equals the one-process gradient on the same global batch.
    """

    def __init__(self, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.clip = ClipLoss(local_loss=True, gather_with_grad=True, cache_labels=True,
                             rank=rank, world_size=world_size)

    def forward(self, image_features, text_features, logit_scale):
        return self.clip(image_features, text_features, logit_scale)


class MCQLoss(nn.Module):
    """NegBench eq. 1: cross-entropy over C caption options scored by scaled *cosine* similarity.

    The NegBench release scores un-normalised features; the paper (and this class) uses cosine
    similarity, so the loss does not depend on feature norms.
    """

    def forward(self, image_features, option_features, answers, logit_scale, weights=None):
        # image_features (M, D), option_features (M, C, D), both normalised; answers (M,); weights (M,) or None
        logits = logit_scale * torch.einsum("md,mcd->mc", image_features, option_features)
        if weights is None:
            return F.cross_entropy(logits, answers)
        weights = weights.to(logits.dtype)
        return (weights * F.cross_entropy(logits, answers, reduction="none")).sum() / weights.sum().clamp_min(1e-12)


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
                negative_mask=None):
        # image, positive (B, D); negatives (B, K, D); negative_image (B, D); has_negative_image (B,) bool;
        # negative_mask (B, K) bool marks real negatives when a caption has fewer than K
        pos = (image * positive).sum(-1)                                  # s(I, T⁺)
        neg = torch.einsum("bd,bkd->bk", image, negatives)                # s(I, T⁻)
        hinge = F.relu(self.margin - pos.unsqueeze(1) + neg)
        if negative_mask is None:
            loss = hinge.mean()
        else:
            mask = negative_mask.to(hinge.dtype)
            count = mask.sum(1)
            per_anchor = (hinge * mask).sum(1) / count.clamp(min=1)
            loss = per_anchor[count > 0].mean() if (count > 0).any() else hinge.sum() * 0
        if negative_image is not None and has_negative_image is not None and has_negative_image.any():
            hard = (negative_image * positive).sum(-1)                    # s(I⁻, T⁺)
            loss = loss + F.relu(self.margin - pos + hard)[has_negative_image].mean()
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

    def forward(self, image_features, answer_features, truth, logit_scale):
        some = truth.any(-1)
        if not some.all():
            answer_features, truth = answer_features[some], truth[some]
        if truth.shape[0] == 0:
            return answer_features.sum() * 0.0
        logits = logit_scale * answer_features @ image_features.T
        return (torch.logsumexp(logits, -1) - torch.logsumexp(logits.masked_fill(~truth, float("-inf")), -1)).mean()


class DriftGuard(nn.Module):
    """negft's drift guard: keeps the fine-tuned model close to the frozen base where the fine-tuning data says
    nothing new (issue 22). Every term is zero-weighted by default; its weights are ``loss.guard.*``.

    - ``caption``: feature distillation on the affirmative captions of the step's images (the shards' ``caption``),
      ``w · mean(1 − cos(f_θ, f_base))``;
    - ``options``: the same on the step's affirmative MCQ options (``option_templates == positive``);
    - ``kl``: LwF / ZSCL distillation of the batch's image→caption similarity distribution,
      ``w · mean_i KL(p_base(i, ·) ‖ p_θ(i, ·))``, each row a softmax over the batch's affirmative captions at the
      base's logit scale (p_base) and the model's (p_θ);
    - ``l2sp``: an L2-SP anchor on the trained weights, ``w · Σ ‖θ − θ_base‖²`` (summed over every element).

    Features come in unnormalised or normalised (they are normalised here); the base's come from the frozen
    reference under no_grad. Returns (total, logs) with each active term's unweighted value in ``logs``.
    """

    def __init__(self, caption: float = 0.0, options: float = 0.0, kl: float = 0.0, l2sp: float = 0.0):
        super().__init__()
        self.w = {"caption": caption, "options": options, "kl": kl, "l2sp": l2sp}

    @property
    def active(self) -> bool:
        return any(v > 0 for v in self.w.values())

    @property
    def needs_captions(self) -> bool:
        return self.w["caption"] > 0 or self.w["kl"] > 0

    @staticmethod
    def distill(f, f_base):
        """mean(1 − cos(f, f_base)) over rows."""
        return (1 - (F.normalize(f, dim=-1) * F.normalize(f_base, dim=-1)).sum(-1)).mean()

    @staticmethod
    def kl_div(img, txt, scale, img_base, txt_base, scale_base):
        """mean over images of KL(softmax(s_b·img_b·txt_bᵀ) ‖ softmax(s·img·txtᵀ)), rows over the captions."""
        logits = scale * F.normalize(img, dim=-1) @ F.normalize(txt, dim=-1).T
        logits_base = scale_base * F.normalize(img_base, dim=-1) @ F.normalize(txt_base, dim=-1).T
        log_p, log_q = F.log_softmax(logits_base, dim=-1), F.log_softmax(logits, dim=-1)
        return (log_p.exp() * (log_p - log_q)).sum(-1).mean()

    @staticmethod
    def anchor(pairs):
        """Σ ‖θ − θ_base‖² over (parameter, its base value) pairs."""
        return sum(((p.float() - p0.float()) ** 2).sum() for p, p0 in pairs)

    def forward(self, caption=None, options=None, kl=None, l2sp=None):
        """``caption`` / ``options`` = (f_θ, f_base); ``kl`` = (img, txt, scale, img_base, txt_base, scale_base);
        ``l2sp`` = [(param, base value)]. A term whose input is None or whose weight is 0 is left out."""
        parts = {}
        if caption is not None and self.w["caption"] > 0 and len(caption[0]):
            parts["caption"] = self.distill(*caption)
        if options is not None and self.w["options"] > 0 and len(options[0]):
            parts["options"] = self.distill(*options)
        if kl is not None and self.w["kl"] > 0 and len(kl[0]):
            parts["kl"] = self.kl_div(*kl)
        if l2sp is not None and self.w["l2sp"] > 0:
            parts["l2sp"] = self.anchor(l2sp)
        if not parts:
            return None, {}
        total = sum(self.w[k] * v for k, v in parts.items())
        return total, {f"guard_{k}": v.detach() for k, v in parts.items()}
