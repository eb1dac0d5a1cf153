"""CE-CLIP (``ceclip``; Zhang, Awal & Agrawal, CVPR 2024; lezhang7/Enhance-FineGrained): the hard-negative
contrastive loss, a cross-modal rank hinge with adaptive per-type thresholds and an intra-modal contrast, over
four typed hard captions per image (its batch field ``ceclip_slots`` puts each in its type's slot)."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from negft.data import schema
from negft.fields import bounded

from .core import HardNegativeTerm, _flag


class CECLIPLoss(nn.Module):
    """CE-CLIP (Zhang, Awal & Agrawal, CVPR 2024): ``L_hn + cmr_weight·L_cmr + imc_weight·L_imc`` over images v,
    their captions t and each caption's K typed hard negatives n (the reference's data: relation, adjective, noun,
    verb swaps, in that order), all at ``s = logit_scale``. Its authors' code is lezhang7/Enhance-FineGrained
    @ ef87eb7, ``Clip_DALoss`` as its recipe runs it (``--hardnegative --cmr-loss --imc-loss``, thresholds
    ``mean``, weights 0.2 and 0.3, ``--upper-bound 10``).

    - L_hn: CLIP's symmetric InfoNCE with every hard negative appended to the image→text candidates;
    - L_cmr: the cross-modal rank hinge, the mean over the (B, K) pairs of
      ``relu(τ_k + s·v_i·n_ik − s·v_i·t_i)``, a missing negative adding 0. τ (K,), in logits, is the buffer
      ``thresholds``: each call computes its loss with the previous one's τ, then sets τ_k to the global batch's
      mean gap ``s·v·t − s·v·n_k`` over its real type-k pairs, clamped to [0, upper_bound] (the reference's loop
      clamps it, and starts each epoch from 0: zero the buffer for that);
    - L_imc: for each caption, the cross-entropy of its image's logit ``s·v_i·t_i`` among it and the caption's
      similarities to its own negatives ``s·t_i·n_ik``, which pushes a caption away from its negatives in the
      text space: the paper's eq. 3 as we read it, and what the reference's ``get_imc_loss`` is handed and
      documents (the positive logits, the text-text matrix "served as denominator", the target 0) but does not
      compute.

    ``reference_bugs=True`` reproduces the reference where it departs from that (default off):

    - L_imc scores each caption against every negative of the batch with target 0, the first sample's first
      (relation) negative (its issue #15), so it pulls each caption towards one sample's negative;
    - a type with no real negative in the batch makes its τ 0/0 = NaN, which the clamp keeps: the next step's hinge
      and loss are NaN, its gradients finite (each real pair of that type pulls as if it broke the margin:
      ``_trained``), so its amp recipe's GradScaler takes the step, and the τ that step sets from its own batch
      is finite again (measured with the reference's own code: bench/parity/loss-ceclip.md); a type no batch has
      stays NaN (the world's noun on the relcomp split). negft keeps that type's previous τ. Its τ also averages the positives over
      every row but the negatives over the nonzero logits (a real negative orthogonal to its image counts as
      missing); negft averages the gap over the real pairs;
    - missing negatives (its data's ``###`` placeholders) are candidates of L_hn and L_imc; negft masks them out.

    Distributed: the reference's recipe gathers without gradients and has every rank compute the global batch's
    loss through its own rows only, so the ranks' averaged gradient is 1/world_size of one process's. Here, as in
    ``ContrastiveLoss``, each rank scores its own rows against every rank's captions, negatives and images through
    a gather that passes gradients back (open_clip's ``local_loss`` + ``gather_with_grad``), and τ's sums are
    all-reduced, so the averaged gradient and τ equal one process's on the global batch.
    """

    def __init__(self, cmr_weight: float = 0.2, imc_weight: float = 0.3, upper_bound: float = 10.0,
                 n_types: int = 4, reference_bugs: bool = False, rank: int = 0, world_size: int = 1):
        super().__init__()
        self.cmr_weight, self.imc_weight, self.upper_bound = cmr_weight, imc_weight, upper_bound
        self.reference_bugs, self.rank, self.world_size = reference_bugs, rank, world_size
        self.register_buffer("thresholds", torch.zeros(n_types))

    def _gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` in rank order; gradients flow back to the rank that holds each row."""
        if self.world_size == 1:
            return x
        return torch.cat(torch.distributed.nn.all_gather(x))

    def _all_sum(self, x: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            torch.distributed.all_reduce(x)
        return x

    def _hard_negative_clip(self, image, text, flat, flat_mask, logit_scale):
        all_texts, all_negatives, all_images = self._gather(text), self._gather(flat), self._gather(image)
        labels = torch.arange(len(image), device=image.device) + len(image) * self.rank
        per_image = logit_scale * image @ torch.cat([all_texts, all_negatives]).T
        if not self.reference_bugs:
            captions = torch.ones(len(all_texts), dtype=torch.bool, device=image.device)
            real = torch.cat([captions, self._gather(flat_mask.to(flat.dtype)).bool()])
            per_image = per_image.masked_fill(~real, float("-inf"))
        per_text = logit_scale * text @ all_images.T
        return (F.cross_entropy(per_image, labels) + F.cross_entropy(per_text, labels)) / 2

    def _intra_modal(self, text, negatives, flat, negative_mask, positive, logit_scale):
        if self.reference_bugs:
            logits = logit_scale * text @ self._gather(flat).T
        else:
            own = logit_scale * torch.einsum("bd,bkd->bk", text, negatives)
            logits = torch.cat([positive[:, None], own.masked_fill(~negative_mask, float("-inf"))], 1)
        return F.cross_entropy(logits, torch.zeros(len(text), dtype=torch.long, device=text.device))

    @torch.no_grad()
    def _next_thresholds(self, positive, negative, negative_mask):
        """τ_k: the global batch's mean gap s·v·t − s·v·n_k (the reference's, under ``reference_bugs``)."""
        if self.reference_bugs:
            seen = (negative != 0).to(negative.dtype)
            rows = torch.full_like(seen[0], len(positive))
            positives, rows, negatives, seen = self._all_sum(
                torch.stack([positive.sum().expand_as(rows), rows, (negative * seen).sum(0), seen.sum(0)]))
            gap = positives / rows - negatives / seen
        else:
            real = negative_mask.to(negative.dtype)
            gaps, count = self._all_sum(torch.stack([((positive[:, None] - negative) * real).sum(0), real.sum(0)]))
            gap = torch.where(count > 0, gaps / count.clamp(min=1), self.thresholds.to(gaps.dtype))
        return gap.clamp(0, self.upper_bound)

    def forward(self, image, text, negatives, negative_mask, logit_scale):
        """image, text (B, D); negatives (B, K, D), ``negative_mask`` (B, K) bool marking the real ones (a missing
        one is any placeholder row). Returns (total, {hn, cmr, imc}: the unweighted parts, detached) and moves τ."""
        b, k, d = negatives.shape
        if self.thresholds.device != image.device:    # the term is no submodule of the model: its τ moves here
            self.thresholds = self.thresholds.to(image.device)
        flat, flat_mask = negatives.reshape(b * k, d), negative_mask.reshape(b * k)
        positive = logit_scale * (image * text).sum(-1)                                      # (B,)
        negative = logit_scale * torch.einsum("bd,bkd->bk", image, negatives) * negative_mask  # (B, K), 0 if missing
        tau = self.thresholds
        hinge = F.relu(tau + negative - positive[:, None]) * negative_mask
        parts = {
            "hn": self._hard_negative_clip(image, text, flat, flat_mask, logit_scale),
            "cmr": hinge.mean(),
            "imc": self._intra_modal(text, negatives, flat, negative_mask, positive, logit_scale),
        }
        self.thresholds = self._next_thresholds(positive.detach(), negative.detach(), negative_mask)
        gap = (negative - positive[:, None]) * negative_mask
        total = parts["hn"] + self.cmr_weight * self._trained(hinge, tau, gap) + self.imc_weight * parts["imc"]
        return total, {name: value.detach() for name, value in parts.items()}

    def _trained(self, hinge, tau, gap):
        """The hinge term the step trains on. A NaN τ (``reference_bugs``: a type the previous batch lacked) makes the
        reference's hinge and loss NaN, but not its gradients: relu's backward passes the gradient wherever its
        input is not <= 0, NaN included, so each real pair of that type adds the gradient of ``s·v·n − s·v·t``, as
        if it broke the margin, and its amp recipe's GradScaler, which checks the gradients, takes the step. Here
        those pairs enter the total as ``gap`` (``s·v·n − s·v·t``, masked): the reference's gradients, a finite
        stand-in value, so the loop takes the step too; the logged ``cmr`` keeps the reference's NaN."""
        if not self.reference_bugs:
            return hinge.mean()
        return torch.where(tau.isnan(), gap, hinge).mean()


@dataclass
class CECLIPCfg:
    """``loss.ceclip``: CE-CLIP's weights and threshold bound, its recipe by default."""
    cmr_weight: float = bounded(0.2, lo=0.0, fix="must be >= 0", doc="the weight of the cross-modal rank hinge")
    imc_weight: float = bounded(0.3, lo=0.0, fix="must be >= 0", doc="the weight of the intra-modal contrast")
    upper_bound: float = bounded(10.0, lo=0.0, fix="must be >= 0", doc="the adaptive thresholds' upper bound")
    reference_bugs: bool = _flag("the reference's behaviour (Clip_DALoss): the intra-modal target at the first "
                                 "sample's negative; a NaN threshold after a batch without a negative of its type "
                                 "(the next step's logged hinge NaN, its gradients the reference's, the threshold "
                                 "finite again after it); its thresholds' "
                                 "means (the positives over every row, the negatives over the nonzero logits); "
                                 "missing negatives as candidates")


# a relcomp kind -> its CE-CLIP type (schema.CECLIP_TYPES): the converted ceclip-coco data's kinds are the types;
# the world's three each take a type of their own, so each keeps its own threshold as CE-CLIP's types do: subject
# and object exchanged is CE-CLIP's relation swap (which exchanges the caption's first two nouns), a colour
# replaced its adjective swap, the opposite predicate its verb swap (the word relating the two objects replaced)
CECLIP_TYPE_OF = {**{t: t for t in schema.CECLIP_TYPES}, "exchange": "relation", "attribute": "adjective",
                  "predicate": "verb"}


def ceclip_slots(metas: list[dict], tokenize=None) -> torch.Tensor:
    """(B, T) long, T = len(schema.CECLIP_TYPES) = schema.MAX_NEGATIVES: for each CE-CLIP type, the position in
    the batch's ``negatives`` of the sample's negative of that type, so that the term puts each negative in its
    type's slot with a gather on the device (positions no longer mean types where a release's missing negatives are
    left out). A negative whose kind has no type (another dataset's: NegCLIP's ``swap``) or repeats one takes the
    first free type, in order; the types left free get the padding positions, which the mask leaves out."""
    rows = []
    for meta in metas:
        kinds = [n.get("kind") for n in meta[schema.RELCOMP]["negatives"]]
        slots: list[int | None] = [None] * len(schema.CECLIP_TYPES)
        others = []
        for k, kind in enumerate(kinds):
            t = CECLIP_TYPE_OF.get(kind)
            t = None if t is None else schema.CECLIP_TYPES.index(t)
            if t is not None and slots[t] is None:
                slots[t] = k
            else:
                others.append(k)
        free = iter([*others, *range(len(kinds), schema.MAX_NEGATIVES)])
        rows.append([next(free) if k is None else k for k in slots])
    return torch.tensor(rows, dtype=torch.long)


class CECLIP(HardNegativeTerm):
    """``ceclip``: CE-CLIP's hard-negative CLIP loss + the rank hinge with per-type adaptive thresholds + the
    intra-modal contrast (CECLIPLoss) over each image's caption and its typed hard captions (the stream's
    ``negatives``, each placed in its type's slot by the batch field ``ceclip_slots``, a missing type masked). The
    thresholds live in the loss object: they start at 0 with the run (the reference also resets them at each epoch)
    and are kept in checkpoints, so a resumed run goes on with them as the uninterrupted one does."""
    name = block = "ceclip"
    Settings = CECLIPCfg

    def __init__(self, settings, rank: int = 0, world_size: int = 1):
        super().__init__(settings)
        c = settings
        self.loss = CECLIPLoss(c.cmr_weight, c.imc_weight, c.upper_bound, len(schema.CECLIP_TYPES),
                               c.reference_bugs, rank, world_size)

    def fields(self, task):
        return {ceclip_slots.__name__: ceclip_slots} if task == "itm" else {}

    def state(self):
        return {"thresholds": self.loss.thresholds}

    def load_state(self, state):
        self.loss.thresholds.copy_(state["thresholds"])

    def forward(self, step):
        itm, slots = step.features["itm"], step.batch["itm"][ceclip_slots.__name__]
        negatives = itm["negatives"].gather(1, slots[..., None].expand(-1, -1, itm["negatives"].shape[-1]))
        return self.loss(itm["image"], itm["positive"], negatives, itm["negative_mask"].gather(1, slots), step.scale)
