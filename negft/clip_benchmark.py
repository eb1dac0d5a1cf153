"""LAION-AI/CLIP_benchmark's result files for negft's scores (``eval.py ... format=clip_benchmark``), named so that
CLIP_benchmark can rerun the same evaluation from the fields of each file read from its webdataset layout (the
others say why they cannot be).

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
- ``language`` ``en``. ``dataset`` and where its files are (``clip_benchmark_eval_args`` forms the command):

  - a dataset read from CLIP_benchmark's webdataset layout (``negft/probes/clip_benchmark_wds.py``: the folders
    under ``$NEGFT_DATA/clip_benchmark/``; with ``data=real`` on the world's tree, ``negft/world/formats/tree.py``,
    the world's three examples) is named as CLIP_benchmark's ``--dataset`` takes it, ``wds/<folder>`` with the
    folder's leading ``wds_`` dropped (its own convention: ``wds/cars`` is read from ``.../wds_cars``, the
    ``--dataset_root`` template being ``.../wds_{dataset_cleaned}``; ``cli.py`` ``run`` formats ``--dataset_root``
    with ``{dataset}`` = the name without ``wds/`` and ``{dataset_cleaned}`` = that with ``/`` as ``-``).
    CLIP_benchmark's JSON does not record the root, so negft adds ``dataset_root``: the folder the shards were read
    from, absolute, as a literal path (the command doubles any ``{``/``}`` in it, which ``str.format`` would read as
    a field), and ``split``, its ``--split``. Retrieval sets need ``--task zeroshot_retrieval`` (``task=auto`` reads
    any ``wds/`` name but its own retrieval sets' as classification), which the file's ``task`` gives, and
    ``--recall_k`` with the file's k's; recall at a k beyond the gallery (fewer images or captions than k), where
    CLIP_benchmark's ``topk`` stops, is left out of the file. ``--no_amp``: negft scores in the model's precision,
    CLIP_benchmark's default is autocast. A dataset with samples CLIP_benchmark stops on (negft skips and counts
    them) is not re-runnable and is marked as below.
  - any other dataset (the world split's zero-shot folder and Retrieval(-Neg) CSVs, ImageNet, COCO) keeps negft's
    name (``world``, ``world_negated``, ``coco``, ``imagenet``), with no root, and carries negft's key
    ``not_rerunnable``: why these fields cannot rerun it (``world`` names no CLIP_benchmark builder,
    ``clip_benchmark/datasets/builder.py``; ``imagenetv2``, also a builder's name, reads
    ``<root>/ImageNetV2-matched-frequency/`` of exactly 10,000 images, ``datasets/imagenetv2.py``, and downloads it
    otherwise). Writing the world split's zero-shot set a second time as webdataset shards would change every
    world; ``data=real`` on the world's tree already scores three webdataset sets that are re-runnable. The
    world's zero-shot folder can still be read by ``clip_benchmark eval`` by hand, through its ``imagenet_sketch``
    builder (a bare ImageFolder) with the folder's class names and templates as custom files (``bench/RESULTS.md``).

The metrics that correspond, under CLIP_benchmark's names and rules (the ``_official`` variants, which break ties
as its ``torch.topk`` / ``argmax`` do, to the lower index), with its number types:

- ``zeroshot_classification`` (``metrics/zeroshot_classification.py``): ``acc1`` = ``zeroshot/<d>/top1_official``,
  ``acc5`` = ``top5_official`` (NaN with fewer than 5 classes, as CLIP_benchmark writes it),
  ``mean_per_class_recall`` = ``mean_per_class_recall_official``; dataset ``<d>``. Float64, as there: ``acc1`` /
  ``acc5`` are a count divided by a Python int, the recall is sklearn's ``balanced_accuracy_score``.
- ``zeroshot_retrieval`` (``metrics/zeroshot_retrieval.py``): ``image_retrieval_recall@k`` (text→image) =
  ``retrieval/<d>/r<k>_official``, ``text_retrieval_recall@k`` (image→text) = ``i2t_r<k>_official``, k = 1, 5, 10;
  dataset ``<d>``, and ``<d>_negated`` for Retrieval-Neg (``retrieval_neg/<d>/...``); a webdataset retrieval set's
  from ``zeroshot_retrieval/<d>/...``. Rounded to float32, as there
  (``.float().mean().item()``: the float32 mean of 0/1 hits is the float32 nearest to negft's float64 mean).

Not written: the MCQ, ARO, SugarCrepe, Winoground and probe families. CLIP_benchmark's nearest task,
``image_caption_selection``, assumes the right caption of each image is its first and reports ``image_acc`` /
``text_acc`` / ``acc`` with argmax ties to the first; NegBench's MCQ, whose answer is not always first
(HardNeg-Syn, CheXpert, the world) and whose metric is NegBench's own, is not that task.
"""
from __future__ import annotations

import json
import math
import os
import shlex
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


DATASET_ROOT, SPLIT, NOT_RERUNNABLE = "dataset_root", "split", "not_rerunnable"     # negft's keys (docstring)
NEGFT_NAME = ("'{d}' is negft's name for {what}, not read from CLIP_benchmark's webdataset layout: these fields "
              "name no dataset and root that clip_benchmark eval reads as negft read them")
WHAT = {"zeroshot": "a zero-shot folder set (class folders)", "retrieval": "NegBench's retrieval CSV",
        "retrieval_neg": "NegBench's Retrieval-Neg CSV", "zeroshot_retrieval": "a retrieval set"}


def wds_sources(datasets) -> dict[str, dict]:
    """For each of ``datasets`` read from CLIP_benchmark's webdataset layout, by its metric name: ``dataset``
    (CLIP_benchmark's name), ``root`` (absolute), ``split``, ``gallery`` (the largest k its retrieval ``topk``
    takes; None for classification) and ``why`` (non-empty: CLIP_benchmark stops on some of its samples)."""
    from negft.data import manifests
    from negft.probes import clip_benchmark_wds as wds
    out = {}
    for d in datasets:
        if not d.manifest or d.name == wds.ABSENT or manifests.load(d.manifest).get("layout") != wds.LAYOUT:
            continue
        split = str(manifests.load(d.manifest).get("split") or "test")
        data = wds.load(d, split)
        if data["why"]:
            continue
        texts = sum(len(c) for c in data["captions"])
        skipped = sum(data["skipped"].values())
        out[d.name] = {
            "dataset": "wds/" + Path(d.root).name.removeprefix("wds_"), "root": os.path.abspath(d.root),
            "split": split, "gallery": min(len(data["images"]), texts) if data["kind"] == "retrieval" else None,
            "why": (f"{skipped} samples in {data['where']} that CLIP_benchmark stops on (negft skipped them: "
                    f"{', '.join(sorted(data['skipped']))})" if skipped else "")}
    return out


def clip_benchmark_results(metrics: dict, model: str, pretrained: str, language: str = "en",
                           sources: dict | None = None) -> list[dict]:
    """One CLIP_benchmark result dict per dataset and task that negft's ``metrics`` cover (module docstring);
    ``sources`` (``wds_sources``) names the datasets read from CLIP_benchmark's webdataset layout."""
    sources = sources or {}
    datasets = sorted({k.split("/")[1] for k in metrics if k.count("/") == 2})
    out = []

    def result(d: str, family: str, task: str, values: dict, name: str = "") -> dict:
        r = {"dataset": name or d, "model": model, "pretrained": pretrained, "task": task, "metrics": values,
             "language": language}
        source = sources.get(d) if family in ("zeroshot", "zeroshot_retrieval") else None
        if source and not source["why"]:
            return {**r, "dataset": source["dataset"], DATASET_ROOT: source["root"], SPLIT: source["split"]}
        return {**r, NOT_RERUNNABLE: source["why"] if source else NEGFT_NAME.format(d=d, what=WHAT[family])}

    for d in datasets:
        if f"zeroshot/{d}/top1_official" in metrics:
            out.append(result(d, "zeroshot", "zeroshot_classification", {
                "acc1": float(metrics[f"zeroshot/{d}/top1_official"]),
                "acc5": float(metrics.get(f"zeroshot/{d}/top5_official", math.nan)),
                "mean_per_class_recall": float(metrics[f"zeroshot/{d}/mean_per_class_recall_official"])}))
        for probe, name in (("retrieval", d), ("retrieval_neg", f"{d}_negated"), ("zeroshot_retrieval", d)):
            ks = sorted(int(k.split("/")[2][1:-len("_official")]) for k in metrics
                        if k.startswith(f"{probe}/{d}/r") and k.endswith("_official"))
            gallery = (sources.get(d) or {}).get("gallery") if probe == "zeroshot_retrieval" else None
            if gallery is not None and any(k > gallery for k in ks):
                print(f"[negft] clip_benchmark: {d}: recall@{[k for k in ks if k > gallery]} left out of its file: "
                      f"k beyond its {gallery} images or captions, where CLIP_benchmark's topk stops", flush=True)
                ks = [k for k in ks if k <= gallery]
            if ks:
                values = {}
                for k in ks:
                    values[f"image_retrieval_recall@{k}"] = _float32(metrics[f"{probe}/{d}/r{k}_official"])
                    values[f"text_retrieval_recall@{k}"] = _float32(metrics[f"{probe}/{d}/i2t_r{k}_official"])
                out.append(result(d, probe, "zeroshot_retrieval", values, name))
    return out


def clip_benchmark_eval_args(result: dict) -> list[str]:
    """``clip_benchmark eval``'s arguments that rerun a re-runnable ``result`` from its fields (module docstring);
    ValueError for one marked ``not_rerunnable``."""
    if NOT_RERUNNABLE in result or DATASET_ROOT not in result:
        raise ValueError(f"{result['dataset']}: not re-runnable by clip_benchmark eval: "
                         f"{result.get(NOT_RERUNNABLE, 'no dataset_root')}")
    root = result[DATASET_ROOT].replace("{", "{{").replace("}", "}}")    # run() formats it with {dataset}
    args = ["eval", "--dataset", result["dataset"], "--dataset_root", root, "--split", result.get(SPLIT, "test"),
            "--model", result["model"], "--pretrained", result["pretrained"], "--task", result["task"],
            "--language", result["language"], "--no_amp"]
    if result["task"] == "zeroshot_retrieval":
        ks = sorted({int(k.split("@")[1]) for k in result["metrics"]})
        args += ["--recall_k", *map(str, ks)]
    return args


def clip_benchmark_command(result: dict) -> str:
    """The shell command ``clip_benchmark_eval_args`` stands for; through ``negft.models.register()`` for
    negft's own architectures."""
    if (models.CONFIG_DIR / f"{result['model']}.json").is_file():
        prefix = ["python", "-c", "import sys, negft.models; negft.models.register(); "
                                  "from clip_benchmark.cli import main; sys.exit(main())"]
    else:
        prefix = ["clip_benchmark"]
    return shlex.join(prefix + clip_benchmark_eval_args(result))


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
    from the directory as a ``local-dir``), absolute, so that the file reruns from any folder."""
    if ckpt.is_dir():
        return os.path.abspath(models._local_weights(ckpt) or ckpt / models.WEIGHTS_FILE)
    return os.path.abspath(ckpt)


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
    if isinstance(recorded.get("size"), int):       # open_clip's image_transform reads size s as (s, s)
        recorded["size"] = (recorded["size"], recorded["size"])
    differ = sorted(k for k, v in recorded.items() if v != expected[k])
    if differ:
        notes.append("open_clip preprocesses a weights file with its defaults, and this checkpoint records other "
                     + ", ".join(f"{k} ({recorded[k]} against {expected[k]})" for k in differ)
                     + ": CLIP_benchmark's numbers for it will differ from these")
    return notes


def write_clip_benchmark(out_dir: Path, metrics: dict, model: str, pretrained: str,
                         sources: dict | None = None) -> list[Path]:
    """``clip_benchmark_results`` as CLIP_benchmark writes them (``json.dump``), under the names it gives them;
    each re-runnable one's command printed."""
    written = []
    for r in clip_benchmark_results(metrics, model, pretrained, sources=sources):
        path = out_dir / clip_benchmark_file_name(r)
        atomic_write(path, json.dumps(r))
        written.append(path)
        if NOT_RERUNNABLE not in r:
            print(f"[negft] clip_benchmark: rerun {r['dataset']}: {clip_benchmark_command(r)}", flush=True)
    return written



def write_for(out_dir: Path, metrics: dict, bundle: models.Bundle, path: Path | None, info: dict, *, ckpt: str,
              model: str, pretrained: str, datasets=()) -> None:
    """CLIP_benchmark's files for the evaluated model (``ckpt=`` / ``model=`` / ``pretrained=`` as ``eval.py`` was
    given them; ``path`` the checkpoint's folder or file, ``info`` its ``negft`` block, ``datasets`` the evaluated
    ones, whose webdataset folders are named for CLIP_benchmark: ``wds_sources``), named so that
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
    for p in write_clip_benchmark(out_dir / "clip_benchmark", metrics, model, weights, wds_sources(datasets)):
        print(f"[negft] clip_benchmark: {p}", flush=True)
