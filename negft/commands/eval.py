"""``eval.py`` / ``negft eval``: evaluate one checkpoint and write results.json, results.md and examples/ (each
probe's records, and ``values.npz``: every metric's per-example values, for ``negft compare``'s paired tests); with
``format=clip_benchmark`` also one JSON per dataset in LAION-AI/CLIP_benchmark's own layout. Its keys: ``EvalKeys``.

CLIP_benchmark's result file (``clip_benchmark/cli.py`` ``run``): ``{"dataset", "model", "pretrained", "task",
"metrics", "language"}`` written with ``json.dump`` to ``--output``, by default
``{dataset}_{pretrained}_{model}_{language}_{task}.json``, where ``run`` puts the base name of ``--pretrained`` when
that is a file (the argument as given otherwise), ``dataset`` without a leading ``wds/`` and with ``/`` turned into
``_``, and ``model`` as given; the JSON keeps ``--dataset``, ``--model`` and ``--pretrained`` as given. Its ``build``
command reads such files back (a folder's ``*.json``) into one CSV row each: the metrics, the other keys, and
``model_fullname`` = ``model + " " + pretrained``. negft writes them under ``<out>/clip_benchmark/`` so that the
same evaluation can be rerun with CLIP_benchmark from the fields of the file:

- ``pretrained``: the checkpoint's weights file (``open_clip_model.safetensors`` of a checkpoint directory, the
  file itself for ``ckpt=FILE``), which CLIP_benchmark passes on to ``open_clip.create_model_and_transforms(model,
  pretrained=FILE)``; open_clip reads a ``.safetensors`` path there (``factory.load_state_dict``). For ``model=ARCH
  pretrained=TAG`` the tag; for ``ckpt=hf-hub:ORG/NAME`` empty, ``model`` being ``hf-hub:ORG/NAME`` (open_clip
  reads its config and weights from the Hub and ignores ``pretrained``).
- ``model``: the open_clip name whose config builds the checkpoint's architecture *and* activation
  (``clip_benchmark_model``: ``ViT-B-32-quickgelu`` for a QuickGELU ViT-B-32, since CLIP_benchmark forces nothing
  and a file records no activation). negft's own architectures (``negft-tiny``, ...) are open_clip names only in a
  process that called ``negft.models.register()``: run CLIP_benchmark as
  ``python -c "import sys, negft.models; negft.models.register(); from clip_benchmark.cli import main; sys.exit(main())" eval --model negft-tiny --pretrained CKPT/open_clip_model.safetensors ...``.
  A checkpoint no open_clip name rebuilds, or whose recorded preprocessing differs from the one open_clip gives a
  weights file, is written all the same with a note printed (``clip_benchmark_notes``).
- ``language`` ``en``; ``dataset`` negft's dataset name (``world``, ``coco``, ...).

The metrics that correspond, under CLIP_benchmark's names and rules (the ``_official`` variants, which break ties
as its ``torch.topk`` / ``argmax`` do, to the lower index), with its number types:

- ``zeroshot_classification`` (``metrics/zeroshot_classification.py``): ``acc1`` = ``zeroshot/<d>/top1_official``,
  ``acc5`` = ``top5_official`` (NaN with fewer than 5 classes, as CLIP_benchmark writes it),
  ``mean_per_class_recall`` = ``mean_per_class_recall_official``; dataset ``<d>``. Float64, as there: ``acc1`` /
  ``acc5`` are a count divided by a Python int, the recall is sklearn's ``balanced_accuracy_score``.
- ``zeroshot_retrieval`` (``metrics/zeroshot_retrieval.py``): ``image_retrieval_recall@k`` (text→image) =
  ``retrieval/<d>/r<k>_official``, ``text_retrieval_recall@k`` (image→text) = ``i2t_r<k>_official``, k = 1, 5, 10;
  dataset ``<d>``, and ``<d>_negated`` for Retrieval-Neg (``retrieval_neg/<d>/...``). Rounded to float32, as there
  (``.float().mean().item()``: the float32 mean of 0/1 hits is the float32 nearest to negft's float64 mean).

Not written: the MCQ, ARO, SugarCrepe, Winoground and probe families. CLIP_benchmark's nearest task,
``image_caption_selection``, assumes the right caption of each image is its first and reports ``image_acc`` /
``text_acc`` / ``acc`` with argmax ties to the first; NegBench's MCQ, whose answer is not always first
(HardNeg-Syn, CheXpert, the world) and whose metric is NegBench's own, is not that task.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from negft.commands.keys import (Failed, fail, help_text, key, outcome, parse, skip_the_last_collection,
                                 suites_line, synopsis, wants_help)
from negft.config import LOCAL_DIR, ConfigError, EvalCfg, source
from negft.fields import bounded, choice
from negft.io import atomic_write


DEFAULT_ARCH = "ViT-B-32"                  # the architecture of a weights file ckpt=FILE given without model=


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
    except (ConfigError, ValueError) as e:
        return fail(str(e))
    return outcome(lambda: evaluate_checkpoint(keys), lambda path: f"[negft] results: {path}")


CLIP_BENCHMARK_OUTPUT = "{dataset}_{pretrained}_{model}_{language}_{task}.json"     # CLIP_benchmark's default


def _float32(value: float) -> float:
    """``value`` as CLIP_benchmark's float32 ``.mean().item()`` gives it (NaN stays NaN)."""
    import numpy as np
    return float(np.float32(value))


def clip_benchmark_results(metrics: dict, model: str, pretrained: str, language: str = "en") -> list[dict]:
    """One CLIP_benchmark result dict per dataset and task that negft's ``metrics`` cover (module docstring)."""
    datasets = sorted({k.split("/")[1] for k in metrics if k.count("/") == 2})
    out = []

    def result(dataset: str, task: str, values: dict) -> dict:
        return {"dataset": dataset, "model": model, "pretrained": pretrained, "task": task, "metrics": values,
                "language": language}

    for d in datasets:
        if f"zeroshot/{d}/top1_official" in metrics:
            out.append(result(d, "zeroshot_classification", {
                "acc1": float(metrics[f"zeroshot/{d}/top1_official"]),
                "acc5": float(metrics.get(f"zeroshot/{d}/top5_official", math.nan)),
                "mean_per_class_recall": float(metrics[f"zeroshot/{d}/mean_per_class_recall_official"])}))
        for probe, name in (("retrieval", d), ("retrieval_neg", f"{d}_negated")):
            ks = sorted(int(k.split("/")[2][1:-len("_official")]) for k in metrics
                        if k.startswith(f"{probe}/{d}/r") and k.endswith("_official"))
            if ks:
                values = {}
                for k in ks:
                    values[f"image_retrieval_recall@{k}"] = _float32(metrics[f"{probe}/{d}/r{k}_official"])
                    values[f"text_retrieval_recall@{k}"] = _float32(metrics[f"{probe}/{d}/i2t_r{k}_official"])
                out.append(result(name, "zeroshot_retrieval", values))
    return out


def clip_benchmark_file_name(result: dict) -> str:
    """The file name CLIP_benchmark's ``run`` gives ``result`` under its default ``--output`` (module docstring),
    but for a ``/`` in the model (``hf-hub:ORG/NAME``), written ``_``: CLIP_benchmark would put the file in a
    sub-folder, where its ``build`` (a folder's ``*.json``) does not look."""
    pretrained = result["pretrained"]
    dataset = result["dataset"].removeprefix("wds/").replace("/", "_")
    return CLIP_BENCHMARK_OUTPUT.format(
        dataset=dataset, pretrained=Path(pretrained).name if Path(pretrained).is_file() else pretrained,
        model=result["model"].replace("/", "_"), language=result["language"], task=result["task"])


def clip_benchmark_pretrained(ckpt: Path) -> str:
    """What CLIP_benchmark's ``--pretrained`` takes for ``ckpt``: its weights file (the one open_clip would read
    from the directory as a ``local-dir``)."""
    from negft import models
    if ckpt.is_dir():
        return str(models._local_weights(ckpt) or ckpt / models.WEIGHTS_FILE)
    return str(ckpt)


def _architecture(cfg: dict) -> dict:
    """A model config as what it builds: the activation made explicit, the logit scale's shape (which open_clip's
    ``load_checkpoint`` reshapes) and preprocessing left out."""
    drop = ("quick_gelu", "nonscalar_logit_scale", "preprocess_cfg")
    return {**{k: v for k, v in cfg.items() if k not in drop}, "quick_gelu": bool(cfg.get("quick_gelu", False))}


def clip_benchmark_model(model_cfg: dict, arch: str) -> str | None:
    """The open_clip model name that builds ``model_cfg`` (architecture and activation), ``arch`` and its
    ``-quickgelu`` twin first; None if no name does."""
    import open_clip

    from negft import models
    models.register()
    want = _architecture(model_cfg)
    base = arch.removesuffix("-quickgelu")
    for name in dict.fromkeys([arch, base + "-quickgelu", base, *sorted(open_clip.list_models())]):
        cfg = open_clip.get_model_config(name)
        if cfg is not None and _architecture(cfg) == want:
            return name
    return None


def _file_preprocess(model_cfg: dict) -> dict:
    """The preprocessing open_clip gives a model built from a name and a weights file: its defaults at the
    model's image size (``factory.create_model``)."""
    from open_clip.transform import PreprocessCfg
    size = model_cfg["vision_cfg"].get("image_size", PreprocessCfg.size)
    return {**asdict(PreprocessCfg()), "size": tuple(size) if isinstance(size, (list, tuple)) else (size, size)}


def clip_benchmark_notes(model: str | None, arch: str, model_cfg: dict, preprocess_cfg: dict,
                         pretrained: str) -> list[str]:
    """What a user must know to rerun these results with CLIP_benchmark (module docstring)."""
    from negft import models
    notes = []
    if model is None:
        notes.append(f"no open_clip model name builds this checkpoint's architecture ({arch}, quick_gelu="
                     f"{bool(model_cfg.get('quick_gelu', False))}): CLIP_benchmark cannot rebuild it by name; "
                     "register its open_clip_config.json model_cfg with open_clip.add_model_config under a name "
                     "before CLIP_benchmark runs")
    elif (models.CONFIG_DIR / f"{model}.json").is_file():
        notes.append(f"'{model}' is negft's architecture, known to open_clip after negft.models.register(): "
                     "python -c \"import sys, negft.models; negft.models.register(); from clip_benchmark.cli "
                     f"import main; sys.exit(main())\" eval --model {model} --pretrained {pretrained} ...")
    expected = _file_preprocess(model_cfg)
    recorded = {k: tuple(v) if isinstance(v, list) else v for k, v in preprocess_cfg.items() if k in expected}
    differ = sorted(k for k, v in recorded.items() if v != expected[k])
    if differ:
        notes.append("open_clip preprocesses a weights file with its defaults, and this checkpoint records other "
                     + ", ".join(f"{k} ({recorded[k]} against {expected[k]})" for k in differ)
                     + ": CLIP_benchmark's numbers for it will differ from these")
    return notes


def write_clip_benchmark(out_dir: Path, metrics: dict, model: str, pretrained: str) -> list[Path]:
    """``clip_benchmark_results`` as CLIP_benchmark writes them (``json.dump``), under the names it gives them."""
    written = []
    for r in clip_benchmark_results(metrics, model, pretrained):
        path = out_dir / clip_benchmark_file_name(r)
        atomic_write(path, json.dumps(r))
        written.append(path)
    return written


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
    named = info.get("arch") or keys.model or clip_benchmark_model(bundle.model_cfg, "") or ""
    return named.removesuffix("-quickgelu") if not info.get("arch") and not keys.model else named


def write_clip_benchmark_for(keys: EvalKeys, out_dir: Path, metrics: dict, bundle: models.Bundle,
                             path: Path | None, info: dict) -> None:
    """CLIP_benchmark's files for the evaluated model, named so that CLIP_benchmark rebuilds it (module
    docstring): a tag as ``--model NAME --pretrained TAG``, a Hub model as ``--model hf-hub:ORG/NAME``, a
    checkpoint by its weights file."""
    arch = info.get("arch") or keys.model
    name = clip_benchmark_model(bundle.model_cfg, arch)
    if path is None:
        model, weights = (keys.ckpt, "") if keys.ckpt else (name or arch, keys.pretrained)
        notes = [] if keys.ckpt else clip_benchmark_notes(name, arch, bundle.model_cfg, {}, weights)
    else:
        model, weights = name or arch, clip_benchmark_pretrained(path)
        notes = clip_benchmark_notes(name, arch, bundle.model_cfg, bundle.preprocess_cfg, weights)
    for note in notes:
        print(f"[negft] clip_benchmark: {note}", flush=True)
    for p in write_clip_benchmark(out_dir / "clip_benchmark", metrics, model, weights):
        print(f"[negft] clip_benchmark: {p}", flush=True)


def evaluate_checkpoint(keys: EvalKeys) -> Path:
    """Evaluate the model the keys name (``load_model``); with ``base`` (a checkpoint, file, tag, ``hf-hub:``,
    ``local-dir:`` or ``recorded``) also the base model on the same examples, with a paired test per metric.
    ``quick_gelu`` = true | false | None (as the weights' record says, ``models.build``) sets the activation of the
    evaluated model. ``format=clip_benchmark`` also writes ``<out>/clip_benchmark/*.json`` (module docstring). A
    release (a folder with ``SHA256SUMS``) whose files fail their sums is refused unless ``verify=false``; a weights
    file that is a pickle carrying more than tensors is refused always (``models.build``). ``results.json`` names
    the model as given and carries its ``provenance`` (negft's version, git commit, each probe's version:
    ``negft.provenance``)."""
    import torch

    from negft import models
    from negft.evaluation import datasets_for, run_suite, world_root, write_results
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
    written = write_results(out_dir, _named(keys, path), suite, result, paired, bootstrap)
    if keys.format == "clip_benchmark":
        write_clip_benchmark_for(keys, out_dir, result.metrics, bundle, path, info)
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
