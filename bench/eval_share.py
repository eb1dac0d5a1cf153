"""What share of each epoch the probe suite costs, read from a finished run directory.

    python bench/eval_share.py runs/demo

An epoch's wall time is the time between its ledger line and the previous one (training, checkpoint and its
evaluation); the evaluation's own time is the line's ``eval_seconds`` (the probes, their per-example values,
figures and paired tests). Prints one row per epoch and the mean.
"""
import json
import sys
from datetime import datetime
from pathlib import Path


def main(run_dir: str) -> None:
    lines = [json.loads(line) for line in (Path(run_dir) / "ledger.jsonl").read_text().splitlines()]
    stamp = lambda e: datetime.strptime(e["time"], "%Y-%m-%dT%H:%M:%SZ")
    shares = []
    print(f"epoch 0: evaluation {lines[0]['eval_seconds']:.1f} s (before training)")
    for prev, cur in zip(lines, lines[1:]):
        wall = (stamp(cur) - stamp(prev)).total_seconds()
        ev = cur["eval_seconds"]
        shares.append(ev / wall)
        print(f"epoch {cur['epoch']}: wall {wall:.0f} s, evaluation {ev:.1f} s = {100 * ev / wall:.1f}% "
              f"({len(cur['metrics'])} metrics)")
    if shares:
        print(f"mean share of an epoch spent evaluating: {100 * sum(shares) / len(shares):.1f}%")


if __name__ == "__main__":
    main(sys.argv[1])
