"""negft's drift guard (``loss.guard``), a term every objective adds when any of its weights is
> 0: it keeps the fine-tuned model close to a frozen copy of its base where the fine-tuning data says nothing
new."""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .batch import caption_tokens, has_caption, option_affirmative
from .core import MAX_LOGIT_SCALE, Term, rows_of, weight


class DriftGuard(nn.Module):
    """negft's drift guard: keeps the fine-tuned model close to the frozen base where the fine-tuning data says
    nothing new. Every term is zero-weighted by default; its weights are ``loss.guard.*`` (the ``Guard`` term).

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


@dataclass
class GuardCfg:
    """negft's drift guard (DriftGuard), a term every objective adds to its loss when any
    weight is > 0; every weight 0 = off (NegBench's recipes, bit-identical training)."""
    caption: float = weight("w · mean(1 − cos(f_θ, f_base)) on the affirmative captions of the step's images")
    options: float = weight("the same on the step's affirmative MCQ options")
    kl: float = weight("KL(p_base ‖ p_θ) of each image's softmax over the step's affirmative captions")
    l2sp: float = weight("w · Σ ‖θ − θ_base‖² over the trained weights")


# the stream tasks whose images' captions the guard reads: negft's streams and the baselines' itm streams (whose
# samples carry their image's affirmative ``caption`` beside the method's record)
CAPTIONED_TASKS = ("contrastive", "mcq", "itm")


def _captioned(batch: dict) -> list[str]:
    """The step's stream tasks whose batches carry their images' captions, in the order the guard encodes them."""
    return [k for k in CAPTIONED_TASKS if k in batch and "captions" in batch[k]]


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


class Guard(Term):
    """``loss.guard``: the drift guard (DriftGuard) against a frozen copy of the base's trained tower(s) and, for
    l2sp, of the trained weights. The term is a plain object, not a module: neither copy is in the task's
    state_dict() or parameters(), so neither is saved in checkpoints or seen by the optimizer or DeepSpeed. The
    model's features carry the gradient; the reference's are computed under no_grad (only they: features taken
    under no_grad would carry none, and the term would not act). Its batches' rows among the step's images and
    texts are the step's (``Step.image_rows`` / ``text_rows``)."""
    name = block = "guard"
    Settings = GuardCfg
    off = {f.name: 0.0 for f in dataclasses.fields(GuardCfg)}

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        self.loss = DriftGuard(settings.caption, settings.options, settings.kl, settings.l2sp)
        self.reference = self.anchors = None
        self.tower = "vt"

    def on(self):
        return self.loss.active

    def fields(self, task):
        if task not in CAPTIONED_TASKS:
            return {}
        out = {"captions": caption_tokens, "has_caption": has_caption}
        if task == "mcq":
            out["option_affirmative"] = option_affirmative
        return out

    def attach(self, clip, tower):
        """Freeze a copy of the model as it is now (the base)."""
        self.tower = tower
        self.reference = frozen_reference(clip, tower)
        if self.loss.w["l2sp"] > 0:
            self.anchors = [(p, p.detach().clone()) for p in clip.parameters() if p.requires_grad]

    def texts(self, batch):
        """The affirmative captions, in the step's text pass (for the caption and kl terms)."""
        return [batch[k]["captions"] for k in _captioned(batch)] if self.loss.needs_captions else []

    def forward(self, step):
        ref, img, batch = self.reference, step.images, step.batch
        host = step.host or batch       # the masks' host copies where the step has them
        if next(ref.parameters()).device != img.device:
            ref.to(img.device)
        caption = options = kl = None
        cap = step.extra.get(self.name)
        if cap is not None:
            captioned = _captioned(batch)
            tokens = torch.cat([batch[k]["captions"] for k in captioned])
            has_host = torch.cat([host[k]["has_caption"] for k in captioned]).bool()
            has = rows_of(has_host, img.device)
            tokens_host = torch.cat([host[k]["captions"] for k in captioned])[has_host] if step.host else None
            # a task's first rows are its batch's images (an itm batch's negative images follow them)
            own = torch.cat([img[step.image_rows[k]][:batch[k]["images"].shape[0]] for k in captioned])[has]
            with torch.no_grad():
                cap_base = step.encode_text(ref, tokens[has], tokens_host).float()
                if "v" in self.tower:
                    img_base = ref.encode_image(torch.cat([batch[k]["images"] for k in captioned])[has]).float()
                else:
                    img_base = own.detach()
                scale_base = ref.logit_scale.float().clamp(0, MAX_LOGIT_SCALE).exp()
            caption = (cap[has], cap_base)
            kl = (own, cap[has], step.scale, img_base, cap_base, scale_base)
        mcq = batch.get("mcq")
        if mcq is not None and "option_affirmative" in mcq and self.loss.w["options"] > 0:
            keep_host = host["mcq"]["option_affirmative"].flatten().bool()
            if keep_host.any():
                keep = rows_of(keep_host, img.device)
                opt = step.texts[step.text_rows["mcq"]][keep]
                options_host = host["mcq"]["options"].flatten(0, 1)[keep_host] if step.host else None
                with torch.no_grad():
                    opt_base = step.encode_text(ref, mcq["options"].flatten(0, 1)[keep], options_host).float()
                options = (opt, opt_base)
        return self.loss(caption=caption, options=options, kl=kl, l2sp=self.anchors)
