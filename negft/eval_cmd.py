"""``eval.py``: evaluate one checkpoint and write results.json, results.md and examples/."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from negft import models
from negft.evaluate import datasets_for, evaluate, write_figures
from negft.train.ledger import atomic_write, now


def _world_split(ckpt: Path, data: str, split: str, world_dir: str) -> Path | None:
    cfg_file = ckpt / models.CONFIG_FILE
    extra = json.loads(cfg_file.read_text()).get("negft", {}) if cfg_file.exists() else {}
    if (data or extra.get("data", "real")) != "world":
        return None
    root = Path(world_dir) if world_dir else Path(extra.get("world_dir", ""))
    if not (root / "world.json").exists():
        raise FileNotFoundError(f"world data not found at '{root}': pass world_dir=DIR (built by `negft data world`)")
    return root / split


def evaluate_checkpoint(ckpt: str, out: str, model: str, pretrained: str, suite: str, data: str, split: str,
                        batch_size: str, bootstrap: str, world_dir: str) -> Path:
    path = Path(ckpt)
    if path.is_dir():
        bundle = models.build(model, models.LOCAL_DIR + str(path))
    elif path.is_file():
        bundle = models.build(model, str(path))
    else:
        raise FileNotFoundError(f"ckpt '{ckpt}' is neither a checkpoint directory nor a file")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    datasets = datasets_for(_world_split(path if path.is_dir() else path.parent, data, split, world_dir))
    result = evaluate(bundle.model.to(device), bundle.preprocess_val, bundle.tokenizer, datasets, suite,
                      int(batch_size), int(bootstrap), device)
    out_dir = Path(out)
    payload = {"ckpt": str(path), "time": now(), "suite": suite, "metrics": result.metrics,
               "ci95": result.ci95, "skipped": result.skipped}
    atomic_write(out_dir / "results.json", json.dumps(payload, indent=2) + "\n")
    lines = [f"# Evaluation of `{path}`", "", "| metric | value | 95% interval |", "|---|---|---|"]
    lines += [f"| {k} | {v:.4f} | [{result.ci95[k][0]:.4f}, {result.ci95[k][1]:.4f}] |"
              for k, v in sorted(result.metrics.items())]
    if result.skipped:
        lines += ["", "Skipped:", ""] + [f"- `{k}`: {v}" for k, v in sorted(result.skipped.items())]
    atomic_write(out_dir / "results.md", "\n".join(lines) + "\n")
    for prefix, records in result.records.items():
        atomic_write(out_dir / "examples" / (prefix.replace("/", "__") + ".jsonl"),
                     "".join(json.dumps(r) + "\n" for r in records))
    write_figures(result, out_dir / "figures")
    return out_dir / "results.json"
