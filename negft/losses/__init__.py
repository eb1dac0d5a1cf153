"""Training losses as components: an objective (``loss.name``) is a list of terms, summed.

Each term is one class (open_clip's ``loss.py`` for the losses, torchtune's components for the terms) that declares

- its settings: a plain dataclass ``Settings``, whose keys sit in the block of each objective that lists the
  term (``loss.negfull.t2i``), or in a block of the term's own (``block``: ``loss.guard.*``), each field with its
  range and doc (``negft.fields.bounded``, which ``negft.config`` checks: a bad key or value exits 2 naming it),
  and the values that turn it off (``off``); an objective's block that joins several terms' settings
  (``NegFullCfg``, ``MCQCfg``) is a dataclass that is each of them, and ``LossCfg``, the ``loss`` schema, holds
  the blocks;
- the batch fields it needs on a stream of each task (``fields``): name → a function of the batch's samples'
  json, which the data pipeline calls to add the field to that stream's batches;
- its ``forward(step) -> (weighted value or None, {log key: unweighted value})``.

``negft.train.task.Task`` encodes each step once and sums its objective's terms (``OBJECTIVES``), in order; a
term whose weight is 0 is off (not built, no field asked), so it trains bit-identically to the objective
without it. The world base's cache key hashes the ``loss`` blocks its objective reads. The package imports
nothing from the rest of negft but the shard schema and ``negft.fields``: ``negft.config`` asks it for the
schema, ``negft.train.task`` for the terms.

The modules:

- ``core``: ``Step``, ``Term``, ``WeightedTerm``, ``HardNegativeTerm`` (the baselines' base over an ``itm``
  stream), the contrastive loss and its term (``clip``), gathering across ranks, ``rows_of``;
- ``batch``: the batch fields, functions of the samples' json;
- one module per method family, its losses, terms and settings together: ``negbench`` (``mcq``, ``negfull`` and
  negft's terms added to them), ``relcomp``, ``negclip``, ``conclip``, ``tripletclip``, ``fscclip``, ``ceclip``,
  ``guard`` (negft's drift guard);
- ``registry``: the objectives (``OBJECTIVES``), the ``loss`` schema (``LossCfg``) and what negft asks of them
  (``build_terms``, ``batch_fields``, ``setting_errors``, ``off_values``, ``join_field``).

**A new baseline is one file and one registry line.** Write ``negft/losses/<method>.py`` with its loss (an
``nn.Module``), its settings (a dataclass of ``bounded``/``choice`` fields, if it has any) and its term, a
``HardNegativeTerm`` (an ``itm`` stream) or a ``Term``, with ``name = block = "<method>"`` and ``Settings`` set
(see ``fscclip``); then add ``Objective("<method>", (<Term>,))`` to ``registry.OBJECTIVES``. Its block
``loss.<method>`` joins ``LossCfg`` by itself; its validation, its streams' fields and the world base's cache key
follow from the class. Import its names from its module (``negft.losses.<method>``): this package re-exports the
names it had as one module, so that every import of them keeps working.
"""
from .core import (HOST, MAX_LOGIT_SCALE, TEXT_FIELDS, Contrastive, ContrastiveLoss, HardNegativeTerm, Step, Term,
                   WeightedTerm, gather_rows, rows_of, weight)  # noqa: F401
from .batch import (answer_truth, caption_tokens, hard_caption, has_caption, negative_image_caption,
                    negative_image_captioned, negative_image_hard_caption, negative_image_hard_captioned,
                    negcap_hard_negatives, option_affirmative, option_truth, question_weights)  # noqa: F401
from .negbench import (MCQ, HardNegativeLoss, HardNegativesSettings, MCQLoss, MCQSettings, NegCapHardNegatives,
                       NegFull, NegFullLoss, NegFullSettings, TextToImage, TextToImageMCQLoss, TextToImageOptions,
                       TextToImageOptionsSettings, TextToImageSettings)  # noqa: F401
from .relcomp import ITMTripletLoss, RelComp, RelCompCfg, RelCompLoss  # noqa: F401
from .negclip import NegCLIP, NegCLIPLoss  # noqa: F401
from .conclip import CoNCLIP, CoNCLIPLoss  # noqa: F401
from .tripletclip import TripletCLIP, TripletCLIPCfg, TripletCLIPLoss  # noqa: F401
from .fscclip import FSCCLIP, FocalHardNegativeLoss, FSCCLIPCfg, FSCCLIPLoss, TokenPatchHardNegativeLoss  # noqa: F401
from .ceclip import CECLIP, CECLIP_TYPE_OF, CECLIPCfg, CECLIPLoss, ceclip_slots  # noqa: F401
from .guard import CAPTIONED_TASKS, DriftGuard, Guard, GuardCfg, frozen_reference  # noqa: F401
from .registry import (BLOCK_CFGS, BLOCKS, BY_IMAGE, OBJECTIVES, LossCfg, MCQCfg, NegFullCfg, Objective,
                       batch_fields, build_terms, join_field, off_values, setting_errors)  # noqa: F401
