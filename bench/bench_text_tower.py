"""Text tower cost: open_clip's ``encode_text`` against ``negft.models.encode_text_trimmed`` (padding cut after
the batch's last end-of-text token, last block at the pooled positions only) and ``encode_text_grouped`` (the
same over groups of rows of similar length, as a training step on a CPU encodes its texts).

    python bench/bench_text_tower.py [ARCH] [--batch 320]

A random-weight ARCH (default negft-tiny; ViT-B-32 works too) encodes ``batch`` world-like captions: forward and
backward (a training step's text side; the demo's step encodes 64 NegCap captions and 64 × 4 MCQ options)
and forward without gradients (evaluation). Prints the best of 5 timings of each, in ms.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft import models  # noqa: E402


def best_ms(fn, repeats: int = 5) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1000 * min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arch", nargs="?", default="negft-tiny")
    ap.add_argument("--batch", type=int, default=320)
    args = ap.parse_args()
    bundle = models.build(args.arch, "")
    model = bundle.model
    shapes, colours = ("star", "heart", "cross", "ring", "circle"), ("red", "blue", "green", "gold")
    captions = [f"this image does not feature a {s}, but it has a {c} {t} above a small {s}"[: 20 + 7 * (i % 9)]
                for i, (s, c, t) in enumerate((s, c, t) for s in shapes for c in colours for t in shapes)]
    tokens = bundle.tokenizer((captions * (args.batch // len(captions) + 1))[:args.batch])
    encoders = {"open_clip encode_text": model.encode_text,
                "encode_text_trimmed": lambda t: models.encode_text_trimmed(model, t),
                "encode_text_grouped": lambda t: models.encode_text_grouped(model, t)}
    print(f"{args.arch}, {args.batch} captions, {torch.get_num_threads()} threads")
    for name, encode in encoders.items():
        def train_step():
            model.zero_grad()
            encode(tokens).square().sum().backward()
        model.train()
        fwd_bwd = best_ms(train_step)
        model.eval()
        with torch.no_grad():
            fwd = best_ms(lambda: encode(tokens))
        print(f"{name:24s} forward+backward {fwd_bwd:7.1f} ms   forward, no grad {fwd:7.1f} ms")


if __name__ == "__main__":
    main()
