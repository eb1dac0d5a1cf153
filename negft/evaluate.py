"""Run a probe suite over a model and its datasets; the one evaluation used by train.py and eval.py."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from negft import probes
from negft.probes.base import Dataset, EvalContext, ProbeResult
from negft.probes.stats import one_blas_thread

DATA_ROOT = Path(os.environ.get("NEGFT_DATA", "data")).expanduser()

# Real probe datasets: short name, folder under $NEGFT_DATA, manifest describing it.
REAL_DATASETS = (
    Dataset("coco", DATA_ROOT / "negbench" / "coco", "negbench_coco"),
    Dataset("voc2007", DATA_ROOT / "negbench" / "voc2007", "negbench_voc2007"),
    Dataset("imagenet", DATA_ROOT / "imagenet" / "val", "imagenet_val"),
    Dataset("relcomp", DATA_ROOT / "relcomp" / "test", "relcomp"),
    Dataset("vlu", DATA_ROOT / "vlu", "vlu"),
    Dataset("snare", DATA_ROOT / "snare", "snare"),
    Dataset("probe_rcb", DATA_ROOT / "probe_rcb", "probe_rcb"),
)
# Which probes each real dataset serves (the world serves all).
REAL_PROBES = {"coco": ("mcq_neg", "retrieval", "retrieval_neg", "analysis"), "voc2007": ("mcq_neg", "analysis"),
               "imagenet": ("zeroshot",), "relcomp": ("relcomp", "analysis"), "vlu": ("vlu",), "snare": ("snare",),
               "probe_rcb": ("probe_r", "probe_c", "probe_b")}


def world_root(info: dict, world_dir: str = "") -> Path:
    """The world a checkpoint was trained on (``world_dir`` wins over its record), checked to exist."""
    root = Path(world_dir or info.get("world_dir", ""))
    if not (root / "world.json").exists():
        raise FileNotFoundError(f"world data not found at '{root}': pass world_dir=DIR (built by `negft data world`)")
    return root


def datasets_for(world_split_dir: Path | None) -> list[Dataset]:
    if world_split_dir is not None:
        return [Dataset("world", Path(world_split_dir))]
    return list(REAL_DATASETS)


@torch.no_grad()
def evaluate(model, preprocess, tokenizer, datasets: list[Dataset], suite: str = "default",
             batch_size: int = 256, n_boot: int = 1000, device="cpu", image_cache: dict | None = None,
             text_cache: dict | None = None, token_cache: dict | None = None, pixel_cache=None) -> ProbeResult:
    """The suite's metrics on ``datasets``; the texts the probes declare are encoded first, in one pass."""
    # restore each module's own mode: a frozen tower stays in eval mode (its norm statistics fixed)
    modes = {m: m.training for m in model.modules()}
    model.eval()
    ctx = EvalContext(model, preprocess, tokenizer, device, batch_size, n_boot, datasets,
                      image_cache=image_cache, text_cache=text_cache, token_cache=token_cache,
                      pixel_cache=pixel_cache)
    plan = [(name, dataset) for name in probes.suite(suite) for dataset in datasets
            if dataset.name not in REAL_PROBES or name in REAL_PROBES[dataset.name]]
    declared = [t for name, dataset in plan if name in probes.TEXTS for t in probes.TEXTS[name](dataset)]
    if declared:
        ctx.encode_texts(declared)
    result = ProbeResult()
    with one_blas_thread():
        for name, dataset in plan:
            result.update(probes.PROBES[name](ctx, dataset))
    for m, training in modes.items():
        m.training = training
    return result


def write_figures(result: ProbeResult, out_dir: Path) -> list[Path]:
    """Each probe's figure drawn from its records into ``out_dir/<probe>__<dataset>.png``."""
    written = []
    for prefix, records in result.records.items():
        draw = probes.FIGURES.get(prefix.split("/")[0])
        if draw and records:
            out_dir.mkdir(parents=True, exist_ok=True)
            path = out_dir / (prefix.replace("/", "__") + ".png")
            tmp = path.with_name(f".{path.name}.tmp.png")      # a killed run leaves no half-drawn figure
            draw(records, tmp)
            tmp.replace(path)
            written.append(path)
    return written
