"""How fast this machine runs one step of the world base's pretraining, in plain PyTorch (no negft loop, no data).

    python bench/pretrain_step.py [--threads 2] [--steps 15]

negft-tiny-rn at the world-pretrain recipe's batch (128 images of 64 px, 128 captions) through forward, backward and
AdamW, with the timings split. The world's numbers and the demo's time depend on the CPU (bench/RESULTS.md, "The
demo's time"): this says which kind of machine a timing came from. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from negft import models


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=15)
    args = ap.parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    model = models.build("negft-tiny-rn").model.train()
    images = torch.randn(128, 3, 64, 64)
    tokens = torch.randint(1, 49000, (128, 32))
    tokens[:, 12], tokens[:, 13:] = 49407, 0                        # end-of-text at 12, padding after
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    labels = torch.arange(128)

    def step(parts: dict) -> None:
        t0 = time.perf_counter()
        fi = F.normalize(model.encode_image(images), dim=-1)
        t1 = time.perf_counter()
        ft = F.normalize(models.encode_text_trimmed(model, tokens), dim=-1)
        t2 = time.perf_counter()
        logits = model.logit_scale.exp() * fi @ ft.T
        ((F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2).backward()
        t3 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=False)
        t4 = time.perf_counter()
        for k, v in zip(("image forward", "text forward", "backward", "AdamW"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            parts[k] = parts.get(k, 0.0) + v

    for _ in range(3):
        step({})
    parts: dict = {}
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step(parts)
    total = (time.perf_counter() - t0) / args.steps
    split = ", ".join(f"{k} {v / args.steps * 1000:.0f}" for k, v in parts.items())
    print(f"[pretrain_step] {args.threads} thread(s): {total * 1000:.0f} ms/step ({split} ms)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
