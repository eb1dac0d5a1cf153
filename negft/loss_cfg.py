"""The settings of the loss terms (``loss.*``): one plain dataclass per term or objective block, each field with its
default, one-line doc and range (``negft.fields``), and ``LossCfg``, the ``loss`` block of a recipe. Apart from the
terms themselves (``negft.losses``, which imports torch), so that reading a recipe's keys (``train.py --help``,
``negft.config.Config``) needs no torch; ``negft.losses`` checks at import that each block holds its terms'
settings."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from negft.fields import bounded, choice


def weight(doc: str) -> Any:
    """A term's weight: >= 0, 0 = off (the default)."""
    return bounded(0.0, lo=0.0, fix="must be >= 0 (0: off)", doc=doc)


def _flag(doc: str) -> Any:
    """A switch, off by default."""
    return choice(False, (False, True), doc=doc)


def _negation_weight() -> Any:
    return bounded(1.0, lo=0.0, fix="must be >= 0 (1: NegBench's unweighted mean)",
                   doc="the weight of negation-type questions (the right answer negates: NegBench's ``negative`` "
                       "template) in the MCQ loss, the others' 1 (a weighted mean); 1 = NegBench's unweighted mean")


@dataclass
class MCQSettings:
    negation_weight: float = _negation_weight()


@dataclass
class NegFullSettings:
    alpha: float = bounded(0.5, lo=0.0, hi=1.0, fix="must lie in [0, 1] (the weight of the contrastive loss)",
                           doc="α, the weight of the contrastive loss")
    negation_weight: float = _negation_weight()     # as loss.mcq.negation_weight


@dataclass
class RelCompCfg:
    """``loss.relcomp``: the settings of RelComp, the relcomp objective's one term."""
    margin: float = bounded(0.2, lo=0.0, fix="must be >= 0", doc="m, the triplet loss's margin")
    w_itm: float = bounded(1.0, lo=0.0, fix="must be >= 0", doc="the weight of the ITM triplet loss")
    w_clip: float = bounded(1.0, lo=0.0, fix="must be >= 0", doc="the weight of the contrastive loss")


@dataclass
class TextToImageSettings:
    t2i: float = weight("negft's text→image MCQ term (TextToImageMCQLoss), added with this weight: each MCQ's right "
                        "answer picks, among the step's MCQ images, one it is true of (the samples' object labels "
                        "say which); 0 = off")


@dataclass
class TextToImageOptionsSettings:
    t2i_options: float = weight("the same term over every option, the wrong ones too (\"a cat but no dog\" picks an "
                                "image with a cat and without a dog): needs each option's [affirmed, negated] "
                                "objects (``mcq.option_objects``, which ``negft data negate`` and the world write; "
                                "NegBench's CSVs do not have them, and such rows add 0); 0 = off")


@dataclass
class HardNegativesSettings:
    hard_negatives: float = weight("negft's NegCap hard-negative term (HardNegativeLoss), added with this weight: "
                                   "each NegCap caption against its own image and the step's images that hold an "
                                   "object it negates (the samples' object labels say which; unlabelled data has "
                                   "none); 0 = off")


@dataclass
class TripletCLIPCfg:
    """``loss.tripletclip``: how its two NegCLIP terms are combined."""
    reference_sum: bool = _flag("the reference's sum of its two terms (false: their mean, the paper's; the sum "
                                "doubles the loss and its gradients)")


@dataclass
class CECLIPCfg:
    """``loss.ceclip``: CE-CLIP's weights and threshold bound, its recipe by default."""
    cmr_weight: float = bounded(0.2, lo=0.0, fix="must be >= 0", doc="the weight of the cross-modal rank hinge")
    imc_weight: float = bounded(0.3, lo=0.0, fix="must be >= 0", doc="the weight of the intra-modal contrast")
    upper_bound: float = bounded(10.0, lo=0.0, fix="must be >= 0", doc="the adaptive thresholds' upper bound")
    reference_bugs: bool = _flag("the reference's behaviour (Clip_DALoss): the intra-modal target at the first sample's "
                                 "negative, a NaN threshold after a batch without a negative of its type, missing "
                                 "negatives as candidates")


@dataclass
class FSCCLIPCfg:
    """``loss.fscclip``: FSC-CLIP's weights and calibrations, the paper's COCO ViT-B/32 recipe by default."""
    w_global: float = bounded(0.5, lo=0.0, fix="must be >= 0 (its CC3M recipe: 1.0)",
                              doc="the weight of the global focal hard-negative loss")
    w_local: float = bounded(0.2, lo=0.0, fix="must be >= 0 (0: off; its ViT-B/16 and L/14 recipes: 0.5)",
                             doc="the weight of the local token-patch hard-negative loss (needs a ViT image tower)")
    gamma: float = bounded(2.0, lo=0.0, fix="must be >= 0 (0: cross-entropy)", doc="the focal loss's γ")
    smoothing: float = bounded(0.02, lo=0.0, hi=1.0, fix="must lie in [0, 1)", doc="label smoothing ε")
    zero_fill_missing: bool = _flag("the reference's handling of a missing negative: a zero feature whose logit 0 "
                                    "stays in the softmax (false: left out, the paper's intent)")


@dataclass
class GuardCfg:
    """negft's drift guard (DriftGuard), a term the clip, mcq and negfull objectives add to their loss when any
    weight is > 0; every weight 0 = off (NegBench's recipes, bit-identical training)."""
    caption: float = weight("w · mean(1 − cos(f_θ, f_base)) on the affirmative captions of the step's images")
    options: float = weight("the same on the step's affirmative MCQ options")
    kl: float = weight("KL(p_base ‖ p_θ) of each image's softmax over the step's affirmative captions")
    l2sp: float = weight("w · Σ ‖θ − θ_base‖² over the trained weights")


# The settings of an objective's block are those of its terms that have no block of their own, one dataclass that
# is each of theirs (a dataclass lists its bases' fields from the last base to the first: the terms' order reversed).
@dataclass
class MCQCfg(TextToImageOptionsSettings, TextToImageSettings, MCQSettings):
    """``loss.mcq``: the settings of MCQ, TextToImage and TextToImageOptions."""


@dataclass
class NegFullCfg(HardNegativesSettings, TextToImageOptionsSettings, TextToImageSettings, NegFullSettings):
    """``loss.negfull``: the settings of NegFull, TextToImage, TextToImageOptions and NegCapHardNegatives."""


@dataclass
class LossCfg:
    """``loss``: the objective (``name``, a key of OBJECTIVES; default clip: plain contrastive fine-tuning, what a
    recipe of caption streams alone means) and one block per objective or term that has settings; a block the
    chosen objective does not read may not be set."""
    name: str = "clip"
    mcq: MCQCfg = field(default_factory=MCQCfg)
    negfull: NegFullCfg = field(default_factory=NegFullCfg)
    relcomp: RelCompCfg = field(default_factory=RelCompCfg)
    tripletclip: TripletCLIPCfg = field(default_factory=TripletCLIPCfg)
    fscclip: FSCCLIPCfg = field(default_factory=FSCCLIPCfg)
    ceclip: CECLIPCfg = field(default_factory=CECLIPCfg)
    guard: GuardCfg = field(default_factory=GuardCfg)
