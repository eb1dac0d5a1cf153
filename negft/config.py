"""Recipe schema, YAML recipes and ``key=value`` overrides.

The dataclasses below are the one place recipe keys are defined (the ``loss`` keys: each loss term's
settings, in ``negft/losses/``). A recipe YAML is merged over them, then the command-line overrides; anything unknown or out of range is a ``ConfigError``,
which the entry points turn into exit status 2 before writing anything.
"""
from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from negft.fields import bounded, choice, items, leaves, value_error

RECIPES = Path(__file__).resolve().parent / "recipes"      # package data: an installed negft has its recipes
LOCAL_DIR = "local-dir:"           # open_clip's prefix of a checkpoint directory as a weights source
HF_HUB = "hf-hub:"                 # open_clip's prefix of a Hugging Face Hub model repository (config + weights)
TOWERS = ("v", "t", "vt")
WORLD_SIZES = ("tiny", "demo", "full")     # negft.world.generator.SIZES
# the kinds of batch a stream yields, in the order the training step encodes them (negft.train.task), and the
# text fields each reads
STREAM_TASKS = ("contrastive", "mcq", "itm")
# (an itm stream may read NegMCQ's questions: the right answer its caption, the other options its hard negatives,
# so that a baseline's loss trains on negft's data: negft.data.pipeline.mcq_as_relcomp)
TASK_FIELDS = dict(zip(STREAM_TASKS, (("caption", "negcap"), ("mcq",), ("relcomp", "mcq"))))
_NOTHING = "trains nothing; to evaluate a model without training it, run eval.py ckpt=..."


class ConfigError(ValueError):
    """A bad recipe key or value; the message names it and says what would fix it."""


@dataclass
class LoraCfg:
    """LoRA adapters on the text tower (peft; negft/lora.py): with rank > 0 only they (and logit_scale, as
    model.train_logit_scale says) train; every checkpoint holds the merged plain open_clip weights."""
    rank: int = bounded(0, lo=0, fix="must be >= 0 (0: no adapters, 8 a usual rank)",
                        doc="0 = off: the text tower trains as tower / lock_text_unlocked_layers say")
    alpha: float = 16.0                # the adapter's delta is scaled by alpha / rank
    dropout: float = 0.0               # dropout on the adapter's input (training only)
    # name suffixes of the nn.Linear modules in open_clip's text transformer that get adapters; its attention
    # (nn.MultiheadAttention) cannot take one without changing the frozen weights (negft/lora.py, targets)
    targets: List[str] = field(default_factory=lambda: ["mlp.c_fc", "mlp.c_proj"])


@dataclass
class ModelCfg:
    arch: str = "ViT-B-32"             # open_clip architecture name
    pretrained: str = "openai"         # open_clip tag, checkpoint file, local-dir:DIR, or "" for random
    world_arch: str = "negft-tiny-rn"  # architecture used when data=world (README: Models)
    world_pretrained: str = "world-pretrain"  # world base: a recipe name or .yaml (result cached), a local-dir or a file
    train_logit_scale: bool = True     # whether logit_scale is trained (explicit, not a side effect)
    # open_clip_train's --lock-text-unlocked-layers: null = the whole text tower trains (where `tower` has t);
    # N = only the last N of open_clip's text groups train (embeddings, each block but the last, the last
    # block with ln_final, the projection; open_clip.transformer.lock_text_tower)
    lock_text_unlocked_layers: Optional[int] = bounded(None, lo=0, fix="must be >= 0, or null for the whole text "
                                                                     "tower (3: its last three groups)")
    # parameters that stay frozen whatever `tower` trains: names or module prefixes of the model's parameters
    # (NegationCLIP freezes [ln_final] with the image tower); a name that matches none is an error
    frozen: List[str] = field(default_factory=list)
    # open_clip's random-resized-crop training transform: null = on for real data, off for the world
    # (its scenes already vary, and its objects sit on the tiny ViT's patch grid)
    train_augment: Optional[bool] = None
    # the MLP activation: true = QuickGELU (OpenAI's and LAION-400M's weights), false = GELU, null = as the
    # weights' record says (tag, local-dir config); a bare file that records nothing is refused (models.build)
    quick_gelu: Optional[bool] = None
    # the running statistics of a training tower's batch norms: false = each batch updates them (PyTorch's training
    # mode, open_clip_train's); true = they stay as loaded and normalise every batch, as at evaluation (the norms'
    # weights still train). CLIP's ViTs have no batch norm; the world's conv base (negft-tiny-rn) has, and on its
    # relcomp split the statistics alone cost 16 points of zero-shot: the baselines' world blocks keep them
    freeze_norm_stats: bool = False
    lora: LoraCfg = field(default_factory=LoraCfg)


@dataclass
class StreamCfg:
    """One dataset drawn from every step, with its own batch size."""
    task: str = choice("contrastive", STREAM_TASKS, doc="contrastive | mcq | itm (RelComp, or NegMCQ's options)")
    field: str = choice("caption", ("caption", "negcap", "mcq", "relcomp"), doc="text source")
    manifest: str = ""                 # negft/data_manifests/<manifest>.yaml, for data=real
    urls: str = ""                     # explicit shard spec (brace pattern or pipe:), overrides manifest
    world_split: str = choice("finetune", ("pretrain", "finetune", "relcomp", "ccneg", "negclip", "ceclip",
                                           "tripletclip", "tripletclip_pretrain"),
                              doc="world shards used when data=world (negft/world/generator.py, the splits)")
    batch_size: int = bounded(64, lo=1, fix="must be >= 1 (samples per rank and step)", doc="per rank")
    # an itm stream's hard captions drawn anew from each sample's caption every time it is read, by this method's
    # generator (negft/convert/negatives.py, Redraw: seeded by seed, epoch and sample; on real data it needs
    # `pip install 'negft[negatives]'`); none: the shards' own. fscclip: FSC-CLIP's --add-random-text-hard-negatives
    redraw_negatives: str = choice("none", ("none", "negclip", "fscclip", "ceclip"),
                                   doc="hard captions drawn each epoch by this generator (none: the shards' own)")


def _loss_defaults():
    """``loss`` at its defaults: ``negft.losses.LossCfg``, made from the terms' own settings (the one place the
    loss keys are defined; imported here when first needed, since it imports torch and open_clip)."""
    from negft.losses import LossCfg
    return LossCfg()


@dataclass
class OptimCfg:
    lr: float = bounded(1e-5, lo=0.0, fix="a learning rate must be >= 0 (optim.lr=1e-5 is a usual fine-tuning rate)")
    weight_decay: float = bounded(0.1, lo=0.0)
    beta1: float = bounded(0.9, lo=0.0, hi=1.0)
    beta2: float = bounded(0.98, lo=0.0, hi=1.0)
    eps: float = bounded(1e-6, lo=0.0)
    warmup_steps: int = bounded(50, lo=0)
    grad_clip: float = bounded(1.0, lo=0.0, fix="must be >= 0 (0: no clipping)")
    # the schedule: linear warm-up over warmup_steps, then a cosine to lr·min_lr_ratio; 1 = a constant rate after the
    # warm-up (with warmup_steps 0: constant throughout, as a bare torch AdamW without a scheduler runs)
    min_lr_ratio: float = bounded(0.0, lo=0.0, hi=1.0, fix="must lie in [0, 1] (the cosine schedule's last lr over "
                                                           "optim.lr; 1: constant)",
                                  doc="cosine decays to lr·min_lr_ratio (1: constant)")
    # weight decay on every parameter, gains, biases and logit_scale included, as a bare torch AdamW over
    # model.parameters() decays them (CoN-CLIP's, NegationCLIP's and TripletCLIP's code); false: open_clip's rule,
    # which leaves them out (open_clip_train; NegCLIP's, FSC-CLIP's and CE-CLIP's forks)
    decay_all: bool = False
    # the embeddings' learning rate over optim.lr (token, positional and class embeddings: open_clip's
    # token_embedding, positional_embedding, class_embedding): below 1, the rare negation words' rows move
    # less than the blocks above them
    embedding_lr_scale: float = bounded(1.0, lo=0.0, fix="must be >= 0 (1: the embeddings learn at optim.lr, 0: "
                                                         "frozen in effect)")


@dataclass
class TrainCfg:
    precision: str = choice("fp32", ("fp32", "bf16", "fp16"))
    zero_stage: int = choice(0, (0, 1, 2, 3))
    grad_accum: int = bounded(1, lo=1)
    workers: int = bounded(1, lo=0, fix="must be >= 0 (0: load data in the training process)",
                           doc="data loader workers per rank")
    log_every: int = bounded(10, lo=1)
    steps_per_epoch: Optional[int] = bounded(None, lo=1, fix="must be >= 1, or null for one pass over the first "
                                                             "stream", doc="None: one pass over the epoch stream")
    # the stream whose one pass is an epoch and whose batch size is DeepSpeed's micro-batch ("" = the first
    # stream in the recipe)
    epoch_stream: str = ""
    checkpoint_every: int = bounded(0, lo=0, fix="must be >= 0 (0: checkpoints at epoch ends only)",
                                    doc="optimizer steps between mid-epoch checkpoints (0: epoch ends only)")
    resampled: bool = False            # draw shards with replacement (webdataset ResampledShards), not exact passes
    grad_checkpointing: bool = False   # recompute activations in backward (open_clip's set_grad_checkpointing)
    # bf16 as torch.autocast over fp32 weights and optimizer (open_clip's amp_bf16); false: DeepSpeed casts the
    # weights to bf16 and keeps fp32 master copies (its bf16 optimizer: less memory per rank under ZeRO-1/2)
    autocast: bool = True
    compile: bool = False              # torch.compile the model and loss (minutes of compiling on the first steps)
    max_bad_steps: int = bounded(10, lo=1, doc="stop after this many optimizer steps in a row skipped as non-finite")
    # stop after an epoch in which a stream left out more than this share of its data: skipped samples among
    # those read plus unreadable shards among those opened (negft/data/pipeline.py, Tally.fraction)
    max_skipped: float = bounded(0.01, lo=0.0, hi=1.0, fix="must lie in [0, 1]: the share of a stream's data an "
                                                          "epoch may skip (0.01 = 1%)")
    # seconds a collective (all-reduce, barrier) waits for the other ranks before it fails: a rank that died or
    # hung then stops the run instead of leaving the others waiting. null: $DEEPSPEED_TIMEOUT (minutes, DeepSpeed's
    # variable) where set, else 600 (DeepSpeed's default); a value set here wins over the variable
    dist_timeout_s: Optional[float] = bounded(None, lo=1.0, fix="must be >= 1 (seconds a collective waits for the "
                                                                "other ranks), or null for $DEEPSPEED_TIMEOUT's "
                                                                "minutes, else 600")
    # random images and tokens of the streams' shapes made on the device, no shards and no evaluation: measures
    # the step and tests a cluster (bench/throughput.py)
    synthetic: bool = False


@dataclass
class EvalCfg:
    suite: str = "default"             # default | all | comma-separated probe names
    batch_size: int = bounded(256, lo=1)
    bootstrap: int = bounded(1000, lo=1, fix="must be >= 1 (resamples for the 95% intervals)")
    every: int = bounded(1, lo=1, doc="evaluate every N epochs (epoch 0 always)")
    split: str = choice("test", ("val", "test"), doc="world probe split")


DEFAULT_DRIFT = ("zeroshot/imagenet/top1", "zeroshot/imagenetv2/top1", "zeroshot/world/top1", "retrieval/*/r5")


@dataclass
class PatchCfg:
    """Weight patching (negft patch and per-epoch): θ(α) = (1 − α)·θ_base + α·θ_ft, α the fine-tuned weight."""
    alpha: Optional[float] = bounded(None, lo=0.0, hi=1.0, fix="it must lie in [0, 1] (the weight of the fine-tuned "
                                                               "model)", doc="also evaluate the model patched at this "
                                                                             "α after every epoch")
    tower: str = choice("vt", TOWERS, doc="the keys that per-epoch patch moves")
    # the selection rule of `negft patch`: largest mean gain in `targets` whose drop in every `drift`
    # metric is at most `max_drift`, decided on the val split (`*` matches the dataset); report.md's drift lines
    # are the `drift` metrics. Zero-shot drift is ImageNet's (and the world's) by default: name others, such as
    # CLIP_benchmark's suite (`zeroshot/*/top1` is every zero-shot set evaluated), to hold them too
    targets: List[str] = field(default_factory=lambda: ["mcq_neg/*/acc"])
    drift: List[str] = field(default_factory=lambda: list(DEFAULT_DRIFT))
    max_drift: float = bounded(0.03, lo=0.0)
    # after training: sweep the last epoch toward the base (into patch/) and release the choice (release/)
    sweep: bool = False
    alphas: str = "0:1:0.1"
    towers: str = "v,t,vt"


@dataclass
class WorldCfg:
    seed: int = 0
    size: str = choice("demo", WORLD_SIZES)
    cache: str = ""                    # default $NEGFT_CACHE or ~/.cache/negft


@dataclass
class LogCfg:
    """Where a run's scalars go besides TensorBoard (rank 0 only)."""
    # also to a Weights & Biases run (pip install negft[wandb]): the same scalars, the ledger lines, the figures
    # and the resolved recipe; offline (synced later with `wandb sync`) where no API key is at hand
    wandb: bool = False
    wandb_project: str = "negft"
    wandb_entity: Optional[str] = None
    wandb_name: str = ""               # "" = the run directory's name


@dataclass
class Config:
    recipe: str = "demo"
    out: str = ""                      # run directory; default runs/<recipe>
    epochs: int = bounded(1, lo=1, fix=f"must be >= 1 (epochs=0 {_NOTHING})")
    max_steps: Optional[int] = bounded(None, lo=1, fix=f"must be >= 1, or null for no cap (max_steps=0 {_NOTHING})",
                                       doc="stop after this many optimizer steps in all")
    seed: int = 0
    tower: str = choice("vt", TOWERS, doc="which towers train")
    # latest: the newest complete checkpoint in out | auto: that where out holds this run (its recipe and settings),
    # else a new run (one command line for the first launch and every requeue) | a checkpoint directory
    resume: Optional[str] = None
    # a non-empty out is resumed (resume=) or refused, never overwritten silently; overwrite=true replaces the run
    # there (its files only: a folder holding others is refused)
    overwrite: bool = choice(False, (False, True), doc="true: replace the run in out (without it a non-empty out is "
                                                      "refused unless resume= continues it)")
    # SMOKE's settings wherever the command line does not set them
    smoke: bool = choice(False, (False, True), doc="true: two small steps, no evaluation, no sweep (a recipe "
                                                  "trains, in seconds)")
    data: str = choice("real", ("world", "real"))
    model: ModelCfg = field(default_factory=ModelCfg)
    streams: Dict[str, StreamCfg] = field(default_factory=dict)
    # the objective (loss.name) and its terms' settings: negft.losses.LossCfg (each term's keys, defaults, ranges)
    loss: Any = field(default_factory=_loss_defaults)
    optim: OptimCfg = field(default_factory=OptimCfg)
    train: TrainCfg = field(default_factory=TrainCfg)
    eval: EvalCfg = field(default_factory=EvalCfg)
    world: WorldCfg = field(default_factory=WorldCfg)
    patch: PatchCfg = field(default_factory=PatchCfg)
    log: LogCfg = field(default_factory=LogCfg)
    # dotted-key overrides applied when data=world (before the command line's): the recipe's own
    # settings for the tiny world model, so any recipe runs on the world with the one override data=world
    on_world: Dict[str, Any] = field(default_factory=dict)


RESUME_WORDS = ("latest", "auto")      # resume= values that are not a checkpoint directory

# what smoke=true sets where the command line does not: a run that only shows the recipe trains, in seconds (README
# "Commands"): two steps of at most SMOKE_BATCH samples per stream, loaded in the training process, no evaluation
# (the ledger keeps its lines, with no metrics) and no patching sweep
SMOKE = {"max_steps": 2, "eval.suite": "none", "patch.sweep": False, "patch.alpha": None, "train.workers": 0}
SMOKE_BATCH = 8


def _unknown_key_error(key: str) -> ConfigError:
    keys = list(leaves(Config()))
    known = list(dict.fromkeys(k.rsplit(".", n)[0] for k in keys for n in range(k.count(".") + 1)))
    known += [f"streams.NAME.{f.name}" for f in dataclasses.fields(StreamCfg)]
    return unknown_key(key, known, n=3, cutoff=0.5)


def unknown_key(key: str, known: list[str], n: int = 3, cutoff: float = 0.5) -> ConfigError:
    """The error for ``key``, which is not among ``known``: the nearest known keys (those with the same last name
    first: a key moved into a block), else all of them. A recipe's override and a command's key are refused by it
    alike."""
    leaf = key.rsplit(".", 1)[-1]
    same = sorted((k for k in known if k.rsplit(".", 1)[-1] == leaf),
                  key=lambda k: -difflib.SequenceMatcher(None, key, k).ratio())
    close = list(dict.fromkeys(same + difflib.get_close_matches(key, known, n=n, cutoff=cutoff)))[:n]
    hint = f" Did you mean: {', '.join(close)}?" if close else f" Known keys: {', '.join(known)}."
    return ConfigError(f"unknown key '{key}'.{hint}")


def resolve_recipe_path(name: str) -> Path:
    """A ``.yaml`` / ``.yml`` file as given (relative to the working directory), else ``negft/recipes/<name>.yaml``."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        if not path.exists():
            raise ConfigError(f"recipe file '{name}' not found")
        return path
    path = RECIPES / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown recipe '{name}'. Valid choices: {', '.join(recipe_names())}")
    return path


def recipe_names() -> list[str]:
    """The recipe names ``recipe=`` takes: ``negft/recipes/*.yaml``, package data."""
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def parse_overrides(argv: list[str]) -> dict[str, str]:
    """``key=value`` pairs from argv; the DeepSpeed launcher's ``--local_rank=N`` is accepted."""
    out = {}
    for arg in argv:
        if arg.startswith("--local_rank"):
            continue
        if "=" not in arg or arg.startswith("="):
            raise ConfigError(f"argument '{arg}' is not of the form key=value (e.g. optim.lr=1e-5)")
        key, value = arg.split("=", 1)
        out[key.lstrip("-")] = value
    return out


def _choice_errors(cfg: Config) -> list[str]:
    """The values their fields' choices and ranges rule out (``negft.fields``), and what no one field can judge.
    (The ``loss`` subtree's ranges are its terms' own: ``_loss_errors``.)"""
    errors = [e for key, f, value in items(cfg)
              if f is not None and not key.startswith("loss.") and (e := value_error(key, value, f))]
    for n, s in cfg.streams.items():
        needs = TASK_FIELDS.get(s.task)
        if needs is not None and s.field not in needs:
            errors.append(f"'streams.{n}': task={s.task} needs field={' or '.join(needs)}, not {s.field}")
        if s.redraw_negatives != "none" and s.field != "relcomp":
            errors.append(f"'streams.{n}.redraw_negatives' = {s.redraw_negatives} draws an itm stream's hard "
                          f"captions, and this stream reads field={s.field} (use task=itm, field=relcomp, or "
                          f"streams.{n}.redraw_negatives=none)")
    if cfg.model.lock_text_unlocked_layers is not None and "t" not in cfg.tower:
        errors.append(f"'model.lock_text_unlocked_layers' = {cfg.model.lock_text_unlocked_layers} unlocks text "
                      f"layers, but tower={cfg.tower} does not train the text tower (set tower=t or vt, or "
                      f"model.lock_text_unlocked_layers=null)")
    errors += _lora_errors(cfg)
    if cfg.train.epoch_stream and cfg.train.epoch_stream not in cfg.streams:
        errors.append(f"bad value '{cfg.train.epoch_stream}' for 'train.epoch_stream': this recipe's streams are "
                      f"{', '.join(cfg.streams) or 'none'} (\"\" = the first)")
    if cfg.resume is not None and cfg.resume not in RESUME_WORDS and not Path(cfg.resume).exists():
        errors.append(f"bad value for 'resume': '{cfg.resume}' is neither 'latest', 'auto' nor an existing "
                      "checkpoint directory")
    return errors + _path_errors(cfg) + _log_errors(cfg)


def _log_errors(cfg: Config) -> list[str]:
    """A missing wandb package, found now rather than after the model is built."""
    import importlib.util
    if cfg.log.wandb and importlib.util.find_spec("wandb") is None:
        return ["'log.wandb' = true needs the wandb package: pip install negft[wandb] (or pip install wandb), "
                "or set log.wandb=false"]
    return []


def _lora_errors(cfg: Config) -> list[str]:
    """``model.lora``'s values, and the keys it cannot be combined with."""
    lora, errors = cfg.model.lora, []
    # open bounds (alpha > 0, dropout < 1), which a field's closed range cannot say
    if not lora.alpha > 0:
        errors.append(f"bad value {lora.alpha} for 'model.lora.alpha': must be > 0 (the delta's scale is "
                      "alpha / rank; e.g. model.lora.alpha=16)")
    if not 0.0 <= lora.dropout < 1.0:
        errors.append(f"bad value {lora.dropout} for 'model.lora.dropout': must lie in [0, 1) "
                      "(e.g. model.lora.dropout=0.1)")
    if lora.rank <= 0:
        return errors
    if "t" not in cfg.tower:
        errors.append(f"'model.lora.rank' = {lora.rank} puts adapters on the text tower, but tower={cfg.tower} does "
                      f"not train it (set tower=t or vt, or model.lora.rank=0)")
    if not lora.targets:
        errors.append("bad value [] for 'model.lora.targets': name at least one module (e.g. "
                      "model.lora.targets=[mlp.c_fc,mlp.c_proj])")
    both = [("model.lock_text_unlocked_layers", cfg.model.lock_text_unlocked_layers is not None,
             "both choose what of the text tower trains; set one"),
            ("patch.alpha", cfg.patch.alpha is not None,
             "the per-epoch patched evaluation interpolates the live model's weights, whose text tower holds the "
             "adapters' factors, not their merged weights; patch the run's checkpoints with `negft patch` instead"),
            ("loss.guard.l2sp", cfg.loss.guard.l2sp > 0,
             "l2sp would anchor the adapters' factors (lora_A at its random start), not the merged weights to the "
             "base's")]
    errors += [f"'model.lora.rank' = {lora.rank} and '{key}' cannot be combined: {why} (or model.lora.rank=0)"
               for key, clash, why in both if clash]
    return errors


WEIGHT_SUFFIXES = (".safetensors", ".pt", ".pth", ".bin", ".npz", ".ckpt")


@dataclass(frozen=True)
class Source:
    """What a model string names: ``kind`` = ``hf-hub`` (``hf-hub:ORG/NAME``), ``local-dir`` (``local-dir:DIR`` or
    a directory), ``file`` (a weights file, or a path that is not there), ``tag`` (an open_clip pretrained tag, or
    "": random weights); ``pretrained`` as ``negft.models.build`` takes it; ``path`` the folder or file, if local."""
    kind: str
    pretrained: str
    path: Path | None = None

    @property
    def carries_architecture(self) -> bool:
        """Whether it brings its own open_clip config (an architecture name would be ignored)."""
        return self.kind in ("hf-hub", "local-dir")


def source(text: str) -> Source:
    """The one reading of a model string, for eval, patch and train alike."""
    if text.startswith(HF_HUB):
        return Source("hf-hub", text)
    path = Path(text.removeprefix(LOCAL_DIR))
    if text.startswith(LOCAL_DIR) or (text and path.is_dir()):
        return Source("local-dir", LOCAL_DIR + str(path), path)
    if text and (path.is_file() or "/" in text or text.endswith(WEIGHT_SUFFIXES)):
        return Source("file", str(path), path)
    return Source("tag", text)


def _weights_error(key: str, value: str) -> str | None:
    """The error for a weights source that names a local file or checkpoint directory that is not there (a tag, an
    ``hf-hub:`` name or a recipe name is left to the loader)."""
    src = source(value)
    if src.kind == "local-dir" and not (src.path / "open_clip_config.json").is_file():
        return (f"bad value for '{key}': '{src.path}' is not a checkpoint directory (no open_clip_config.json "
                "there); pass local-dir:DIR of a negft checkpoint or release, or a weights file")
    if src.kind == "file" and not src.path.exists():
        return (f"bad value for '{key}': '{value}' does not exist; pass an existing weights file "
                "(.safetensors), local-dir:DIR, or an open_clip tag in the local cache")
    return None


def _is_local(url: str) -> bool:
    return not url.startswith("pipe:") and "://" not in url


def _path_errors(cfg: Config) -> list[str]:
    """Data and weights paths that do not exist: refused before anything runs. (A manifest's shards are checked
    when the run opens its streams, also before anything is written: train.stream_source.)"""
    errors = [e for e in (_weights_error("model.world_pretrained", cfg.model.world_pretrained)
                          if cfg.data == "world" and (cfg.model.world_pretrained.startswith(LOCAL_DIR)
                                                      or "/" in cfg.model.world_pretrained) else None,
                          _weights_error("model.pretrained", cfg.model.pretrained) if cfg.data == "real" else None)
              if e]
    if cfg.data != "real" or cfg.train.synthetic:
        return errors
    import braceexpand
    for name, st in cfg.streams.items():
        if not st.urls:
            continue
        local = [u for u in braceexpand.braceexpand(st.urls) if _is_local(u)]
        missing = [u for u in local if not Path(u).is_file()]
        if missing:
            errors.append(f"bad value for 'streams.{name}.urls': {len(missing)} of {len(local)} shard files do not "
                          f"exist, e.g. {missing[0]}; fix the path (a brace pattern such as "
                          "/data/shard-{000000..000099}.tar), or leave urls empty to read the stream's manifest")
    return errors


def _loss_errors(cfg: Config, set_keys: set[str]) -> list[str]:
    """Each ``loss`` value in its term's range; the chosen objective exists, reads every stream, has the streams it
    needs, and no block it does not read is set (``set_keys``: the dotted keys the recipe, its ``on_world`` and
    the command line set). The objectives and their terms: ``negft.losses.OBJECTIVES``."""
    from negft.losses import BLOCKS, OBJECTIVES, batch_fields, setting_errors
    errors = setting_errors(cfg.loss)
    name = cfg.loss.name
    if name not in OBJECTIVES:
        return errors + [f"bad value {name!r} for 'loss.name'. Valid choices: {', '.join(OBJECTIVES)}"]
    objective = OBJECTIVES[name]
    for key in sorted(set_keys):
        parts = key.split(".")
        if parts[0] == "loss" and len(parts) > 1 and parts[1] in BLOCKS and parts[1] not in objective.blocks():
            readers = [n for n, o in OBJECTIVES.items() if parts[1] in o.blocks()]
            errors.append(f"'{key}' is read by loss.name={' or '.join(readers)}, not by loss.name={name}: "
                          f"remove it, or choose loss.name={readers[0]}")
    for stream, s in cfg.streams.items():
        if s.task not in objective.reads:
            readers = [n for n, o in OBJECTIVES.items() if s.task in o.reads]
            errors.append(f"stream '{stream}' (task={s.task}) is not read by loss.name={name}, which reads "
                          f"{' and '.join(objective.reads)} streams: remove the stream, or choose loss.name="
                          f"{' or '.join(readers)}")
    tasks = {s.task for s in cfg.streams.values()}
    for need in objective.needs:
        if cfg.streams and need not in tasks:
            errors.append(f"loss.name={name} needs a stream with task={need}; this recipe's streams: "
                          + ", ".join(f"{n} (task={s.task})" for n, s in cfg.streams.items()))
    if cfg.train.synthetic and not errors:
        fields = sorted({f for t in tasks for f in batch_fields(cfg.loss, t)})
        if fields:
            errors.append(f"train.synthetic=true draws random batches, without the batch fields loss.name={name}'s "
                          f"terms read ({', '.join(fields)}): train on data (data=world), or turn those terms off")
    return errors


def _dotted(key, value) -> list[str]:
    """The dotted keys that setting ``key`` to ``value`` sets (a mapping sets each of its leaves)."""
    return list(leaves(value, f"{key}."))


# the keys a relaunch into the same ``out`` may change and still be the same run (outdir.check_run_dir): where it is
# written and resumed from, how fast it loads, logs and evaluates, and the cache's path. Not
# negft.train.world_base.BASE_KEY_IGNORES, the keys that cannot change a finished base's weights: train.workers
# changes the order a run reads its data in (a new base), eval.suite changes a run's ledger (another run)
RUN_KEYS_IGNORED = ("out", "resume", "overwrite", "train.workers", "train.log_every", "train.dist_timeout_s", "world.cache",
                    "eval.batch_size", "log")


def default_cache() -> str:
    """Where worlds and base models are cached unless world.cache says: $NEGFT_CACHE, else ~/.cache/negft."""
    return os.environ.get("NEGFT_CACHE", str(Path.home() / ".cache" / "negft"))


def load_config(argv: list[str]) -> Config:
    """Defaults ← recipe YAML ← overrides; raises ConfigError naming the bad key or value."""
    overrides = parse_overrides(argv)
    recipe = overrides.pop("recipe", "demo")
    path = resolve_recipe_path(recipe)
    try:
        recipe_dict = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe '{path}' is not valid YAML: {e}") from e
    schema = copy.deepcopy(_schema())
    set_keys = {k for key, value in recipe_dict.items() for k in _dotted(key, value)} \
        if isinstance(recipe_dict, dict) else set()
    try:
        merged = OmegaConf.merge(schema, recipe_dict)
        data = yaml.safe_load(overrides["data"]) if "data" in overrides else merged.data
        if data == "world":
            for key, value in merged.on_world.items():
                _check_key(merged, key)
                OmegaConf.update(merged, key, value, merge=True)
                set_keys.update(_dotted(key, value))
        for key, value in overrides.items():
            _check_key(merged, key)
            value = yaml.safe_load(value) if value != "" else ""
            OmegaConf.update(merged, key, value, merge=True)
            set_keys.update(_dotted(key, value))
        if merged.smoke:
            smoke = {**SMOKE, **{f"streams.{n}.batch_size": min(s.batch_size, SMOKE_BATCH)
                                 for n, s in merged.streams.items()}}
            for key, value in smoke.items():
                if key not in overrides:
                    OmegaConf.update(merged, key, value, merge=True)
        merged.recipe = path.stem if path.parent == RECIPES else str(path)
    except ConfigError:
        raise
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or ""
        raise ConfigError(_explain(e, key)) from None
    cfg: Config = OmegaConf.to_object(merged)
    if not cfg.out:
        cfg.out = str(Path("runs") / Path(cfg.recipe).stem)
    if not cfg.world.cache:
        cfg.world.cache = default_cache()
    errors = _choice_errors(cfg) + _loss_errors(cfg, set_keys)
    if errors:
        raise ConfigError("; ".join(errors))
    return cfg


@functools.cache
def _schema():
    """``Config``'s defaults as OmegaConf's typed config: building it walks every dataclass (a tenth of a second on
    a slow core), copying it does not."""
    return OmegaConf.structured(Config)


def _check_key(merged, key: str) -> None:
    parts = key.split(".")
    node = merged
    for i, p in enumerate(parts):
        if parts[0] == "streams" and i == 1:
            if p not in node:
                raise ConfigError(f"unknown stream '{p}' in '{key}'. This recipe's streams: {', '.join(node) or 'none'}")
        elif not OmegaConf.is_config(node) or p not in node:
            raise _unknown_key_error(key)
        node = node[p]


def _explain(e: OmegaConfBaseException, key: str) -> str:
    msg = str(e).splitlines()[0]
    if "not in" in msg or "Key '" in msg and "not" in msg:
        return str(_unknown_key_error(key or msg))
    return f"bad value for '{key}': {msg}"


def to_yaml(cfg: Config) -> str:
    """The resolved recipe, with the loss blocks it reads only (so it loads again as a recipe)."""
    from negft.losses import BLOCKS, OBJECTIVES
    plain = dataclasses.asdict(cfg)
    read = OBJECTIVES[cfg.loss.name].blocks() if cfg.loss.name in OBJECTIVES else ()
    for block in BLOCKS:
        if block not in read:
            del plain["loss"][block]
    return yaml.safe_dump(plain, sort_keys=False, allow_unicode=True)


def epoch_stream(cfg: Config) -> str:
    """The stream whose one pass is an epoch and whose batch size is DeepSpeed's micro-batch."""
    return cfg.train.epoch_stream or next(iter(cfg.streams))


def model_arch(cfg: Config) -> str:
    """The architecture a run trains: ``model.world_arch`` on the world, else ``model.arch``."""
    return cfg.model.world_arch if cfg.data == "world" else cfg.model.arch


def world_folder(cache: str, seed: int, size: str) -> Path:
    """Where a world of ``seed`` and ``size`` is built in the cache ``cache``."""
    return Path(cache).expanduser() / f"world-s{seed}-{size}"


def world_dir(cfg: Config) -> Path:
    return world_folder(cfg.world.cache, cfg.world.seed, cfg.world.size)


def demo_world() -> Path:
    """The world the demo (and every recipe at its defaults) trains on: ``WorldCfg``'s seed and size in the default
    cache (``default_cache``)."""
    return world_folder(default_cache(), WorldCfg.seed, WorldCfg.size)
