"""The time from a ``train.py`` run's ``[negft] done:`` line to its process's exit: what the interpreter's shutdown
costs each run, each rank and each test that starts one (Python's last full garbage collection walked every object
the imports made before ``negft.commands.keys.skip_the_last_collection``).

    python bench/exit_lag.py [--repeat 3] [--repo CHECKOUT ...]     # two checkouts: alternating, paired

A two-step run of the demo recipe on the tiny world (its world and base are built first if the cache lacks them).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARGS = ["recipe=demo", "world.size=tiny", "epochs=1", "train.steps_per_epoch=2", "eval.suite=none",
        "patch.sweep=false", "train.workers=1"]


def lag(repo: Path) -> float:
    out = Path(tempfile.mkdtemp(prefix="exit-lag-")) / "run"
    try:
        proc = subprocess.Popen([sys.executable, "-u", "train.py", *ARGS, f"out={out}"], cwd=repo,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        done = None
        for line in proc.stdout:
            if line.startswith("[negft] done:"):
                done = time.perf_counter()
        proc.wait()
        if proc.returncode or done is None:
            raise SystemExit(f"{repo}: the run failed (exit {proc.returncode})")
        return time.perf_counter() - done
    finally:
        shutil.rmtree(out.parent, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--repo", action="append", type=Path, help="checkouts to compare (default: this one)")
    args = ap.parse_args()
    repos = args.repo or [REPO]
    lag(repos[0])           # the cache's world and base, built once, outside the timing
    times = {r: [] for r in repos}
    for _ in range(args.repeat):
        for r in repos:
            times[r].append(lag(r))
    for r, ts in times.items():
        print(f"{r}: done -> exit " + ", ".join(f"{t:.2f} s" for t in ts))


if __name__ == "__main__":
    main()
