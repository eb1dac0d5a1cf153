"""One NegFull training step (forward + backward + optimizer step) of a real architecture on random data.

    python bench/train_step_gpu.py [--arch ViT-B-32] [--negcap 256] [--negmcq 64] [--text-len 34]
                                   [--modes plain,negft,old] [--steps 20]

Why: train.py's samples/s counts the data loader too; this times the model step alone, at the negfull recipe's
batch sizes (256 NegCap images and captions + 64 NegMCQ images × 4 options; ``--negmcq 0`` makes it a
contrastive step), through the code the loop runs (``NegFullTask``, or ``ClipTask`` without NegMCQ, on a DeepSpeed engine
built from ``deepspeed_config``), against the same step in plain PyTorch. Modes:

- ``plain``: fp32 weights under ``torch.autocast`` (bf16), fused AdamW, ``clip_grad_norm_``: the reference;
  ``plain-compile``: the same with ``torch.compile`` of the task;
- ``negft``: what the loop runs for ``train.precision=bf16`` on one GPU: DeepSpeed's ``torch_autocast`` over fp32
  weights, ZeRO-0, ``SkipNonFiniteAdamW`` (fused, clipping and the non-finite check on the device);
  ``negft-compile``: with ``train.compile``; ``negft-fp32``: ``train.precision=fp32`` (TF32 matmuls);
- ``negft-z1``: the same under ZeRO-1 (DeepSpeed's ZeRO optimizer around the fused AdamW);
- ``bf16w-z1`` / ``bf16w-z0``: ``train.autocast=false``: DeepSpeed casts the weights to bf16 (its bf16 optimizer
  with fp32 master copies, overflow check on), ZeRO-1 / ZeRO-0; ``bf16w-z1-nocheck``: with
  ``"check_grad_overflow": false``;
- ``old``: the loop before these changes (e651d0c): DeepSpeed bf16 weights, ZeRO-1, ``logit_scale`` first in the
  no-decay group (199 of 302 tensors off a 16-byte boundary), PyTorch's default AdamW.

``--text-len`` is the tokens up to the end-of-text token after trimming: about 34 for a world step (its longest
caption), up to 77 for real captions. Prints per mode the median step time running free (the device synchronised
only at the ends of the timed steps), its phases from a second pass synchronised between them (forward,
backward, optimizer), samples/s (images: NegCap + NegMCQ) and peak GPU memory. Runs on CPU with tiny sizes too:

    python bench/train_step_gpu.py --arch negft-tiny-rn --negcap 8 --negmcq 2 --steps 2 --modes negft,plain
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
from negft.train.engine import batch_to  # noqa: E402
from negft.train.task import build_task  # noqa: E402

MODES = ["plain", "plain-compile", "negft", "negft-compile", "negft-fp32", "negft-z1", "bf16w-z1", "bf16w-z0",
         "bf16w-z1-nocheck", "old"]


def random_batch(bundle, negcap: int, negmcq: int, options: int, text_len: int, gen: torch.Generator) -> dict:
    size = getattr(bundle.model.visual, "image_size", 224)
    size = tuple(size) if isinstance(size, (tuple, list)) else (size, size)

    def tokens(n: int) -> torch.Tensor:
        length = min(text_len, bundle.tokenizer.context_length)
        t = bundle.tokenizer(["a " * (length - 2)] * n)         # start, length - 2 words, end of text
        sot = int(t[0, 0])
        t[:, 1:length - 1] = torch.randint(0, sot, (n, length - 2), generator=gen)
        return t

    batch = {"contrastive": {"images": torch.randn(negcap, 3, *size, generator=gen), "texts": tokens(negcap)}}
    if negmcq:
        batch["mcq"] = {"images": torch.randn(negmcq, 3, *size, generator=gen),
                        "options": tokens(negmcq * options).view(negmcq, options, -1),
                        "answers": torch.randint(0, options, (negmcq,), generator=gen)}
    return batch


def to(batch: dict, device, dtype) -> dict:
    return {task: batch_to(b, device, dtype) for task, b in batch.items()}


class Clock:
    """Wall time of a step's phases (forward, backward, optimizer), the device synchronised at each mark."""

    def __init__(self, device, on: bool = True):
        self.device, self.phases, self.t, self.on = device, {}, 0.0, on

    def mark(self, phase: str | None = None):
        if not self.on:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        now = time.perf_counter()
        if phase is not None:
            self.phases.setdefault(phase, []).append(now - self.t)
        self.t = now


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def old_param_groups(module, weight_decay: float) -> list[dict]:
    """The grouping before 16-byte alignment (e651d0c): logit_scale first in the no-decay group."""
    decay, no_decay = [], []
    for name, p in module.named_parameters():
        if not p.requires_grad:
            continue
        exclude = p.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name
        (no_decay if exclude else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_step(mode: str, args, batch: dict, clock: Clock):
    """(step function, device) for ``mode``."""
    import deepspeed
    from negft.train.engine import deepspeed_config, make_optimizer
    torch.manual_seed(0)
    bundle = models.build(args.arch, "")
    loss = Config().loss
    loss.name = "negfull" if "mcq" in batch else "clip"
    loss.negfull.alpha = args.alpha
    task = build_task(bundle.model, loss)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True     # as the loop
    if mode.startswith("plain"):
        device = torch.device(args.device)
        task.to(device)
        if mode == "plain-compile":
            task.compile()
        optimizer = torch.optim.AdamW(old_param_groups(task, 0.1), lr=1e-6, betas=(0.9, 0.98), eps=1e-6,
                                      **({"fused": True} if device.type == "cuda" else {}))
        data = to(batch, device, torch.float32)

        def step():
            with torch.autocast(device.type, dtype=torch.bfloat16):
                loss, _ = task(data)
            clock.mark("forward")
            loss.backward()
            clock.mark("backward")
            torch.nn.utils.clip_grad_norm_(task.parameters(), 1.0, foreach=True)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            clock.mark("optimizer")
        return step, device
    cfg = Config()
    cfg.optim.lr = 1e-6
    cfg.train.precision = "fp32" if mode == "negft-fp32" else "bf16"
    cfg.train.autocast = not mode.startswith(("bf16w", "old"))
    cfg.train.zero_stage = 0 if mode.endswith("z0") else 1
    world = 2 if ("z1" in mode or mode == "old") else 1      # world 2 keeps ZeRO-1 on this one rank
    if mode.endswith("compile"):
        task.compile()
    if mode == "old":
        optimizer = torch.optim.AdamW(old_param_groups(task, 0.1), lr=1e-6, betas=(0.9, 0.98), eps=1e-6)
    else:
        from negft.train.engine import own_clipping
        optimizer = make_optimizer(task, cfg, 1.0 if own_clipping(cfg, world) else 0.0)
    ds = deepspeed_config(cfg, args.negcap, world)
    if mode == "bf16w-z1-nocheck":
        ds["bf16"]["check_grad_overflow"] = False
    engine, wrapped, *_ = deepspeed.initialize(model=task, optimizer=optimizer, config=ds)
    guarded = getattr(optimizer, "guard", None) is not None and wrapped is optimizer
    if hasattr(optimizer, "guard"):
        optimizer.guard = guarded
    device, dtype = engine.device, next(engine.module.parameters()).dtype
    data = to(batch, device, dtype)
    aligned = sum(p.data_ptr() % 16 == 0 for p in engine.module.parameters() if p.requires_grad)
    total = sum(1 for p in engine.module.parameters() if p.requires_grad)
    print(f"  {mode}: {type(wrapped).__name__}, ZeRO-{ds['zero_optimization']['stage']}, weights {dtype}, "
          f"{aligned}/{total} parameters 16-byte aligned", flush=True)

    def step():
        loss, _ = engine(data)
        if guarded:
            optimizer.note_loss(loss)
        clock.mark("forward")
        engine.backward(loss)
        clock.mark("backward")
        engine.step()
        clock.mark("optimizer")
    return step, device


def run_mode(mode: str, args, batch: dict) -> dict:
    clock = Clock(torch.device(args.device), on=False)
    step, device = build_step(mode, args, batch, clock)
    t0 = time.perf_counter()
    for _ in range(args.warmup):
        step()
    sync(device)
    first = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    free = []
    for _ in range(3):                      # free-running: median of three runs of `steps` steps
        sync(device)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            step()
        sync(device)
        free.append((time.perf_counter() - t0) / args.steps)
    clock.on = True
    clock.mark()
    for _ in range(args.steps):
        step()
    phases = clock.phases
    peak = torch.cuda.max_memory_allocated(device) / 2 ** 30 if device.type == "cuda" else float("nan")
    med = statistics.median(free)
    return {"mode": mode, "step_ms": 1000 * med, "spread": 1000 * (max(free) - min(free)),
            "phases_ms": {k: 1000 * statistics.median(v) for k, v in phases.items()},
            "samples_s": (args.negcap + args.negmcq) / med, "peak_gib": peak, "warmup_s": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="ViT-B-32")
    ap.add_argument("--negcap", type=int, default=256)
    ap.add_argument("--negmcq", type=int, default=64)
    ap.add_argument("--options", type=int, default=4)
    ap.add_argument("--text-len", type=int, default=34)
    ap.add_argument("--alpha", type=float, default=0.99)
    ap.add_argument("--modes", default="plain,negft,negft-z1,bf16w-z1,bf16w-z1-nocheck,old")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args()
    from negft.train.engine import init_distributed
    init_distributed()
    bundle = models.build(args.arch, "")
    batch = random_batch(bundle, args.negcap, args.negmcq, args.options, args.text_len,
                         torch.Generator().manual_seed(0))
    del bundle
    name = torch.cuda.get_device_name() if args.device == "cuda" else f"cpu, {torch.get_num_threads()} threads"
    print(f"{args.arch}: {args.negcap} NegCap + {args.negmcq} NegMCQ images × {args.options} options, text "
          f"{args.text_len} tokens, {args.steps} timed steps (×3 free-running, ×1 phased) after {args.warmup}; "
          f"{name}", flush=True)
    rows = []
    for mode in args.modes.split(","):
        if mode not in MODES:
            sys.exit(f"unknown mode '{mode}': {', '.join(MODES)}")
        r = run_mode(mode, args, batch)
        rows.append(r)
        print(f"{r['mode']:17s} step {r['step_ms']:7.1f} ms (±{r['spread'] / 2:.1f})  {r['samples_s']:7.0f} samples/s  "
              f"peak {r['peak_gib']:.2f} GiB  phased: "
              + ", ".join(f"{k} {v:.1f}" for k, v in r["phases_ms"].items()) + f" ms; warm-up {r['warmup_s']:.1f} s",
              flush=True)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    base = next((r for r in rows if r["mode"] == "plain"), None)
    print("\n| mode | step ms | samples/s | fwd / bwd / opt ms (phased) | peak GiB |" + (" vs plain |" if base else ""))
    print("|---|---|---|---|---|" + ("---|" if base else ""))
    for r in rows:
        ph = " / ".join(f"{v:.1f}" for v in r["phases_ms"].values())
        print(f"| {r['mode']} | {r['step_ms']:.1f} | {r['samples_s']:,.0f} | {ph} | {r['peak_gib']:.2f} |"
              + (f" {base['step_ms'] / r['step_ms']:.2f}× |" if base else ""))


if __name__ == "__main__":
    main()
