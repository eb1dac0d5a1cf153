"""Run a probe suite over a model and its datasets; the one evaluation used by train.py and eval.py."""
from __future__ import annotations

from pathlib import Path

import torch

from negft import probes
from negft.data import manifests
from negft.io import atomic_write
from negft.probes.base import Dataset, EvalContext, ProbeResult
from negft.probes.stats import one_blas_thread

def world_root(info: dict, world_dir: str = "") -> Path:
    """The world a checkpoint was trained on (``world_dir`` wins over its record), checked to exist."""
    root = Path(world_dir or info.get("world_dir", ""))
    if not (root / "world.json").exists():
        raise FileNotFoundError(f"world data not found at '{root}': pass world_dir=DIR (built by `negft data world`)")
    return root


def datasets_for(world_split_dir: Path | None) -> list[Dataset]:
    """The world's probe split (every probe reads its files there), or each real evaluation dataset whose
    manifest lists the probes it serves, at its folder under ``$NEGFT_DATA`` (read now, not at import)."""
    if world_split_dir is not None:
        return [Dataset("world", Path(world_split_dir))]
    found = []
    for name in manifests.names():
        man = manifests.load(name)
        if man.get("probes"):
            found.append(Dataset(man["dataset"], manifests.data_root() / man["root"], name, tuple(man["probes"])))
    return found


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
            if dataset.probes is None or name in dataset.probes]
    result = ProbeResult()
    failed = {}
    declared = []
    for name, dataset in plan:
        if name in probes.TEXTS:
            try:
                declared += [t for t in probes.TEXTS[name](dataset) if isinstance(t, str)]
            except Exception as e:
                _failed(result, failed, name, dataset, e)
    if declared:
        ctx.encode_texts(declared)
    with one_blas_thread():
        for name, dataset in plan:
            if (name, dataset.name) in failed:
                continue
            try:
                result.update(probes.PROBES[name](ctx, dataset))
            except Exception as e:
                _failed(result, failed, name, dataset, e)
    for m, training in modes.items():
        m.training = training
    return result


def _failed(result: ProbeResult, failed: dict, name: str, dataset: Dataset, error: Exception) -> None:
    """A probe that fails on a real dataset's files (partial or malformed beyond what its reader checks) is
    skipped with the error, and the other probes run; on the world's split (no manifest) it is a bug: raised."""
    if not dataset.manifest:
        raise error
    why = (f"failed on the files under {dataset.root}: {type(error).__name__}: {str(error)[:300]} (see "
           f"{manifests.shown(dataset.manifest)}; `negft data check {dataset.manifest}` checks them); the "
           "other probes ran")
    failed[(name, dataset.name)] = why
    result.skipped[f"{name}/{dataset.name}"] = why
    print(f"[negft] probe {name} on {dataset.name} skipped: {why}", flush=True)


def write_figures(result: ProbeResult, out_dir: Path) -> list[Path]:
    """Each probe's figure drawn from its records into ``out_dir/<probe>__<dataset>.png`` (whole or not at all)."""
    written = []
    for prefix, records in result.records.items():
        draw = probes.FIGURES.get(prefix.split("/")[0])
        if draw and records:
            path = out_dir / (prefix.replace("/", "__") + ".png")
            written.append(atomic_write(path, lambda p: draw(records, p), suffix=".png"))
    return written
