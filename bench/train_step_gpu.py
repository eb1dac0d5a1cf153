"""One NegFull training step (forward + backward + optimizer step) of a real architecture on random data.

    python bench/train_step_gpu.py [--arch ViT-B-32] [--negcap 256] [--negmcq 64] [--text-len 34]
                                   [--modes ds-bf16,ds-fp32,autocast-bf16] [--steps 20]

Why: train.py's samples/s (progress bar, ``train/samples_per_s``) counts the data loader too (PNG decode and
the 224-pixel transform in its workers); this times the model step alone, at the negfull recipe's batch sizes
(256 NegCap images and captions + 64 NegMCQ images × 4 options), through the same code the loop runs
(``DualEncoderTask`` + ``NegFullLoss`` on a DeepSpeed engine built from ``deepspeed_config``), so the two
numbers say which of them limits a run. Modes: ``ds-bf16`` / ``ds-fp32`` are the engine with
``train.precision`` bf16 / fp32 (``--zero`` its stage, default the recipe's 1); ``ds-fp32-tf32`` the same
with TF32 matrix products allowed; ``autocast-bf16`` fp32 weights under ``torch.autocast``.
``--text-len`` is the tokens up to the end-of-text token after trimming: about 34 for a world step (its
longest caption), up to 77 for real captions. Prints the median step time and its phases (forward,
backward, optimizer step; the device synchronised between them), samples/s (images: NegCap + NegMCQ) and
peak GPU memory per mode. Runs on CPU with tiny sizes too:

    python bench/train_step_gpu.py --arch negft-tiny-rn --negcap 8 --negmcq 2 --steps 2 --modes ds-fp32,autocast-bf16
"""
from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft import models  # noqa: E402
from negft.config import Config  # noqa: E402
from negft.train.loop import batch_to  # noqa: E402
from negft.train.task import DualEncoderTask, build_loss  # noqa: E402


def random_batch(bundle, negcap: int, negmcq: int, options: int, text_len: int, gen: torch.Generator) -> dict:
    size = getattr(bundle.model.visual, "image_size", 224)
    size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)

    def tokens(n: int) -> torch.Tensor:
        length = min(text_len, bundle.tokenizer.context_length)
        t = bundle.tokenizer(["a " * (length - 2)] * n)         # start, length - 2 words, end of text
        sot = int(t[0, 0])
        t[:, 1:length - 1] = torch.randint(0, sot, (n, length - 2), generator=gen)
        return t

    return {"contrastive": {"images": torch.randn(negcap, 3, *size, generator=gen), "texts": tokens(negcap)},
            "mcq": {"images": torch.randn(negmcq, 3, *size, generator=gen),
                    "options": tokens(negmcq * options).view(negmcq, options, -1),
                    "answers": torch.randint(0, options, (negmcq,), generator=gen)}}


def to(batch: dict, device, dtype) -> dict:
    return {task: batch_to(b, device, dtype) for task, b in batch.items()}


class Clock:
    """Wall time of a step's phases (forward, backward, optimizer), the device synchronised at each mark."""

    def __init__(self, device):
        self.device, self.phases, self.t = device, {}, 0.0

    def mark(self, phase: str | None = None):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        if phase is not None:
            self.phases.setdefault(phase, []).append(now - self.t)
        self.t = now


def time_steps(step, steps: int, warmup: int, clock: Clock) -> dict[str, list[float]]:
    for i in range(warmup + steps):
        if i == warmup:
            clock.phases = {}
        clock.mark()
        step()
    return clock.phases


def run_mode(mode: str, args, batch: dict) -> dict:
    import deepspeed
    from negft.train.loop import deepspeed_config, param_groups
    torch.manual_seed(0)
    bundle = models.build(args.arch, "")
    task = DualEncoderTask(bundle.model, build_loss(Config().loss, {"contrastive", "mcq"}))
    task.loss.alpha = args.alpha
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = mode == "ds-fp32-tf32"
    if mode.startswith("ds-"):
        cfg = Config()
        cfg.train.precision = "bf16" if mode == "ds-bf16" else "fp32"
        cfg.train.zero_stage = args.zero
        optimizer = torch.optim.AdamW(param_groups(task, 0.1), lr=1e-6, betas=(0.9, 0.98), eps=1e-6)
        engine, *_ = deepspeed.initialize(model=task, optimizer=optimizer,
                                          config=deepspeed_config(cfg, args.negcap))
        device, dtype = engine.device, next(engine.module.parameters()).dtype
        data = to(batch, device, dtype)

        def step():
            loss, _ = engine(**data)
            clock.mark("forward")
            engine.backward(loss)
            clock.mark("backward")
            engine.step()
            clock.mark("optimizer")
    else:
        device = torch.device(args.device)
        task.to(device)
        optimizer = torch.optim.AdamW(param_groups(task, 0.1), lr=1e-6, betas=(0.9, 0.98), eps=1e-6)
        data = to(batch, device, torch.float32)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss, _ = task(**data)
            clock.mark("forward")
            loss.backward()
            clock.mark("backward")
            torch.nn.utils.clip_grad_norm_(task.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            clock.mark("optimizer")
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    clock = Clock(device)
    phases = time_steps(step, args.steps, args.warmup, clock)
    torch.backends.cuda.matmul.allow_tf32 = tf32
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else float("nan")
    times = [sum(t) for t in zip(*phases.values())]
    med = statistics.median(times)
    return {"mode": mode, "step_ms": 1000 * med, "min_ms": 1000 * min(times),
            "phases_ms": {k: 1000 * statistics.median(v) for k, v in phases.items()},
            "samples_s": (args.negcap + args.negmcq) / med, "peak_gib": peak}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="ViT-B-32")
    ap.add_argument("--negcap", type=int, default=256)
    ap.add_argument("--negmcq", type=int, default=64)
    ap.add_argument("--options", type=int, default=4)
    ap.add_argument("--text-len", type=int, default=34)
    ap.add_argument("--alpha", type=float, default=0.99)
    ap.add_argument("--zero", type=int, default=1)
    ap.add_argument("--modes", default="ds-bf16,ds-fp32,autocast-bf16")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    from negft.train.loop import init_distributed
    init_distributed()
    bundle = models.build(args.arch, "")
    batch = random_batch(bundle, args.negcap, args.negmcq, args.options, args.text_len,
                         torch.Generator().manual_seed(0))
    del bundle
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"{args.arch}: {args.negcap} NegCap + {args.negmcq} NegMCQ images × {args.options} options, text "
          f"{args.text_len} tokens, ZeRO {args.zero}, {args.steps} timed steps after {args.warmup}; {name}",
          flush=True)
    for mode in args.modes.split(","):
        r = run_mode(mode, args, batch)
        print(f"{r['mode']:14s} step {r['step_ms']:8.1f} ms (min {r['min_ms']:8.1f})  "
              f"{r['samples_s']:8.0f} samples/s  peak {r['peak_gib']:.2f} GiB  ("
              + ", ".join(f"{k} {v:.1f}" for k, v in r["phases_ms"].items()) + " ms)", flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
