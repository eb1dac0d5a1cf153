"""LAION-AI/CLIP_benchmark's result files for negft's scores (``eval.py ... format=clip_benchmark``), named so that
CLIP_benchmark can rerun the same evaluation from the fields of each file.

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
- ``language`` ``en``; ``dataset`` negft's dataset name (``world``, ``coco``, ...), which names no CLIP_benchmark
  builder (``clip_benchmark/datasets/builder.py``): these files cannot yet be rerun from their own fields. The
  world's SugarCrepe splits and zero-shot folder are read by ``clip_benchmark eval`` as written, through its
  ``sugar_crepe/<split>`` builder and an ImageFolder one (the commands in ``bench/RESULTS.md``).

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
from dataclasses import asdict
from pathlib import Path

import numpy as np
import open_clip
from open_clip.transform import PreprocessCfg

from negft import models
from negft.io import atomic_write


CLIP_BENCHMARK_OUTPUT = "{dataset}_{pretrained}_{model}_{language}_{task}.json"     # CLIP_benchmark's default


def _float32(value: float) -> float:
    """``value`` as CLIP_benchmark's float32 ``.mean().item()`` gives it (NaN stays NaN)."""
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
    size = model_cfg["vision_cfg"].get("image_size", PreprocessCfg.size)
    return {**asdict(PreprocessCfg()), "size": tuple(size) if isinstance(size, (list, tuple)) else (size, size)}


def clip_benchmark_notes(model: str | None, arch: str, model_cfg: dict, preprocess_cfg: dict,
                         pretrained: str) -> list[str]:
    """What a user must know to rerun these results with CLIP_benchmark (module docstring)."""
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



def write_for(out_dir: Path, metrics: dict, bundle: models.Bundle, path: Path | None, info: dict, *, ckpt: str,
              model: str, pretrained: str) -> None:
    """CLIP_benchmark's files for the evaluated model (``ckpt=`` / ``model=`` / ``pretrained=`` as ``eval.py`` was
    given them; ``path`` the checkpoint's folder or file, ``info`` its ``negft`` block), named so that
    CLIP_benchmark rebuilds it (module docstring): a tag as ``--model NAME --pretrained TAG``, a Hub model as
    ``--model hf-hub:ORG/NAME``, a checkpoint by its weights file."""
    arch = info.get("arch") or model
    name = clip_benchmark_model(bundle.model_cfg, arch)
    if path is None:
        model, weights = (ckpt, "") if ckpt else (name or arch, pretrained)
        notes = [] if ckpt else clip_benchmark_notes(name, arch, bundle.model_cfg, {}, weights)
    else:
        model, weights = name or arch, clip_benchmark_pretrained(path)
        notes = clip_benchmark_notes(name, arch, bundle.model_cfg, bundle.preprocess_cfg, weights)
    for note in notes:
        print(f"[negft] clip_benchmark: {note}", flush=True)
    for p in write_clip_benchmark(out_dir / "clip_benchmark", metrics, model, weights):
        print(f"[negft] clip_benchmark: {p}", flush=True)
