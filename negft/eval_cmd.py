"""``eval.py``: evaluate one checkpoint and write results.json, results.md and examples/."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from negft import models
from negft.evaluate import datasets_for, evaluate, world_root, write_figures
from negft.train.ledger import atomic_write, now


def evaluate_checkpoint(ckpt: str, out: str, model: str, pretrained: str, suite: str, data: str, split: str,
                        batch_size: str, bootstrap: str, world_dir: str, base: str = "",
                        quick_gelu: str = "") -> Path:
    """Evaluate ``ckpt``; with ``base`` (a checkpoint, file, tag or ``recorded``) also the base model on
    the same examples, with a paired test per metric. ``quick_gelu`` = true | false | "" (as the checkpoint
    records, ``models.build``) sets the activation of ``ckpt``'s model."""
    path = Path(ckpt)
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
        ref = build_base(base, {"arch": model, **info})
        print(f"[negft] base {base}: act={models.activation(ref.model)}", flush=True)
        base_result = evaluate(ref.model.to(device), ref.preprocess_val, ref.tokenizer, datasets, suite,
                               int(batch_size), int(bootstrap), device)
        p = paired_p_values(base_result.values, result.values, int(bootstrap))
        payload.update(base=base, base_metrics=base_result.metrics, base_ci95=base_result.ci95, paired_p=p)
        lines += [f"Against the base model `{base}` on the same examples; \\* where a paired bootstrap test "
                  "gives p < 0.05.", "", "| metric | base | this model | 95% interval | Δ | p |",
                  "|---|---|---|---|---|---|"]
        for k, v in sorted(result.metrics.items()):
            b = base_result.metrics.get(k, float("nan"))
            star = " \\*" if p.get(k, 1.0) < 0.05 else ""
            lines.append(f"| {k} | {b:.4f} | {v:.4f} | [{result.ci95[k][0]:.4f}, {result.ci95[k][1]:.4f}] | "
                         f"{v - b:+.4f}{star} | {p.get(k, float('nan')):.3g} |")
    else:
        lines += ["| metric | value | 95% interval |", "|---|---|---|"]
        lines += [f"| {k} | {v:.4f} | [{result.ci95[k][0]:.4f}, {result.ci95[k][1]:.4f}] |"
                  for k, v in sorted(result.metrics.items())]
    atomic_write(out_dir / "results.json", json.dumps(payload, indent=2) + "\n")
    if result.skipped:
        lines += ["", "Skipped:", ""] + [f"- `{k}`: {v}" for k, v in sorted(result.skipped.items())]
    atomic_write(out_dir / "results.md", "\n".join(lines) + "\n")
    for prefix, records in result.records.items():
        atomic_write(out_dir / "examples" / (prefix.replace("/", "__") + ".jsonl"),
                     "".join(json.dumps(r) + "\n" for r in records))
    write_figures(result, out_dir / "figures")
    return out_dir / "results.json"
