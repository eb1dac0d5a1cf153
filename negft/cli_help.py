"""``--help`` (or ``-h``) of ``train.py``, ``eval.py`` and each ``negft`` command: its usage, the recipes, every
key with its default and where it is documented; exit 0. The other words of the command line are not read, so
``--help`` answers even beside a bad key.

Each key of ``eval``, ``patch`` and ``release`` has its line here (``*_DOCS``) (a test checks that every key the command
takes has one); the training keys are too many for a screen and are documented, with their defaults, in
the dataclass of each block (``negft/config.py``'s ``Config`` and the classes its fields name, listed by
``train_help`` from ``Config`` itself) and the README
sections ``TRAIN_SECTIONS`` names.
"""
from __future__ import annotations

import dataclasses
import re
import textwrap

HELP_FLAGS = ("-h", "--help")

# the keys of eval, patch and release with their defaults (``...``: required), which negft.cli applies; *_DOCS
# below say what each means
COMMAND_KEYS = {
    "eval": {"ckpt": ..., "out": ..., "model": "ViT-B-32", "pretrained": "", "suite": "default", "data": "",
             "split": "test", "batch_size": "256", "bootstrap": "1000", "world_dir": "", "base": "", "quick_gelu": "",
             "format": "", "verify": "true"},
    "patch": {"base": ..., "finetuned": ..., "out": ..., "alphas": "0:1:0.1", "towers": "v,t,vt", "suite": "default",
              "arch": "", "world_dir": "", "targets": "", "drift": "", "max_drift": "", "batch_size": "256",
              "bootstrap": "1000", "verify": "true"},
    "release": {"ckpt": "", "out": ..., "license": "other", "push": "", "private": "false", "dry_run": "false"},
}

# README.md sections (a heading starting so) that document the training keys, with what each covers
TRAIN_SECTIONS = (
    ("Commands", "overrides (dotted keys) and the top-level keys"),
    ("Recipes", "each recipe, streams.NAME.*, the objective loss.*"),
    ("Models", "model.*"),
    ("Towers, precision, scale", "tower, model.train_logit_scale, train.* (precision, ZeRO, speed)"),
    ("Checkpoints and resume", "resume (latest, auto), train.checkpoint_every, train.dist_timeout_s"),
    ("Running on a cluster", "srun, torchrun, resume=auto, SIGUSR1 and the requeue, DEEPSPEED_TIMEOUT"),
    ("The embedded world", "data=world, world.*"),
    ("Training on real data", "streams.NAME.manifest / urls, $NEGFT_DATA"),
    ("Patching and release", "patch.*"),
    ("Metrics", "eval.suite and the metric names"),
)

EVAL_DOCS = {
    "ckpt": "a checkpoint directory (a run's checkpoints/epoch_N, a patch's selected/, a release) or a weights file",
    "out": "the folder for results.json, results.md, examples/ and figures/",
    "model": "the open_clip architecture of a weights file (a checkpoint directory carries its own)",
    "pretrained": "not read: ckpt= names the weights",
    "suite": "default | all | none | a suite | probe names, comma-separated (README \"Metrics\")",
    "data": "world | real; empty: as the checkpoint records",
    "split": "the world's split to read (val | test)",
    "batch_size": "images or texts per forward pass",
    "bootstrap": "resamples for the 95% intervals and the paired tests",
    "world_dir": "the world's folder; empty: the one the checkpoint records",
    "base": "also evaluate this base model (checkpoint, file, open_clip tag or recorded) on the same examples, "
            "with a paired test per metric",
    "quick_gelu": "true | false; empty: as the checkpoint records",
    "format": "clip_benchmark: also CLIP_benchmark's result files under out/clip_benchmark/",
    "verify": "false: use a release whose files fail its SHA256SUMS",
}
EVAL_SECTIONS = (("Metrics", "suites, metric names, format=clip_benchmark"),
                 ("Patching and release", "base=, verify="))

PATCH_DOCS = {
    "base": "the base model: a checkpoint, a file, an open_clip tag, or recorded (the one the checkpoint records)",
    "finetuned": "the fine-tuned checkpoint directory",
    "out": "the folder for sweep.jsonl, sweep.png, selected.json and selected/",
    "alphas": "the weights of the fine-tuned model to try: start:stop:step (stop included) or a comma list",
    "towers": "tower modes to try, comma-separated: v, t, vt",
    "suite": "the probe suite of the sweep (README \"Metrics\")",
    "arch": "the architecture of a weights file (default: the checkpoint's record)",
    "world_dir": "the world's folder; empty: the one the checkpoint records",
    "targets": "metrics to gain, comma-separated, * for the dataset (default: the run's patch.targets)",
    "drift": "metrics that may not drop by more than max_drift (default: the run's patch.drift)",
    "max_drift": "the largest drop allowed in a drift metric (default: the run's patch.max_drift)",
    "batch_size": "images or texts per forward pass",
    "bootstrap": "resamples for the 95% intervals and the paired tests",
    "verify": "false: use a release whose files fail its SHA256SUMS",
}
RELEASE_DOCS = {
    "ckpt": "a checkpoint directory (a run's checkpoints/epoch_N or a patch's selected/); empty with push=: "
            "upload the release already in out",
    "out": "a new folder (never overwritten) for the weights, config, README.md (the model card) and SHA256SUMS",
    "license": "the card's Hub license id (mit, apache-2.0, ...); other: terms the card does not name",
    "push": "ORG/NAME: upload the release to that Hub model repository (created if absent) after checking its "
            "SHA256SUMS; needs HF_TOKEN or `hf auth login`",
    "private": "true: a push creates the repository private",
    "dry_run": "true: list what push= would upload, upload nothing",
}
DATA_SECTIONS = (("Training on real data", "convert, negate, relcomp, check; $NEGFT_DATA; negft/data_manifests/"),
                 ("The embedded world", "negft data world"))
COMMANDS = {    # command -> (usage, what it does, {key: meaning}, README sections)
    "eval": ("python eval.py ckpt=DIR|FILE out=DIR [key=value ...]\n       negft eval ckpt=DIR|FILE out=DIR "
             "[key=value ...]",
             "Evaluate one checkpoint with a probe suite; with base=, against a base model on the same examples.",
             EVAL_DOCS, EVAL_SECTIONS),
    "patch": ("negft patch base=CKPT|TAG|recorded finetuned=CKPT out=DIR [key=value ...]",
              "Sweep θ(α) = (1 − α)·θ_base + α·θ_finetuned per tower mode on the val split, choose α by the "
              "run's rule, report it on the test split.",
              PATCH_DOCS, (("Patching and release", "the sweep, the rule, selected/"),)),
    "release": ("negft release ckpt=DIR out=DIR [key=value ...]\n       negft release out=DIR push=ORG/NAME "
                "[key=value ...]",
                "Copy a checkpoint into a new folder as a publishable open_clip local-dir and Hugging Face Hub "
                "repository (README.md model card with the Hub's metadata, checksums); push= uploads it.",
                RELEASE_DOCS, (("Patching and release", "what the release holds and how it is checked"),)),
}


def wants_help(argv: list[str]) -> bool:
    return any(a in HELP_FLAGS for a in argv)


def recipes() -> list[str]:
    """The recipe names ``recipe=`` takes: ``negft/recipes/*.yaml``, package data."""
    from negft.config import RECIPES
    return sorted(p.stem for p in RECIPES.glob("*.yaml"))


def _recipes_line() -> str:
    from negft.config import RECIPES, Config
    names = recipes()
    listed = ", ".join(names) if names else f"none found in {RECIPES}"
    return _wrap(f"recipes (recipe=NAME, default {Config().recipe}; negft recipes, README \"Recipes\"): {listed}", 2)


def recipe_summary(name: str, width: int = 200) -> str:
    """The first sentence of the comment block recipe ``name`` opens with (each recipe says there what it is),
    shortened to ``width`` characters."""
    from negft.config import RECIPES
    lines = []
    for line in (RECIPES / f"{name}.yaml").read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    first = re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(lines))[0]     # "eq. 2" does not end a sentence
    return textwrap.shorten(first, width, placeholder=" …")


def recipes_listing() -> str:
    """``negft recipes``: every recipe with what it is, where they live, and how to copy one out."""
    from negft.config import RECIPES
    names = recipes()
    if not names:
        return f"no recipes found in {RECIPES}"
    width = max(map(len, names)) + 4
    rows = [_wrap(f"  {name.ljust(width - 2)}{recipe_summary(name)}", width) for name in names]
    return "\n".join([f"recipes in {RECIPES} (recipe=NAME; README \"Recipes\"):", *rows, "",
                      _wrap("negft recipes cp NAME DEST.yaml copies one out to edit; negft train recipe=DEST.yaml "
                            "trains the copy.", 0)])


def recipes_help(usage: str) -> str:
    """``negft recipes --help``."""
    return "\n".join([usage.rstrip(), "", _wrap("List the recipes that recipe=NAME takes, each with the first sentence "
                                              "of its comments; cp copies one to a new file (never over an existing "
                                              "one) that recipe=DEST.yaml reads.", 0),
                      "README.md sections:", *_sections((("Recipes", "each recipe, its streams and objective"),))])


def config_blocks() -> tuple[list[str], list[tuple[str, str]]]:
    """(the top-level keys, [(block, the file and class that define its keys)]), read off ``Config`` itself: a
    block's class is its field's default (``loss``: the class its default factory builds, wherever it lives)."""
    from negft.config import Config
    top, blocks = [], []
    for f in dataclasses.fields(Config):
        kind = str(f.type)
        if f.default_factory is dataclasses.MISSING:
            top.append(f.name)
        elif kind.startswith(("Dict", "dict")):
            classes = re.findall(r"\b([A-Z]\w*Cfg)\b", kind)
            blocks.append((f"{f.name}.NAME.*", f"negft/config.py {classes[-1]}") if classes
                          else (f"{f.name}.*", f"negft/config.py Config.{f.name}"))
        else:
            cls = type(f.default_factory())
            blocks.append((f"{f.name}.*", f"{cls.__module__.replace('.', '/')}.py {cls.__name__}"))
    return top, blocks


def _sections(sections) -> list[str]:
    quoted = [(f'"{name}"', what) for name, what in sections]
    width = max(len(name) for name, _ in quoted) + 2
    return [f"  {name.ljust(width)}{what}" for name, what in quoted]


def train_help() -> str:
    top, blocks = config_blocks()
    width = max(len(b) for b, _ in blocks) + 2
    return "\n".join([
        "usage: python train.py [recipe=NAME] [key=value ...]",
        "       negft train [recipe=NAME] [key=value ...]",
        "       deepspeed [--num_gpus N] [--hostfile F] train.py [recipe=NAME] [key=value ...]",
        "       torchrun --nproc_per_node N train.py ...  |  srun python train.py ...   (ranks from the environment)",
        "",
        "Train a recipe into out=DIR (default runs/<recipe>), with its probe suite before training and after every",
        "epoch. Keys are dotted (optim.lr=1e-5 streams.negmcq.batch_size=32); an unknown key or bad value exits 2",
        "before anything is written, naming the valid choices.",
        "",
        _recipes_line(),
        "",
        "keys: each with its default and meaning in the dataclass of its block:",
        f"  {'top level'.ljust(width)}negft/config.py Config: {', '.join(top)}",
        *[f"  {block.ljust(width)}{cls}" for block, cls in blocks],
        "",
        "README.md sections:",
        *_sections(TRAIN_SECTIONS),
    ])


def _wrap(text: str, indent: int) -> str:
    """``text`` in lines of at most 110 characters, the later ones indented by ``indent``."""
    return textwrap.fill(text, 110, subsequent_indent=" " * indent, break_on_hyphens=False, break_long_words=False)


def command_help(command: str) -> str:
    """``--help`` of ``eval``, ``patch`` or ``release``: each key as ``key=DEFAULT`` with its meaning."""
    usage, what, meanings, sections = COMMANDS[command]
    defaults = COMMAND_KEYS[command]
    shown = {k: f"{k}=..." if d is ... else f"{k}={d}" for k, d in defaults.items()}
    width = max(map(len, shown.values())) + 2
    lines = [f"usage: {usage}", "", _wrap(what, 0), "", "keys (key=DEFAULT; ... is required):"]
    for key, text in shown.items():
        lines.append(_wrap(f"  {text.ljust(width)}{meanings[key]}", width + 2))
    if command in ("eval", "patch"):
        from negft import probes
        lines += ["", _wrap(f"suites (suite=): none, all, {', '.join(probes.SUITES)}, or probe names: "
                            f"{', '.join(probes.PROBES)}", 2)]
    where = {"eval": "negft/eval_cmd.py (evaluate_checkpoint)", "patch": "negft/patch_cmd.py (patch)",
             "release": "negft/release.py (release_command: release, push_to_hub)"}[command]
    return "\n".join(lines + ["", f"code: {where}", "README.md sections:", *_sections(sections)])


def data_help(usage: str) -> str:
    """``negft data --help``: the sub-commands (``usage``, from their signatures) and where they are documented."""
    return "\n".join([usage.rstrip(), "", _wrap("keys: each sub-command's function, which negft/cli.py's DATA_COMMANDS "
                                              "names, documents its keys in its docstring.", 0),
                      "README.md sections:", *_sections(DATA_SECTIONS)])


def main_help(usage: str) -> str:
    """``negft --help``: the commands, the recipes, where to read more."""
    return "\n".join([usage.rstrip(), "", _recipes_line(), "",
                      _wrap("negft COMMAND --help, python train.py --help, python eval.py --help: the command's keys, "
                            "their defaults and where each is documented (training keys: negft/config.py and "
                            "README.md \"Commands\").", 0)])
