"""``eval.py``: evaluate one checkpoint and write results.json, results.md and examples/; with
``format=clip_benchmark`` also one JSON per dataset in LAION-AI/CLIP_benchmark's own layout.

CLIP_benchmark's result file (``clip_benchmark/cli.py`` ``run``): ``{"dataset", "model", "pretrained", "task",
"metrics", "language"}`` dumped to ``--output``, by default ``{dataset}_{pretrained}_{model}_{language}_{task}.json``
(``pretrained`` is the file's base name when it is a file; ``dataset`` with ``/`` turned into ``_``); its
``build`` command flattens such files into a table. negft writes them under ``<out>/clip_benchmark/``, with
``pretrained`` the checkpoint as given (its base name in the file name), ``model`` its architecture and
``language`` ``en``. The metrics that correspond, under CLIP_benchmark's names and rules (the ``_official``
variants, which break ties as its ``torch.topk`` / ``argmax`` do, to the lower index):

- ``zeroshot_classification`` (``metrics/zeroshot_classification.py``): ``acc1`` = ``zeroshot/<d>/top1_official``,
  ``acc5`` = ``top5_official`` (NaN with fewer than 5 classes, as CLIP_benchmark writes it),
  ``mean_per_class_recall`` = ``mean_per_class_recall_official``; dataset ``<d>``.
- ``zeroshot_retrieval`` (``metrics/zeroshot_retrieval.py``): ``image_retrieval_recall@k`` (text→image) =
  ``retrieval/<d>/r<k>_official``, ``text_retrieval_recall@k`` (image→text) = ``i2t_r<k>_official``, k = 1, 5, 10;
  dataset ``<d>``, and ``<d>_negated`` for Retrieval-Neg (``retrieval_neg/<d>/...``).

Not written: the MCQ, ARO, SugarCrepe, Winoground and probe families. CLIP_benchmark's nearest task,
``image_caption_selection``, assumes the right caption of each image is its first and reports ``image_acc`` /
``text_acc`` / ``acc`` with argmax ties to the first; NegBench's MCQ, whose answer is not always first
(HardNeg-Syn, CheXpert, the world) and whose metric is NegBench's own, is not that task.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from negft import models
from negft.evaluate import datasets_for, evaluate, world_root, write_figures
from negft.io import atomic_write
from negft.tables import metric_table
from negft.train.ledger import now


FORMATS = ("", "clip_benchmark")
CLIP_BENCHMARK_OUTPUT = "{dataset}_{pretrained}_{model}_{language}_{task}.json"     # CLIP_benchmark's default


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
                "acc1": metrics[f"zeroshot/{d}/top1_official"],
                "acc5": metrics.get(f"zeroshot/{d}/top5_official", math.nan),
                "mean_per_class_recall": metrics[f"zeroshot/{d}/mean_per_class_recall_official"]}))
        for probe, name in (("retrieval", d), ("retrieval_neg", f"{d}_negated")):
            ks = sorted(int(k.split("/")[2][1:-len("_official")]) for k in metrics
                        if k.startswith(f"{probe}/{d}/r") and k.endswith("_official"))
            if ks:
                values = {}
                for k in ks:
                    values[f"image_retrieval_recall@{k}"] = metrics[f"{probe}/{d}/r{k}_official"]
                    values[f"text_retrieval_recall@{k}"] = metrics[f"{probe}/{d}/i2t_r{k}_official"]
                out.append(result(name, "zeroshot_retrieval", values))
    return out


def write_clip_benchmark(out_dir: Path, metrics: dict, model: str, pretrained: str) -> list[Path]:
    """``clip_benchmark_results`` as files named as CLIP_benchmark names them, under ``out_dir``."""
    written = []
    for r in clip_benchmark_results(metrics, model, pretrained):
        name = CLIP_BENCHMARK_OUTPUT.format(dataset=r["dataset"].replace("/", "_"), pretrained=Path(pretrained).name,
                                            model=model, language=r["language"], task=r["task"])
        atomic_write(out_dir / name, json.dumps(r) + "\n")
        written.append(out_dir / name)
    return written


def evaluate_checkpoint(ckpt: str, out: str, model: str, pretrained: str, suite: str, data: str, split: str,
                        batch_size: str, bootstrap: str, world_dir: str, base: str = "",
                        quick_gelu: str = "", format: str = "", verify: str = "true") -> Path:
    """Evaluate ``ckpt``; with ``base`` (a checkpoint, file, tag or ``recorded``) also the base model on
    the same examples, with a paired test per metric. ``quick_gelu`` = true | false | "" (as the checkpoint
    records, ``models.build``) sets the activation of ``ckpt``'s model. ``format=clip_benchmark`` also writes
    ``<out>/clip_benchmark/*.json`` (module docstring). A release (a folder with ``SHA256SUMS``) whose files fail
    their sums is refused unless ``verify=false``; a weights file that is a pickle carrying more than tensors is
    refused always (``models.build``)."""
    from negft.release import check_release, parse_verify
    if format not in FORMATS:
        raise ValueError(f"format='{format}': expected one of {', '.join(f or '(empty)' for f in FORMATS)}")
    checked = parse_verify(verify)
    path = Path(ckpt)
    check_release("ckpt", path, checked)
    act = {"": None, "true": True, "false": False}.get(str(quick_gelu).lower(), "bad")
    if act == "bad":
        raise ValueError(f"quick_gelu='{quick_gelu}': expected true, false or nothing")
    if path.is_dir():
        bundle = models.build(model, models.LOCAL_DIR + str(path), quick_gelu=act)
    elif path.is_file():
        bundle = models.build(model, str(path), quick_gelu=act)
    else:
        raise FileNotFoundError(f"ckpt '{ckpt}' is neither a checkpoint directory nor a file")
    print(f"[negft] eval {path}: act={models.activation(bundle.model)}", flush=True)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    info = models.negft_info(path if path.is_dir() else path.parent)
    world = world_root(info, world_dir) if (data or info.get("data", "real")) == "world" else None
    datasets = datasets_for(world / split if world else None)
    result = evaluate(bundle.model.to(device), bundle.preprocess_val, bundle.tokenizer, datasets, suite,
                      int(batch_size), int(bootstrap), device)
    out_dir = Path(out)
    payload = {"ckpt": str(path), "time": now(), "suite": suite, "metrics": result.metrics,
               "ci95": result.ci95, "skipped": result.skipped}
    lines = [f"# Evaluation of `{path}`", ""]
    if base:
        from negft.patch_cmd import build_base
        from negft.probes.stats import paired_p_values
        ref = build_base(base, {"arch": model, **info}, verify=checked)
        print(f"[negft] base {base}: act={models.activation(ref.model)}", flush=True)
        base_result = evaluate(ref.model.to(device), ref.preprocess_val, ref.tokenizer, datasets, suite,
                               int(batch_size), int(bootstrap), device)
        p = paired_p_values(base_result.values, result.values, int(bootstrap))
        payload.update(base=base, base_metrics=base_result.metrics, base_ci95=base_result.ci95, paired_p=p)
        lines += [f"Against the base model `{base}` on the same examples (mean [95% bootstrap interval]); "
                  "Δ = this model − base, \\* where a paired bootstrap test gives p < 0.05.", ""]
        lines += metric_table([("base", base_result.metrics, base_result.ci95),
                               ("this model", result.metrics, result.ci95)], sorted(result.metrics),
                              reference=base_result.metrics, p_values=p, p_column=True, digits=4)
    else:
        lines += ["Mean [95% bootstrap interval].", ""]
        lines += metric_table([("value", result.metrics, result.ci95)], digits=4)
    atomic_write(out_dir / "results.json", json.dumps(payload, indent=2) + "\n")
    if result.skipped:
        lines += ["", "Skipped:", ""] + [f"- `{k}`: {v}" for k, v in sorted(result.skipped.items())]
    atomic_write(out_dir / "results.md", "\n".join(lines) + "\n")
    for prefix, records in result.records.items():
        atomic_write(out_dir / "examples" / (prefix.replace("/", "__") + ".jsonl"),
                     "".join(json.dumps(r) + "\n" for r in records))
    write_figures(result, out_dir / "figures")
    if format == "clip_benchmark":
        arch = info.get("arch") or model
        for p in write_clip_benchmark(out_dir / "clip_benchmark", result.metrics, arch, str(path)):
            print(f"[negft] clip_benchmark: {p}", flush=True)
    return out_dir / "results.json"
