"""A recipe's stages, each a library call: world → base → fine-tune → patching sweep → release.

``python train.py recipe=demo`` runs ``run(cfg)``: the embedded world is built (once), the world's base model
is the cached result of the ``world-pretrain`` recipe (trained here the first time), the recipe fine-tunes it
(``negft.train.loop.train``), and with ``patch.sweep`` the last epoch is swept toward the base
(``negft.patch_cmd.patch``) and the selected model released (``negft.release.release``). Every rank of a
DeepSpeed launch runs the stages; training is collective, the sweep and the release are rank 0's.
"""
from __future__ import annotations

import json
from pathlib import Path

from negft.config import Config, model_arch
from negft.train.engine import barrier, init_distributed
from negft.train.ledger import write_report
from negft.train.loop import train
from negft.train.recorder import report_title, run_notes
from negft.train.world_base import base_weights
from negft.world.generator import ensure_world


def run(cfg: Config) -> Path:
    """Every stage the recipe asks for; returns the run directory."""
    rank, _, _ = init_distributed(cfg.train.dist_timeout_s)
    if cfg.data == "world":
        ensure_world(cfg, rank)
        barrier()
    base = base_weights(cfg, rank)
    caches = {}
    run_dir = train(cfg, base, caches)
    if rank == 0:
        if cfg.patch.sweep and not cfg.train.synthetic:
            notes = sweep_and_release(cfg, run_dir, base, caches)
            write_report(run_dir, report_title(cfg), run_notes(cfg, run_dir, base) + notes)
        print(f"[negft] done: {run_dir if cfg.train.synthetic else run_dir / 'report.md'}", flush=True)
    barrier()
    return run_dir


# --------------------------------------------------------------------------- after training
def ledger_results(run_dir: Path, epochs: dict[str, int]) -> dict[str, dict]:
    """{name: the ledger's metrics, ci95 and skipped at epoch} for those of ``epochs`` the run's ledger holds."""
    from negft.train.ledger import Ledger
    lines = {line["epoch"]: line for line in Ledger(run_dir).read()}
    return {name: {k: lines[e][k] for k in ("metrics", "ci95", "skipped")} for name, e in epochs.items()
            if e in lines}


def sweep_and_release(cfg: Config, run_dir: Path, base: str, eval_caches: dict | None = None) -> list[str]:
    """patch.sweep: patch the last epoch toward ``base`` (negft patch), release the selected model; returns
    report.md's notes on both. Both are kept if they exist (a re-run into the same run directory), never
    overwritten. ``eval_caches``: the training run's evaluation caches; its frozen tower's features are the
    base's, so the patch's test-split evaluations reuse them where they are the same data at the same precision,
    and take the base's and the last epoch's results from the run's ledger (epoch 0 and the last epoch)."""
    from negft.patch_cmd import patch
    from negft.patching import Rule, parse_alphas, parse_towers
    from negft.release import release
    if not base:
        print("[negft] patch.sweep skipped: the run started from random weights, there is no base to patch "
              "toward", flush=True)
        return []
    last = max((run_dir / "checkpoints").glob("epoch_*"), key=lambda p: int(p.name.split("_")[1]))
    out, rel = run_dir / "patch", run_dir / "release"
    if not (out / "selected.json").exists():
        print(f"[negft] patching sweep: towers {cfg.patch.towers}, alphas {cfg.patch.alphas} → {out}", flush=True)
        # the patch's test split is the one the run evaluated on, the same way: its caches and results carry over
        same_test = cfg.data == "world" and cfg.eval.split == "test" and cfg.train.precision == "fp32"
        patch(base, last, out, parse_alphas(cfg.patch.alphas), parse_towers(cfg.patch.towers),
              Rule(list(cfg.patch.targets), list(cfg.patch.drift), float(cfg.patch.max_drift)),
              suite=cfg.eval.suite, arch=model_arch(cfg), batch_size=cfg.eval.batch_size,
              bootstrap=cfg.eval.bootstrap, test_caches=eval_caches if same_test else None,
              test_results=ledger_results(run_dir, {"base": 0, "finetuned": int(last.name.split("_")[1])})
              if same_test else None)
    if not rel.exists():
        release(out / "selected", rel)
    sel = json.loads((out / "selected.json").read_text())
    print(f"[negft] selected tower {sel['tower']}, alpha {sel['alpha']}; released {rel}", flush=True)
    return ["", f"Patching sweep of `{last.name}` toward the base (α = weight of the fine-tuned model): "
                f"[sweep.png](patch/sweep.png), [sweep.jsonl](patch/sweep.jsonl), "
                f"[selected.json](patch/selected.json) — tower `{sel['tower']}`, α = {sel['alpha']}, chosen on the "
                f"val split by: {sel['rule']}.",
            "Release of the selected model: [release/](release/) ([README.md](release/README.md))."]
