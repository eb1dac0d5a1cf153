"""How long the step checkpoint a stop signal asks for takes to write, and how big it is: the grace a cluster's
stop signal must leave before its kill.

    python bench/ckpt_grace.py [--model ViT-B-32] [--zero-stage 1] [--ranks 1] [--writes 3] [--out DIR]
                               [--recipe negfull] [KEY=VALUE ...]

On SIGTERM negft finishes its step and writes ``checkpoints/step_S`` (``negft.train.loop.step_checkpoint``:
DeepSpeed's resume state with the AdamW moments, plus the fp32 open_clip weights, renamed into place). Slurm kills
``KillWait`` seconds (30 by default) after its SIGTERM, so that write has to fit in the grace. This builds the
model (random init) inside the loop's own DeepSpeed engine from the recipe (``build_model``, ``build_task``,
``build_engine``, the loop's synthetic batches of ``--batch`` samples per stream), trains ``--steps`` steps so the
AdamW moments exist, then calls ``step_checkpoint`` ``--writes`` times into a run directory under ``--out`` and
prints, per write, the seconds ``step_checkpoint`` took (what the grace must cover), the seconds an fsync of every
file written then took (what the kernel still had to put on the disk), the bytes on disk and the parameter count.

``--out`` (default ``runs/``, where a run's checkpoints go) picks the file system: the write is mostly disk
bandwidth. ``--ranks N`` (N > 1) starts N gloo ranks on the CPU (the environment a cluster's agent gives), for
ZeRO-1/2, which partition the optimizer state over the ranks (on one rank negft runs stages 1 and 2 as 0).
``KEY=VALUE`` overrides go to the recipe as on train.py's command line (``train.precision=bf16``). fp32 by
default: bf16 under ``train.autocast`` (the recipes' setting) keeps fp32 weights and moments, so it writes the
same checkpoint, and on CPU its step is emulated and slow. The run directory is removed at the end.
"""
from __future__ import annotations

import argparse
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft import models  # noqa: E402
from negft.config import load_config, model_arch  # noqa: E402
from negft.train import loop  # noqa: E402
from negft.train.engine import batch_to, init_distributed  # noqa: E402
from negft.train.loop import Run, build_engine, build_model, by_task, open_streams, plan_steps  # noqa: E402
from negft.train.task import build_task  # noqa: E402


def parse(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="ViT-B-32", help="open_clip architecture (random init)")
    ap.add_argument("--recipe", default="negfull", help="the recipe whose towers, streams and optimizer to use")
    ap.add_argument("--zero-stage", type=int, default=None, help="train.zero_stage (default: the recipe's)")
    ap.add_argument("--ranks", type=int, default=1, help="gloo ranks on the CPU (ZeRO-1/2 partition over them)")
    ap.add_argument("--batch", type=int, default=4, help="samples per stream per step")
    ap.add_argument("--steps", type=int, default=2, help="training steps before the first write")
    ap.add_argument("--writes", type=int, default=3, help="step checkpoints to write and time")
    ap.add_argument("--out", default="runs", help="directory the run directory is made in (its file system)")
    ap.add_argument("overrides", nargs="*", help="KEY=VALUE recipe overrides")
    return ap.parse_args(argv)


def config(args, run_dir: Path):
    """The recipe with the benchmark's model, batch and synthetic data; fp32 unless an override says otherwise."""
    argv = [f"recipe={args.recipe}", "data=real", f"model.arch={args.model}", "model.pretrained=",
            "train.synthetic=true", "train.precision=fp32", "train.steps_per_epoch=1000", f"out={run_dir}"]
    if args.zero_stage is not None:
        argv.append(f"train.zero_stage={args.zero_stage}")
    cfg = load_config(argv + list(args.overrides))
    for s in cfg.streams.values():
        s.batch_size = args.batch
    return cfg


def disk_bytes(path: Path) -> tuple[int, int]:
    """(bytes of the files, bytes they take on the disk)."""
    files = [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files), sum(p.stat().st_blocks * 512 for p in files)


def fsync_tree(path: Path) -> None:
    """Put what the write left in the page cache on the disk: each file, then each directory."""
    for p in sorted(path.rglob("*"), key=lambda p: p.is_dir()):
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


class Phases:
    """Seconds spent in the writers that ``step_checkpoint`` calls, by wrapping them where the loop looks them up: how
    a write splits between DeepSpeed's state, the open_clip weights and pruning the step checkpoint before."""

    def __init__(self, engine):
        self.seconds: dict[str, float] = {}
        engine.save_checkpoint = self.timed("DeepSpeed state", engine.save_checkpoint)
        models.write_local_dir = self.timed("open_clip weights", models.write_local_dir)
        loop.prune_step_checkpoints = self.timed("prune the one before", loop.prune_step_checkpoints)

    def timed(self, name: str, fn):
        def wrapper(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
        return wrapper

    def take(self) -> dict[str, float]:
        out, self.seconds = self.seconds, {}
        return out


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def bench(args, run_dir: Path) -> dict:
    """Train ``args.steps`` steps in the loop's engine, then time ``args.writes`` calls of ``step_checkpoint``."""
    cfg = config(args, run_dir)
    rank, world_size, _ = init_distributed(cfg.train.dist_timeout_s)
    torch.manual_seed(cfg.seed + rank)
    plan = plan_steps(cfg, None, world_size)
    bundle, _, uncast_frozen_state = build_model(cfg, "", rank)
    task = build_task(bundle.model, cfg.loss, rank, world_size, cfg.tower)
    engine, adamw, scheduler = build_engine(cfg, task, plan, rank, world_size)
    device, dtype = engine.device, next(engine.module.parameters()).dtype
    streams = open_streams(cfg, plan, bundle, device, dtype, rank, world_size)
    provenance = {"recipe": cfg.recipe, "data": cfg.data, "arch": model_arch(cfg), "base": "", "tower": cfg.tower,
                  "world_dir": "", "run_dir": str(run_dir.resolve())}
    run = Run(cfg, rank, world_size, run_dir, plan, engine, adamw, scheduler, streams, None, bundle, provenance,
              uncast_frozen_state, None, None)

    task_of = {n: s.task for n, s in cfg.streams.items()}
    iters = {name: s.epoch(1, plan.micro_steps) for name, s in streams.items()}
    step_s = []
    for _ in range(args.steps * cfg.train.grad_accum):
        t0 = time.perf_counter()
        batches = {name: batch_to(next(it), device, dtype) for name, it in iters.items()}
        loss, _ = engine(by_task(batches, task_of))
        if adamw.checks:
            adamw.note_loss(loss)
        engine.backward(loss)
        engine.step()
        step_s.append(time.perf_counter() - t0)

    phases = Phases(engine)
    write_s, sync_s, sizes, parts = [], [], [], []
    for i in range(args.writes):
        step = args.steps + i           # a new step_S each time: the one before it is pruned, as in a run
        t0 = time.perf_counter()
        path = loop.step_checkpoint(run, 1, step, step)
        write_s.append(time.perf_counter() - t0)
        parts.append(phases.take())
        t0 = time.perf_counter()
        if rank == 0:
            fsync_tree(path)
        sync_s.append(time.perf_counter() - t0)
        sizes.append(disk_bytes(path) if rank == 0 else (0, 0))
    files = {str(p.relative_to(path)): p.stat().st_size for p in sorted(path.rglob("*")) if p.is_file()} \
        if rank == 0 else {}
    return {"cfg": cfg, "world_size": world_size, "zero": engine.zero_optimization_stage(),
            "params": sum(p.numel() for p in bundle.model.parameters()),
            "trained": sum(p.numel() for p in bundle.model.parameters() if p.requires_grad),
            "step_s": step_s, "write_s": write_s, "parts": parts, "sync_s": sync_s, "sizes": sizes, "files": files,
            "rss": peak_rss_gib()}


def spread(xs: list[float]) -> str:
    return f"{statistics.median(xs):.2f} ({min(xs):.2f}–{max(xs):.2f})"


def report(args, r: dict) -> None:
    cfg = r["cfg"]
    apparent, on_disk = r["sizes"][-1]
    print(f"\n{args.model}, recipe {cfg.recipe}, tower {cfg.tower}, train.precision={cfg.train.precision}, "
          f"train.zero_stage={cfg.train.zero_stage} (runs as ZeRO-{r['zero']} on {r['world_size']} rank(s)); "
          f"{r['params'] / 1e6:.1f} M parameters, {r['trained'] / 1e6:.1f} M trained; step on this CPU "
          f"{spread(r['step_s'])} s; peak RSS of rank 0 {r['rss']:.1f} GiB; checkpoint under {args.out}\n")
    print("| model | ZeRO (ranks) | parameters | write s, median (min–max) | then fsync s | on disk GB | writes |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {args.model} | {r['zero']} ({r['world_size']}) | {r['params'] / 1e6:.1f} M | {spread(r['write_s'])} "
          f"| {spread(r['sync_s'])} | {on_disk / 1e9:.2f} ({apparent:,} B) | {len(r['write_s'])} |\n")
    for name in r["parts"][0]:
        print(f"  {name}: {spread([p.get(name, 0.0) for p in r['parts']])} s")
    for name, n in r["files"].items():
        print(f"  {n / 1e6:10.1f} MB  {name}")


def launch_ranks(argv, n: int) -> int:
    """``n`` copies of this script as the ranks of one gloo job, as a cluster's per-machine agent starts them."""
    with socket.socket() as s:          # a free port for the ranks to meet on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {**os.environ, "WORLD_SIZE": str(n), "LOCAL_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port)}
    procs = [subprocess.Popen([sys.executable, __file__, *argv], env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
             for r in range(n)]
    return max(p.wait() for p in procs)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(argv)
    if args.ranks > 1 and "WORLD_SIZE" not in os.environ:
        return launch_ranks(argv, args.ranks)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    # one name on every rank: the ranks write one checkpoint together
    run_dir = Path(args.out) / f".ckpt_grace.{os.environ.get('MASTER_PORT', os.getpid())}"
    try:
        r = bench(args, run_dir)
        if int(os.environ.get("RANK", 0)) == 0:
            report(args, r)
    finally:
        if int(os.environ.get("RANK", 0)) == 0:
            shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
