"""``eval.py`` / ``negft eval``: evaluate one checkpoint and write results.json, results.md and examples/ (each
probe's records, and ``values.npz``: every metric's per-example values, for ``negft compare``'s paired tests); with
``format=clip_benchmark`` also one JSON per dataset and task in LAION-AI/CLIP_benchmark's own layout
(``negft.clip_benchmark``). Its keys: ``EvalKeys``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from negft.commands.keys import (Failed, fail, help_text, key, outcome, parse, quiet_on_closed_pipe,
                                 skip_the_last_collection, suites_line, synopsis, wants_help)
from negft.config import LOCAL_DIR, ConfigError, EvalCfg, source
from negft.fields import bounded, choice
from negft.outdir import check_writable, refuse_results, remove_entries

if TYPE_CHECKING:
    from negft import models


DEFAULT_ARCH = "ViT-B-32"                  # the architecture of a weights file ckpt=FILE given without model=
RESULTS = ("results.json", "results.md", "examples", "figures", "clip_benchmark")     # what an evaluation writes


@dataclass(kw_only=True)
class EvalKeys:
    """The keys of ``eval.py`` / ``negft eval``; the defaults they share with a run's evaluation are its
    (``negft.config.EvalCfg``). The model is ``ckpt=`` or ``model=ARCH pretrained=TAG`` (``model_keys_error``)."""
    ckpt: str = key("", "the model: a checkpoint directory (a run's checkpoints/epoch_N, a patch's selected/, a "
                        "release), local-dir:DIR, hf-hub:ORG/NAME (from the Hugging Face cache) or a weights file; "
                        "or leave it out and give model= and pretrained=")
    out: str = key(doc="the folder for results.json, results.md, examples/ and figures/")
    model: str = key("", f"an open_clip architecture: the one of pretrained=TAG, or of a weights file ckpt=FILE "
                         f"({DEFAULT_ARCH} if empty); a directory or hf-hub: carries its own")
    pretrained: str = key("", "an open_clip pretrained tag of model= (e.g. openai, laion2b_s34b_b79k), from the "
                              "local cache")
    suite: str = key(EvalCfg.suite, "default | all | none | a suite | probe names, comma-separated (README \"Metrics\")")
    data: str = choice("", ("", "world", "real"), doc="empty: as the checkpoint records (real where it records none)")
    split: str = choice(EvalCfg.split, ("val", "test"), doc="the world's split to read")
    batch_size: int = bounded(EvalCfg.batch_size, lo=1, doc="images or texts per forward pass")
    bootstrap: int = bounded(EvalCfg.bootstrap, lo=1, doc="resamples for the 95% intervals and the paired tests")
    world_dir: str = key("", "the world's folder; empty: the one the checkpoint records")
    base: str = key("", "also evaluate this base model (checkpoint, file, open_clip tag of the same architecture, "
                        "hf-hub:ORG/NAME, local-dir:DIR or recorded) on the same examples, with a paired test per "
                        "metric")
    quick_gelu: Optional[bool] = key(None, "true | false; empty: as the weights' record says (a tag's, a config's)")
    format: str = choice("", ("", "clip_benchmark"), doc="clip_benchmark: also CLIP_benchmark's result files under "
                                                          "out/clip_benchmark/")
    verify: bool = key(True, "false: use a release whose files fail its SHA256SUMS")
    overwrite: bool = key(False, "true: replace the results an earlier evaluation left in out (without it such an "
                                 "out is refused)")

    def __post_init__(self):
        error = model_keys_error(self)
        if error:
            raise ConfigError(error)


def model_keys_error(keys: EvalKeys) -> str | None:
    """What is wrong with how the keys name the model (None: nothing): ``ckpt=`` or ``model=ARCH
    pretrained=TAG``, never both, and ``model=`` beside ``ckpt=`` only for a weights file."""
    forms = "ckpt=DIR|FILE|hf-hub:ORG/NAME|local-dir:DIR, or model=ARCH pretrained=TAG (e.g. model=ViT-B-32 " \
            "pretrained=openai)"
    if keys.ckpt and keys.pretrained:
        return f"ckpt= and pretrained= both name the weights; give one: {forms}"
    if keys.ckpt and keys.model and source(keys.ckpt).carries_architecture:
        return (f"model={keys.model} with ckpt={keys.ckpt}, which carries its own architecture (its "
                "open_clip_config.json); drop model= (it names the architecture of a weights file or of a tag)")
    if keys.pretrained and not keys.model:
        return f"pretrained={keys.pretrained} needs model=ARCH, the open_clip architecture the tag belongs to"
    if not keys.ckpt and not keys.pretrained:
        return f"no model to evaluate: give {forms}"
    return None


WHAT = ("Evaluate one model (a checkpoint, a Hub model, an open_clip tag) with a probe suite; with base=, against a "
        "base model on the same examples.")
README = (("Metrics", "suites, metric names, format=clip_benchmark"),
          ("Evaluating any model", "model= pretrained=, hf-hub:, local-dir:, negft.evaluate"),
          ("Patching and release", "base=, verify="))


def synopses(command: str = "negft eval") -> list[tuple[str, str]]:
    return [(synopsis(command, EvalKeys, ("ckpt", "suite", "base")), "same as python eval.py"),
            (synopsis(command, EvalKeys, ("model", "pretrained", "suite")), "any open_clip tag (ViT-B-32 openai)")]


def help_() -> str:
    forms = [*synopses("python eval.py"), ("negft eval (the same keys)", "")]
    return help_text(forms, WHAT, EvalKeys, README, "negft/commands/eval.py (evaluate_checkpoint)", suites_line())


@quiet_on_closed_pipe
def main(argv: list[str]) -> int:
    """``eval.py ARGS`` / ``negft eval ARGS``: 0 with results.json written, 2 for bad input, 1 for a failed write."""
    if wants_help(argv):
        print(help_())
        return 0
    skip_the_last_collection()
    from negft import probes
    try:
        keys = parse(EvalKeys, argv)
        probes.suite(keys.suite)
        check_writable(keys.out)
        refuse_results(keys.out, RESULTS, "the results of an evaluation", keys.overwrite)
    except (ConfigError, ValueError) as e:
        return fail(str(e))
    return outcome(lambda: evaluate_checkpoint(keys), lambda path: f"[negft] results: {path}")


def load_model(keys: EvalKeys) -> tuple[models.Bundle, Path | None, dict]:
    """(the bundle, the checkpoint's folder or file, its ``negft`` block) of the model the keys name: ``ckpt=``
    (a directory, ``local-dir:DIR``, a weights file of architecture ``model=``, ``hf-hub:ORG/NAME``) or ``model=ARCH
    pretrained=TAG``; the activation as ``models.build`` rules, or ``quick_gelu=``."""
    from negft import models
    if not keys.ckpt:
        return models.load(keys.pretrained, keys.model, keys.quick_gelu, "pretrained", keys.verify), None, {}
    src = source(keys.ckpt)
    if src.kind == "tag":
        raise FileNotFoundError(f"ckpt '{keys.ckpt}' is neither a checkpoint directory nor a file (an open_clip tag "
                                f"goes in pretrained=, with model=ARCH)")
    bundle = models.load(keys.ckpt, keys.model or DEFAULT_ARCH, keys.quick_gelu, "ckpt", keys.verify)
    path = src.path
    return bundle, path, models.negft_info(path if path.is_dir() else path.parent) if path else {}


def _named(keys: EvalKeys, path: Path | None) -> dict:
    """How results.json and results.md name the model: as the keys gave it (a plain path as a path)."""
    if not keys.ckpt:
        return {"model": keys.model, "pretrained": keys.pretrained}
    return {"ckpt": keys.ckpt if path is None or keys.ckpt.startswith(LOCAL_DIR) else str(path)}


def _architecture_name(keys: EvalKeys, bundle: models.Bundle, info: dict) -> str:
    """The open_clip architecture of the evaluated model, for a ``base=TAG`` (whose tags are an architecture's):
    as recorded or given, else the open_clip name that builds its config."""
    from negft import clip_benchmark
    named = info.get("arch") or keys.model or clip_benchmark.clip_benchmark_model(bundle.model_cfg, "") or ""
    return named.removesuffix("-quickgelu") if not info.get("arch") and not keys.model else named


def evaluate_checkpoint(keys: EvalKeys) -> Path:
    """Evaluate the model the keys name (``load_model``); with ``base`` (a checkpoint, file, tag, ``hf-hub:``,
    ``local-dir:`` or ``recorded``) also the base model on the same examples, with a paired test per metric.
    ``quick_gelu`` = true | false | None (as the weights' record says, ``models.build``) sets the activation of the
    evaluated model. ``format=clip_benchmark`` also writes ``<out>/clip_benchmark/*.json``
    (``negft.clip_benchmark``). A release (a folder with ``SHA256SUMS``) whose files fail their sums is refused unless
    ``verify=false``; a weights file that is a pickle carrying more than tensors is refused always
    (``models.build``). ``results.json`` names the model as given and carries its ``provenance`` (negft's version,
    git commit, each probe's version: ``negft.provenance``)."""
    import torch

    from negft import clip_benchmark, models
    from negft.evaluation import datasets_for, print_skipped_rows, run_suite, world_root, write_results
    from negft.patching import build_base
    from negft.provenance import code
    code()                  # the code's provenance, read before anything else runs (negft.provenance)
    suite, base, batch_size, bootstrap = keys.suite, keys.base, keys.batch_size, keys.bootstrap
    bundle, path, info = load_model(keys)
    shown = keys.ckpt or f"{keys.model} pretrained={keys.pretrained}"
    print(f"[negft] eval {path or shown}: act={models.activation(bundle.model)}", flush=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    world = world_root(info, keys.world_dir) if (keys.data or info.get("data", "real")) == "world" else None
    datasets = datasets_for(world / keys.split if world else None)
    result = run_suite(bundle.model.to(device), bundle.preprocess_val, bundle.tokenizer, datasets, suite,
                       batch_size, bootstrap, device)
    say_skipped(result.skipped, result.metrics, world is None)
    out_dir = Path(keys.out)
    paired = None
    if base:
        from negft.probes.stats import paired_p_values
        ref = build_base(base, {**info, "arch": _architecture_name(keys, bundle, info)}, verify=keys.verify)
        print(f"[negft] base {base}: act={models.activation(ref.model)}", flush=True)
        base_result = run_suite(ref.model.to(device), ref.preprocess_val, ref.tokenizer, datasets, suite,
                                batch_size, bootstrap, device)
        paired = (base, base_result, paired_p_values(base_result.values, result.values, bootstrap))
    if keys.overwrite:
        remove_entries(out_dir, RESULTS)        # the earlier results go whole: no stale examples beside the new ones
    written = write_results(out_dir, _named(keys, path), suite, result, paired, bootstrap)
    print_skipped_rows(result)
    if keys.format == "clip_benchmark":
        clip_benchmark.write_for(out_dir, result.metrics, bundle, path, info, ckpt=keys.ckpt, model=keys.model,
                                 pretrained=keys.pretrained, datasets=datasets)
    if result.skipped and not result.metrics:          # asked for (suite=none asks for nothing) and none scored
        raise Failed(f"nothing was scored: every probe of suite={suite} was skipped ({written} and results.md "
                     "say why)" + (" — no evaluation data was found under $NEGFT_DATA; `negft data check all` lists "
                                   "what is missing (README \"Training on real data\")" if world is None else ""))
    return written


def say_skipped(skipped: dict, metrics: dict, real: bool) -> None:
    """The console's word on what was skipped (results.md lists each with why): how many of the probe runs, and,
    on real data, the datasets not found."""
    if not skipped:
        return
    absent = sorted({k.split("/")[1] for k, why in skipped.items() if why.startswith("data not found")})
    print(f"[negft] skipped {len(skipped)} probe run(s) ({len(metrics)} metrics scored); results.md lists each with "
          "why", flush=True)
    if real and absent:
        from negft.data import manifests
        print(f"[negft] not found under $NEGFT_DATA ({manifests.data_root()}): {', '.join(absent)}; `negft data "
              "check all` lists what each needs", flush=True)
