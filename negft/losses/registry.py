"""The registry of objectives: each ``loss.name`` and its terms (``OBJECTIVES``), the ``loss`` schema built from
the terms' settings (``LossCfg``), and what the rest of negft asks of them: the terms to build, their settings'
errors and off values, the batch fields a stream carries."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

import torch

from negft.fields import field_errors

from .ceclip import CECLIP
from .conclip import CoNCLIP
from .core import Contrastive, Term
from .fscclip import FSCCLIP
from .guard import Guard
from .negbench import (MCQ, HardNegativesSettings, MCQSettings, NegCapHardNegatives, NegFull, NegFullSettings,
                       TextToImage, TextToImageOptions, TextToImageOptionsSettings, TextToImageSettings)
from .negclip import NegCLIP
from .relcomp import RelComp
from .tripletclip import TripletCLIP


@dataclass(frozen=True)
class Objective:
    """A ``loss.name``: its terms, summed in order; the first is its own loss (its ``reads`` and ``needs`` are the
    objective's: the stream tasks a recipe may have and must have), the others add to it. Every objective takes
    negft's drift guard (off unless a ``loss.guard`` weight is set: the baselines train as their authors' code), so
    that each baseline can be run with it (experiments/comparison.py's arms)."""
    name: str
    terms: tuple[type[Term], ...]

    @property
    def reads(self) -> tuple[str, ...]:
        return self.terms[0].reads

    @property
    def needs(self) -> tuple[str, ...]:
        return self.terms[0].needs

    def blocks(self) -> tuple[str, ...]:
        """Every block of ``loss`` it reads: its own (``loss.<name>``, where its terms' settings sit) and its
        terms' own blocks."""
        own = (self.name,) if any(t.Settings and not t.block for t in self.terms) else ()
        return own + tuple(t.block for t in self.terms if t.block)


OBJECTIVES: dict[str, Objective] = {o.name: o for o in (
    Objective("clip", (Contrastive, Guard)),
    Objective("mcq", (MCQ, TextToImage, TextToImageOptions, Guard)),
    Objective("negfull", (NegFull, TextToImage, TextToImageOptions, NegCapHardNegatives, Guard)),
    Objective("relcomp", (RelComp, Guard)),
    Objective("negclip", (NegCLIP, Guard)),
    Objective("conclip", (CoNCLIP, Guard)),
    Objective("tripletclip", (TripletCLIP, Guard)),
    Objective("fscclip", (FSCCLIP, Guard)),
    Objective("ceclip", (CECLIP, Guard)),
)}


# The settings of an objective's block are those of its terms that have no block of their own, one dataclass that
# is each of theirs (a dataclass lists its bases' fields from the last base to the first: the terms' order reversed).
@dataclass
class MCQCfg(TextToImageOptionsSettings, TextToImageSettings, MCQSettings):
    """``loss.mcq``: the settings of MCQ, TextToImage and TextToImageOptions."""


@dataclass
class NegFullCfg(HardNegativesSettings, TextToImageOptionsSettings, TextToImageSettings, NegFullSettings):
    """``loss.negfull``: the settings of NegFull, TextToImage, TextToImageOptions and NegCapHardNegatives."""


def _block_terms() -> dict[str, tuple[type[Term], ...]]:
    """block -> the terms whose settings it holds: the objectives' blocks, then the terms' own."""
    blocks: dict[str, tuple] = {o.name: tuple(t for t in o.terms if t.Settings and not t.block)
                                for o in OBJECTIVES.values() if o.name in o.blocks()}
    for o in OBJECTIVES.values():
        blocks.update({t.block: (t,) for t in o.terms if t.block})
    return blocks


BLOCKS = _block_terms()


def _with_single_term_blocks(cls: type) -> type:
    """``cls`` made a dataclass with, after the blocks it writes (each joining several terms' settings), one block
    for each other block of BLOCKS, its one term's ``Settings``: a term with settings of its own (a baseline's)
    needs no line here but its objective's."""
    for block, terms in BLOCKS.items():
        if block in cls.__annotations__:
            continue
        if len(terms) != 1:
            raise TypeError(f"loss.{block} joins the settings of {', '.join(t.__name__ for t in terms)}: write its "
                            f"dataclass (as MCQCfg) and its field in {cls.__name__}")
        cls.__annotations__[block] = terms[0].Settings
        setattr(cls, block, field(default_factory=terms[0].Settings))
    return dataclass(cls)


@_with_single_term_blocks
class LossCfg:
    """``loss``: the objective (``name``, a key of OBJECTIVES; default clip: plain contrastive fine-tuning, what a
    recipe of caption streams alone means) and one block per objective or term that has settings (those of one
    term's settings added by ``_with_single_term_blocks``: relcomp, tripletclip, fscclip, ceclip, guard); a block
    the chosen objective does not read may not be set."""
    name: str = "clip"
    mcq: MCQCfg = field(default_factory=MCQCfg)
    negfull: NegFullCfg = field(default_factory=NegFullCfg)


BLOCK_CFGS = {f.name: f.default_factory for f in dataclasses.fields(LossCfg) if f.name != "name"}


def _check_blocks() -> None:
    """Each block of LossCfg holds exactly its terms' settings, in their order (a term added to an objective
    without its Settings among the block's bases fails here, at import)."""
    assert list(BLOCK_CFGS) == list(BLOCKS), f"LossCfg's blocks {list(BLOCK_CFGS)} are not {list(BLOCKS)}"
    for block, terms in BLOCKS.items():
        want = [f.name for t in terms for f in dataclasses.fields(t.Settings)]
        have = [f.name for f in dataclasses.fields(BLOCK_CFGS[block])]
        assert have == want, f"loss.{block}: {BLOCK_CFGS[block].__name__} has {have}, its terms declare {want}"


_check_blocks()


def off_values(block: str) -> dict:
    """key -> the value at which it turns its term off (or leaves NegBench's loss as it is), for ``loss.<block>``'s
    keys that have one (the terms' ``off``)."""
    return {k: v for t in BLOCKS.get(block, ()) for k, v in t.off.items()}


def setting_errors(loss_cfg) -> list[str]:
    """Each ``loss`` value outside its range (the fields' ``negft.fields.bounded``), named with the key and a value
    that would do."""
    return field_errors(loss_cfg, "loss.")


def build_terms(loss_cfg, rank: int = 0, world_size: int = 1) -> list[Term]:
    """The ``loss.name`` objective's terms that are on, in summing order, given their settings."""
    objective = OBJECTIVES[loss_cfg.name]
    terms = []
    for t in objective.terms:
        settings = getattr(loss_cfg, t.block or objective.name) if t.Settings else None
        terms.append(t(settings, rank, world_size))
    return [t for t in terms if t.on()]


BY_IMAGE = {f for o in OBJECTIVES.values() for t in o.terms for f in t.by_image}


def join_field(key: str, parts: list[torch.Tensor]) -> torch.Tensor:
    """One field of several streams' batches that share a task: stacked, but block-diagonal for a field indexed
    by the batch's images (``Term.by_image``: ``answer_truth`` (M, M), ``option_truth`` (M·C, M),
    ``negcap_hard_negatives`` (M, M)), false off the diagonal blocks: a question is true of no image of another
    stream's batch, and no such image is a caption's hard negative."""
    if isinstance(parts[0], dict):      # the batches' host copies (HOST), joined alike
        return {k: join_field(k, [p[k] for p in parts]) for k in parts[0]}
    return torch.block_diag(*parts) if key in BY_IMAGE else torch.cat(parts)


def batch_fields(loss_cfg, task: str) -> dict[str, Callable]:
    """The batch fields a stream of ``task`` carries for the objective's terms (name -> its function)."""
    out = {}
    for term in build_terms(loss_cfg):
        out.update(term.fields(task))
    return out
