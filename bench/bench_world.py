"""Benchmark the embedded world generator: images/second for N training images.

    python bench/bench_world.py 20000 [--workers K] [--split pretrain|finetune]

Generates N images into shards in a temporary folder (the same code path as build_world: one task per
1000-image shard, a process pool of ``workers``) and prints images/second.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from negft.world import generator as world  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("n", type=int, nargs="?", default=20000, help="training images to generate")
    ap.add_argument("--workers", type=int, default=os.cpu_count())
    ap.add_argument("--split", default="pretrain", choices=world.TRAIN_SPLITS)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    from tqdm import tqdm

    held = world.held_out_combos(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        tasks = [(args.split, args.seed, s, min(s + world.SHARD_SIZE, args.n), f"{tmp}/shard-{k:06d}.tar", held)
                 for k, s in enumerate(range(0, args.n, world.SHARD_SIZE))]
        def cpu():
            return sum(getattr(resource.getrusage(w), f) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
                       for f in ("ru_utime", "ru_stime"))

        t0, c0 = time.perf_counter(), cpu()
        with tqdm(total=args.n, unit="img", desc=f"{args.split} x{args.workers}") as bar:
            if args.workers == 1:
                for t in tasks:
                    bar.update(world._write_shard(t))
            else:
                with mp.get_context("fork").Pool(args.workers) as pool:
                    for n in pool.imap_unordered(world._write_shard, tasks):
                        bar.update(n)
        dt = time.perf_counter() - t0
        cpu_ms = (cpu() - c0) / args.n * 1e3  # the pool has been joined, so its CPU time is counted
        mb = sum(p.stat().st_size for p in Path(tmp).glob("*.tar")) / 2**20
    print(f"{args.n} {args.split} images in {dt:.2f} s with {args.workers} workers: "
          f"{args.n / dt:.0f} images/s ({mb:.1f} MiB of shards); {cpu_ms:.2f} CPU-ms/image, i.e. "
          f"{1e3 / cpu_ms * args.workers:.0f} images/s on {args.workers} idle cores")


if __name__ == "__main__":
    main()
