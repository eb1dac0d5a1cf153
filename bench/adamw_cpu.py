"""AdamW's step on CPU, PyTorch's multi-tensor (``foreach``) form against its fused form, over a model's trainable
parameters with random gradients: the optimizer part of every CPU training step (negft steps the fused form on
every device, ``negft/train/engine.py`` ``make_optimizer``).

    OMP_NUM_THREADS=1 python bench/adamw_cpu.py [--arch negft-tiny] [--steps 20] [--repeat 3]

Prints each form's median ms a step over ``--repeat`` alternating runs, their ratio, and the largest difference
between the two forms' weights after the steps (they round differently in the last bit)."""
from __future__ import annotations

import argparse
import statistics
import time

import torch


def run(arch: str, form: str, steps: int) -> tuple[float, list[torch.Tensor]]:
    from negft import models
    torch.manual_seed(0)
    params = [p for p in models.build(arch, "").model.parameters() if p.requires_grad]
    g = torch.Generator().manual_seed(1)
    grads = [torch.randn(p.shape, generator=g) for p in params]
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, **{form: True})
    for p, gr in zip(params, grads):
        p.grad = gr
    opt.step()                                  # the state is allocated in the first step: not timed
    t = time.perf_counter()
    for _ in range(steps):
        opt.step()
    return (time.perf_counter() - t) / steps * 1000, [p.detach() for p in params]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--arch", default="negft-tiny")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    times: dict[str, list[float]] = {"foreach": [], "fused": []}
    weights = {}
    for _ in range(args.repeat):
        for form in times:
            ms, weights[form] = run(args.arch, form, args.steps)
            times[form].append(ms)
    n = sum(w.numel() for w in weights["fused"])
    print(f"{args.arch}: {n:,} trainable parameters, {torch.get_num_threads()} thread(s), {args.steps} steps")
    for form, ms in times.items():
        print(f"  {form:8s} {statistics.median(ms):8.1f} ms a step  (runs: {', '.join(f'{m:.1f}' for m in ms)})")
    print(f"  fused / foreach: {statistics.median(times['fused']) / statistics.median(times['foreach']):.2f}x the time")
    diff = max((a - b).abs().max().item() for a, b in zip(weights["fused"], weights["foreach"]))
    print(f"  largest weight difference after {args.steps + 1} steps: {diff:.2e}")


if __name__ == "__main__":
    main()
