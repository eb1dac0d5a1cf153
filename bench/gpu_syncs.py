"""Host round trips of negft's training steps on a GPU, as CUDA itself reports them: with
``torch.cuda.set_sync_debug_mode("warn")`` torch warns at every op that makes the host wait for the device
(``.item()``, ``nonzero``, a blocking copy, a stream or device synchronize). The check ``tests/test_syncs.py`` makes
on a CPU (every op classified by ``negft.train.syncs.HostSyncs``), made here on the device by the device's own
count, for each run of ``negft.train.syncs.RUNS`` on the tiny world: the steps between two log steps must have none.

    python bench/gpu_syncs.py                       # every run, 8 steps, a log step every 4; needs a GPU
    python bench/gpu_syncs.py --runs demo,negclip --jobs 2

Each run is ``train.py RUN data=world world.size=tiny model.world_pretrained= ...`` in a process of its own (the
model initialised at random: what a step runs does not depend on the weights), its steps told apart where the
loop reads its first stream's next batch.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import warnings
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from negft.config import default_cache  # noqa: E402

SYNC_WARNING = "called a synchronizing CUDA operation"


def count_one(name: str, cache: str, steps: int, log_every: int, batch: int) -> dict:
    """One run, counted: {step: [the repository's frames of each sync in it]}."""
    import torch
    from negft.commands.train import main as run_train
    from negft.config import load_config
    from negft.train import loop
    from negft.train.syncs import RUNS, issuers
    found: dict[int, list[list[str]]] = {}
    state = {"step": 0}

    class Counted:
        """The first stream: each batch read begins a step."""

        def __init__(self, inner):
            self.inner = inner

        def __getattr__(self, attr):
            return getattr(self.inner, attr)

        def epoch(self, *args, **kwargs):
            it = self.inner.epoch(*args, **kwargs)
            while True:
                state["step"] += 1
                try:
                    batch = next(it)
                except StopIteration:
                    return
                yield batch

    previous = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message):
            found.setdefault(state["step"], []).append(issuers(2) or [f"{filename}:{lineno}"])
        else:
            previous(message, category, filename, lineno, file, line)

    open_streams, run_epochs = loop.open_streams, loop.run_epochs

    def streams(*args, **kwargs):
        out = open_streams(*args, **kwargs)
        return {k: Counted(s) if i == 0 else s for i, (k, s) in enumerate(out.items())}

    def epochs(*args, **kwargs):
        warnings.showwarning = show
        warnings.filterwarnings("always", message=f".*{SYNC_WARNING}")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            return run_epochs(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = previous
    loop.open_streams, loop.run_epochs = streams, epochs
    argv = [*RUNS[name], "data=world"]
    batches = [f"streams.{s}.batch_size={batch}" for s in load_config(argv).streams] if batch else []
    with tempfile.TemporaryDirectory() as out:
        code = run_train([*argv, *batches, "world.size=tiny", f"world.cache={cache}", "model.world_pretrained=",
                          "eval.suite=none", "patch.sweep=false", "train.workers=0", "epochs=1",
                          f"train.steps_per_epoch={steps}", f"train.log_every={log_every}", f"out={out}/run"])
    return {"run": name, "code": code, "steps": min(state["step"], steps), "found": found}


def summary(r: dict, steps: int, log_every: int) -> dict:
    logs = {n for n in range(1, steps + 1) if n % log_every == 0 or n == steps}
    between = [tuple(f[:3]) for n, fs in r["found"].items() if int(n) not in logs and 1 <= int(n) <= steps
               for f in fs]
    at_logs = sum(len(fs) for n, fs in r["found"].items() if int(n) in logs)
    return {"between": len(between), "at_logs": at_logs, "where": Counter(between)}


def main(argv=None) -> int:
    from negft.train.syncs import RUNS
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", default=",".join(RUNS))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--log-every", type=int, default=4)
    p.add_argument("--batch", type=int, default=0, help="per stream; 0: the recipe's")
    p.add_argument("--jobs", type=int, default=4, help="runs at once (the first alone: it builds the tiny world)")
    p.add_argument("--cache", default=default_cache())
    p.add_argument("--one", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one:
        print(json.dumps(count_one(a.one, a.cache, a.steps, a.log_every, a.batch)))
        return 0
    import torch
    if not torch.cuda.is_available():
        sys.exit("bench/gpu_syncs.py counts what CUDA reports: it needs a GPU (on a CPU: tests/test_syncs.py)")
    names = a.runs.split(",")
    if unknown := [n for n in names if n not in RUNS]:
        sys.exit(f"unknown run {unknown}: {', '.join(RUNS)}")

    def one(name: str) -> dict:
        proc = subprocess.run([sys.executable, __file__, "--one", name, "--steps", str(a.steps), "--log-every",
                               str(a.log_every), "--batch", str(a.batch), "--cache", a.cache],
                              capture_output=True, text=True)
        last = proc.stdout.strip().splitlines()[-1:] if proc.returncode == 0 else []
        if not last or not last[0].startswith("{"):
            return {"run": name, "code": proc.returncode, "error": (proc.stdout + proc.stderr)[-2000:]}
        return json.loads(last[0])
    results = [one(names[0])]
    with ThreadPoolExecutor(a.jobs) as pool:
        results += list(pool.map(one, names[1:]))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; {a.steps} steps, a log step every "
          f"{a.log_every}: host syncs CUDA reported (torch.cuda.set_sync_debug_mode)")
    print("| run | steps | syncs between log steps | syncs at log steps |\n|---|---:|---:|---:|")
    bad = 0
    for r in results:
        if r.get("code") or "error" in r:
            bad += 1
            print(f"| {r['run']} | failed ({r.get('code')}) | | |")
            continue
        s = summary(r, a.steps, a.log_every)
        # the log steps read the loss: a count without them is a counter that saw nothing (a warnings filter of
        # another library ahead of this one), not a clean run
        bad += bool(s["between"]) or not s["at_logs"]
        print(f"| {r['run']} | {r['steps']} | {s['between']} | {s['at_logs'] or '0: the counter saw nothing'} |")
    for r in results:
        if "error" in r:
            print(f"\n{r['run']} failed:\n{r['error']}")
        elif (s := summary(r, a.steps, a.log_every))["between"]:
            print(f"\n{r['run']}'s syncs between log steps:")
            for where, n in s["where"].items():
                print(f"  {n}× " + " <- ".join(where))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
