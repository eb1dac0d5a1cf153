"""The demo run clean and with 1% of its fine-tuning samples broken, side by side.

    python experiments/corrupt_demo.py [--size demo] [--cache ~/.cache/negft] [--out runs/corrupt] [extra overrides]

Both runs start from the same cached base model (``recipe=world-pretrain``, trained first if not cached) and read
the same world, except that the corrupted run's fine-tuning shards have one sample in 100 broken
(``negft/world/formats/faults.py``: an image cut short, a json cut short, an MCQ answer out of range, an
image missing, in turn). Prints a markdown table of the headline metrics (last epoch, 95% bootstrap intervals) and
the corrupted run's skip counts. ``train.max_skipped=0.02``: 1% broken is the default limit itself, which an
epoch's partial last pass can cross by a sample. The tiny-world version of this comparison is the slow test
``tests/test_faults_data.py::test_a_demo_run_with_one_percent_of_its_samples_corrupted_matches_a_clean_run``.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from negft.config import default_cache  # noqa: E402

HEADLINE = ("mcq_neg/world/acc", "mcq_neg/world/acc_affirmation", "mcq_neg/world/acc_negation",
            "mcq_neg/world/acc_hybrid", "retrieval/world/r5", "retrieval_neg/world/r5", "zeroshot/world/top1",
            "relcomp/world/group")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="demo", choices=["tiny", "demo", "full"])
    ap.add_argument("--cache", default=default_cache())
    ap.add_argument("--out", default=str(REPO / "runs" / "corrupt"))
    ap.add_argument("--fraction", type=float, default=0.01)
    args, extra = ap.parse_known_args()
    from negft.world.generator import build_world
    from negft.world.formats.faults import corrupted_world
    cache, out = Path(args.cache).expanduser(), Path(args.out)
    world = cache / f"world-s0-{args.size}"
    build_world(world, seed=0, size=args.size)
    bad_cache = out / "cache"
    if not bad_cache.exists():
        print("broken samples:", corrupted_world(world, bad_cache, args.fraction), flush=True)
    common = ["train.py", "recipe=demo", "data=world", f"world.size={args.size}", "patch.sweep=false",
              "train.max_skipped=0.02", *extra]
    ledgers = {}
    for name, where in (("clean", cache), ("corrupted", bad_cache)):
        run = out / name
        if not (run / ".bench-done").exists():        # a finished run is reused
            proc = subprocess.run([sys.executable, *common, f"world.cache={where}", f"out={run}"], cwd=REPO)
            if proc.returncode:
                sys.exit(f"{name} run failed ({proc.returncode})")
            (run / ".bench-done").touch()
        ledgers[name] = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    clean, bad = ledgers["clean"], ledgers["corrupted"]
    cell = lambda e, k: f"{e['metrics'][k]:.3f} [{e['ci95'][k][0]:.3f}, {e['ci95'][k][1]:.3f}]"
    print(f"\nworld {args.size}, demo recipe {' '.join(extra)}; last epoch {clean[-1]['epoch']}; 95% bootstrap intervals\n")
    print("| metric | epoch 0 (base) | clean | 1% corrupted | inside each other's interval |")
    print("|---|---|---|---|---|")
    for k in HEADLINE:
        a, b = clean[-1], bad[-1]
        inside = (a["ci95"][k][0] <= b["metrics"][k] <= a["ci95"][k][1]
                  and b["ci95"][k][0] <= a["metrics"][k] <= b["ci95"][k][1])
        print(f"| {k} | {cell(clean[0], k)} | {cell(a, k)} | {cell(b, k)} | {'yes' if inside else 'NO'} |")
    print("\ncorrupted run, data counts per epoch:")
    for e in bad[1:]:
        print(f"  epoch {e['epoch']}: " + "; ".join(
            f"{s}: read {d['read']}, skipped {d['skipped']}, fraction {d['fraction_skipped']:.4f}"
            for s, d in e.get("data", {}).items()))


if __name__ == "__main__":
    main()
