"""negft against open_clip's own trainer on the same model, precision, batch and steps: samples/s, MFU.

    python bench/throughput.py                        # CPU: negft-tiny, fp32, batch 64, 20 timed steps, 1 thread
    python bench/throughput.py --model ViT-B-32 --precision bf16 --batch 256 --steps 40 --workers 8 --world

Runs, one after the other, each in a fresh process:

- ``open_clip_train``: ``python -m open_clip_train.main --dataset-type synthetic`` (its loader workers
  transform one blank image per sample; texts are "Dummy caption" padded to the context);
- ``negft synthetic``: ``train.py recipe=negcap train.synthetic=true`` (random images and full-length texts
  made on the device, so trimming the texts saves nothing: the same model work per sample);
- ``negft world`` (``--world``): the same on the embedded world's PNG shards at the model's image size, through
  negft's real loader (``--workers`` per rank), evaluation and checkpoints outside the timed steps.

With ``--repeat N`` (3 by default on CPU, where other processes share the cores) the trainers run N times in
alternation and each row gives the median run. Each trainer runs 5 warm-up + ``--steps`` steps; the rate is over the last ``--steps``, the device
synchronised at both ends (negft prints it at the end of its epoch; open_clip_train's "Batch (t)" averages
over log windows of ``--warmup`` steps, the first two windows left out). Peak memory: the GPU's peak allocation,
or the process's peak RSS on CPU. MFU: FLOPs of one forward + backward of the open_clip model and the CLIP loss,
counted by ``torch.utils.flop_counter.FlopCounterMode`` (texts at the full context), over the peak rate of a
large matrix product measured here (bf16 on a GPU for bf16, TF32 for fp32; fp32 on CPU). The last line is the
ratio of negft's synthetic rate to open_clip_train's.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from negft.config import default_cache  # noqa: E402

WARM = 5          # negft's WARM_STEPS: the steps its epoch rate leaves out

# Both trainers start through this prelude: negft's tiny architectures registered with open_clip, and the peak
# memory printed at exit. open_clip_train imports pandas for its CSV dataset only; a stub stands in if it is absent.
PRELUDE = """
import atexit, importlib.machinery, resource, sys, types
try:
    import pandas
except ImportError:
    sys.modules['pandas'] = types.ModuleType('pandas')
    sys.modules['pandas'].__spec__ = importlib.machinery.ModuleSpec('pandas', None)
import open_clip, torch
open_clip.add_model_config({configs!r})
if {threads}:
    torch.set_num_threads({threads})
def _peak():
    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else \\
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print('PEAK_BYTES', peak, flush=True)
atexit.register(_peak)
sys.argv = [sys.argv[0]] + sys.argv[1:]
{main}
"""
PEER_MAIN = "from open_clip_train.main import main\nmain(sys.argv[1:])"
NEGFT_MAIN = "from negft.commands.train import main\nsys.exit(main(sys.argv[1:]))"


def run(main: str, argv: list[str], log: Path, threads: int = 0) -> tuple[str, float]:
    code = PRELUDE.format(configs=str(REPO / "negft" / "model_configs"), main=main, threads=threads)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])}
    t0 = time.time()
    proc = subprocess.run([sys.executable, "-c", code, *argv], cwd=REPO, env=env, capture_output=True, text=True)
    out = proc.stdout + proc.stderr
    log.write_text(out)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(argv)}\n{out[-3000:]}")
    return out, time.time() - t0


def peak_bytes(out: str) -> float:
    found = re.findall(r"PEAK_BYTES (\d+)", out)
    return float(found[-1]) if found else float("nan")


def peer_row(args, tmp: Path) -> dict:
    argv = ["--dataset-type", "synthetic", "--train-num-samples", str(args.batch * (WARM + args.steps)),
            "--model", args.model, "--batch-size", str(args.batch),
            "--precision", "amp_bf16" if args.precision == "bf16" else "fp32", "--epochs", "1",
            "--workers", str(args.workers), "--log-every-n-steps", str(WARM), "--save-frequency", "0",
            "--zeroshot-frequency", "0", "--val-frequency", "0", "--report-to", "", "--logs", str(tmp / "peer"),
            "--name", "bench", "--device", args.device, "--warmup", "10", "--lr", "1e-4", "--seed", "0"]
    out, wall = run(PEER_MAIN, argv, tmp / "peer.log", args.threads)
    # "Batch (t): 0.123," per log line: the mean over the steps since the line before
    windows = [float(x) for x in re.findall(r"Batch \(t\): ([0-9.]+),", out)]
    lines = re.findall(r"\[\s*(\d+)/\d+ ", out)
    done = [int(n) // args.batch for n in lines]
    timed = list(zip(windows, done))[2:]              # line 1: step 1; line 2: steps 2..WARM+1
    steps = [d - p for (_, p), (_, d) in zip(list(zip(windows, done))[1:], timed)]
    seconds = sum(w * n for (w, _), n in zip(timed, steps))
    ms = 1000 * seconds / sum(steps)
    return {"what": f"open_clip_train (synthetic, {args.workers} workers)", "samples_s": args.batch * 1000 / ms,
            "step_ms": ms, "peak": peak_bytes(out), "wall": wall, "cmd": "python -m open_clip_train.main " + shlex.join(argv)}


def negft_row(args, tmp: Path, world: bool) -> dict:
    argv = ["recipe=negcap", f"out={tmp / ('world' if world else 'synthetic')}", f"model.arch={args.model}",
            "model.pretrained=", f"streams.negcap.batch_size={args.batch}", f"train.precision={args.precision}",
            "epochs=1", f"train.steps_per_epoch={WARM + args.steps}", "optim.lr=1e-4", "optim.warmup_steps=10",
            "train.log_every=1000", *args.negft]
    if world:
        argv += ["data=world", f"world.size={args.world_size}", f"world.cache={args.cache}",
                 f"model.world_arch={args.model}", "model.world_pretrained=", f"train.workers={args.workers}",
                 "eval.suite=zeroshot", "eval.bootstrap=10"]
    else:
        argv += ["train.synthetic=true"]
    out, wall = run(NEGFT_MAIN, argv, tmp / ("negft-world.log" if world else "negft.log"), args.threads)
    m = re.search(r"steps after the first \d+: ([0-9.]+) samples/s, ([0-9.]+) ms/step", out)
    if m is None:
        sys.exit(f"negft printed no epoch rate:\n{out[-3000:]}")
    what = f"negft world {args.world_size} ({args.workers} workers)" if world else "negft synthetic"
    return {"what": what, "samples_s": float(m[1]), "step_ms": float(m[2]), "peak": peak_bytes(out), "wall": wall,
            "cmd": "python train.py " + shlex.join(argv)}


def flops_per_sample(model_name: str) -> float:
    """FLOPs of one forward + backward of the open_clip model and its CLIP loss, per image-text pair."""
    import open_clip
    from torch.utils.flop_counter import FlopCounterMode
    open_clip.add_model_config(REPO / "negft" / "model_configs")
    model = open_clip.create_model(model_name)
    tokenizer = open_clip.get_tokenizer(model_name)
    size = model.visual.image_size
    size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)
    n = 2
    images = torch.randn(n, 3, *size)
    texts = tokenizer(["x " * 200] * n)                       # the whole context
    loss = open_clip.ClipLoss()
    with FlopCounterMode(display=False) as counter:
        image_features, text_features, logit_scale = model(images, texts)[:3]
        loss(image_features, text_features, logit_scale).backward()
    return counter.get_total_flops() / n


def peak_flops(device: str, precision: str) -> tuple[float, str]:
    """The rate of a large matrix product here (the fastest of 10: a peak): bf16 or TF32 on a GPU, fp32 on CPU."""
    if device == "cuda":
        dtype = torch.bfloat16 if precision == "bf16" else torch.float32
        torch.backends.cuda.matmul.allow_tf32 = True
        n = 8192
        a, b = torch.randn(n, n, device="cuda", dtype=dtype), torch.randn(n, n, device="cuda", dtype=dtype)
        times = []
        for i in range(13):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            torch.cuda.synchronize()
            if i >= 3:
                times.append(start.elapsed_time(end) / 1000)
        return 2 * n ** 3 / min(times), "bf16" if dtype == torch.bfloat16 else "TF32"
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    times = []
    for i in range(12):
        t0 = time.perf_counter()
        a @ b
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return 2 * n ** 3 / min(times), f"fp32, {torch.get_num_threads()} threads"


def main() -> None:
    gpu = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="ViT-B-32" if gpu else "negft-tiny")
    ap.add_argument("--precision", default="bf16" if gpu else "fp32", choices=["fp32", "bf16"])
    ap.add_argument("--batch", type=int, default=256 if gpu else 64)
    ap.add_argument("--steps", type=int, default=30 if gpu else 20, help="timed steps, after 5 warm-up steps")
    ap.add_argument("--workers", type=int, default=8 if gpu else 0,
                    help="loader workers (open_clip_train, world); 0 on CPU, where a worker would take a core "
                         "from the step while negft's synthetic batches need none")
    ap.add_argument("--world", action="store_true", help="also negft on the embedded world's shards")
    ap.add_argument("--world-size", default="demo", choices=["tiny", "demo", "full"])
    ap.add_argument("--cache", default=default_cache())
    ap.add_argument("--negft", nargs="*", default=[], help="more negft overrides, e.g. train.compile=true")
    ap.add_argument("--skip-peer", action="store_true")
    ap.add_argument("--threads", type=int, default=0 if gpu else 1,
                    help="torch threads in both trainers (0: torch's default); 1 by default on CPU, where other "
                         "processes may share the cores: with 2 threads a descheduled one stalls the other at "
                         "OpenMP's barriers, and one run took 14 times as long as the next")
    ap.add_argument("--repeat", type=int, default=1 if gpu else 3, help="runs of each trainer, in alternation")
    args = ap.parse_args()
    args.device = "cuda" if gpu else "cpu"
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name() if gpu else f"CPU, {torch.get_num_threads()} threads"
    flops = flops_per_sample(args.model)
    peak, peak_kind = peak_flops(args.device, args.precision)
    print(f"{args.model}, {args.precision}, batch {args.batch}, {WARM} + {args.steps} steps; {name}; "
          f"{flops / 1e9:.2f} GFLOP per sample (forward + backward); peak {peak / 1e12:.1f} TFLOP/s ({peak_kind})",
          flush=True)
    runs: dict[str, list[dict]] = {}
    makers = ([] if args.skip_peer else [lambda tmp: peer_row(args, tmp)]) + [lambda tmp: negft_row(args, tmp, False)] \
        + ([lambda tmp: negft_row(args, tmp, True)] if args.world else [])
    for i in range(args.repeat):
        for make in makers:
            with tempfile.TemporaryDirectory(prefix="negft-throughput-") as d:
                r = make(Path(d))
            runs.setdefault(r["what"], []).append(r)
            print(f"  run {i + 1}: {r['what']}: {r['samples_s']:.1f} samples/s", flush=True)
    rows = [sorted(rs, key=lambda r: r["samples_s"])[len(rs) // 2] for rs in runs.values()]     # the median run
    print()
    for r in rows:
        print(f"  $ {r['cmd']}")
    print()
    print(f"| what | samples/s | step ms | peak {'GPU memory' if gpu else 'RSS'} GiB | MFU | process s | "
          f"samples/s of each run |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        each = ", ".join(f"{x['samples_s']:,.1f}" for x in runs[r["what"]])
        print(f"| {r['what']} | {r['samples_s']:,.1f} | {r['step_ms']:.1f} | {r['peak'] / 2 ** 30:.2f} | "
              f"{100 * r['samples_s'] * flops / peak:.1f}% | {r['wall']:.0f} | {each} |")
    if not args.skip_peer:
        print(f"\nnegft / open_clip_train: {rows[1]['samples_s'] / rows[0]['samples_s']:.2f}×")


if __name__ == "__main__":
    main()
