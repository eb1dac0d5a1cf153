"""NegBench's MCQ-vs-drift frontier on the embedded world, and where negft's guarded objective lands.

    python bench/frontier.py [--out runs/frontier] [--alphas 0,0.02,0.05,0.1,0.2,0.5]
                             [--grid "loss.negfull.alpha=0.2,loss.guard.caption=5;..."] [--world-seed 0] [--only negbench|negft]
                             [--dry-run] [-- extra train.py overrides]

Every point is a `train.py recipe=demo` run with the demo's budget (epochs, steps, lr, batch sizes) from the cached
world and base, without the patching sweep: NegBench's objective α·L_clip + (1−α)·L_mcq over `--alphas` (the guard
and negft's other terms set to 0), and negft's over `--grid` (';' between points, ',' between a point's
overrides). A run whose ledger already holds its last epoch is read, not rerun, so the bench resumes where it
stopped. It writes

    OUT/frontier.jsonl   one line per run: objective, settings, run dir, and for each metric its epoch-0 and
                         last-epoch value with the 95% intervals (test split)
    OUT/frontier.png     MCQ against zero-shot drift and against affirmative R@5 drift, and negation-type MCQ
                         against affirmative R@5 drift, one marker per run

and prints a table and a summary line: whether a negft point dominates NegBench's frontier (its MCQ and
negation-type MCQ at least those of every NegBench point whose affirmative R@5 drift is at most 10 points, and
of α = 0.1, with zero-shot and R@5 drift at most a third of α = 0.1's), and which. A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
METRICS = {"mcq": "mcq_neg/world/acc", "negation": "mcq_neg/world/acc_negation",
           "rneg_r5": "retrieval_neg/world/r5", "r5": "retrieval/world/r5", "zeroshot": "zeroshot/world/top1"}
ALPHAS = "0,0.02,0.05,0.1,0.2,0.5"
# negft's guarded objective: the points measured around the demo's setting (recipes/demo.yaml); every term named,
# so that a point means the same whatever the demo recipe sets
GRID = ("loss.negfull.alpha=0.1,loss.guard.caption=5,loss.negfull.t2i=0;"
        "loss.negfull.alpha=0.05,loss.guard.caption=5,loss.negfull.t2i=0;"
        "loss.negfull.alpha=0.1,loss.guard.caption=5,loss.negfull.t2i=1;"
        "loss.negfull.alpha=0.1,loss.guard.caption=5,loss.negfull.t2i=3;"
        "loss.negfull.alpha=0.05,loss.guard.caption=5,loss.negfull.t2i=1;"
        "loss.negfull.alpha=0.1,loss.guard.caption=3,loss.negfull.t2i=1;"
        "loss.negfull.alpha=0.075,loss.guard.caption=3,loss.negfull.t2i=1;"
        "loss.negfull.alpha=0.075,loss.guard.caption=2,loss.negfull.t2i=1;"
        "loss.negfull.alpha=0.1,loss.guard.caption=3,loss.negfull.t2i=1,model.train_logit_scale=false;"
        "loss.negfull.alpha=0.1,loss.guard.caption=3,loss.negfull.t2i=1,loss.negfull.negation_weight=2;"
        "loss.negfull.alpha=0.1,loss.guard.caption=3,loss.negfull.t2i=1,loss.negfull.negation_weight=3;"
        "loss.negfull.alpha=0.1,loss.guard.caption=3,loss.negfull.t2i=1,loss.negfull.negation_weight=5;"
        "loss.negfull.alpha=0.1,loss.guard.caption=3,loss.negfull.t2i=1,loss.negfull.negation_weight=8;"
        "loss.negfull.alpha=0.1,loss.guard.caption=5,loss.negfull.t2i=1,loss.negfull.negation_weight=8;"
        "loss.negfull.alpha=0.15,loss.guard.caption=5,loss.negfull.t2i=1,loss.negfull.negation_weight=8;"
        "loss.negfull.alpha=0.2,loss.guard.caption=5,loss.negfull.t2i=1,loss.negfull.negation_weight=8;"
        "loss.negfull.alpha=0.15,loss.guard.caption=5,loss.negfull.t2i=1,loss.negfull.negation_weight=12")
# what every point runs with unless it names another value (and is not named for): NegBench's unweighted MCQ
# mean and a trained logit scale, as in NegBench's recipes, whatever the demo recipe sets
DEFAULTS = ["loss.negfull.negation_weight=1", "model.train_logit_scale=true"]
# NegBench's objective: negft's own terms off, whatever the demo recipe sets
NEGBENCH_OFF = ["loss.guard.caption=0", "loss.guard.options=0", "loss.guard.kl=0", "loss.guard.l2sp=0", "loss.negfull.t2i=0",
                "loss.negfull.t2i_options=0"]


def run_name(objective: str, overrides: list[str]) -> str:
    short = [o.replace("loss.guard.", "g.").replace("loss.negfull.", "").replace("loss.", "").replace("optim.", "")
             .replace("model.", "") for o in overrides]
    return objective + ("-" + "-".join(short) if short else "")


def ledger(run: Path) -> list[dict]:
    path = run / "ledger.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def finished(run: Path) -> bool:
    """The ledger holds the last epoch the run's config asks for."""
    entries, cfg = ledger(run), run / "config.yaml"
    if not entries or not cfg.exists():
        return False
    import yaml
    epochs = yaml.safe_load(cfg.read_text())["epochs"]
    return max(e["epoch"] for e in entries) >= epochs


def point(objective: str, overrides: list[str], run: Path) -> dict:
    entries = ledger(run)
    first, last = entries[0], max(entries, key=lambda e: e["epoch"])
    row = {"objective": objective, "settings": overrides, "run": str(run), "epoch": last["epoch"]}
    for short, key in METRICS.items():
        row[short] = {"epoch0": first["metrics"][key], "epoch0_ci95": first["ci95"][key],
                      "last": last["metrics"][key], "last_ci95": last["ci95"][key],
                      "delta": last["metrics"][key] - first["metrics"][key]}
    return row


def drift(row: dict, short: str) -> float:
    """The drop from epoch 0, in points (negative: a gain)."""
    return 100 * (row[short]["epoch0"] - row[short]["last"])


def dominating(rows: list[dict]) -> tuple[list[dict], str]:
    """negft points that dominate NegBench's frontier, and why not when none does."""
    negbench = [r for r in rows if r["objective"] == "negbench"]
    ref = [r for r in negbench if abs(float(r["alpha"]) - 0.1) < 1e-9]
    if not ref:
        return [], "no NegBench α = 0.1 point to compare with"
    ref = ref[0]
    bar = [r for r in negbench if drift(r, "r5") <= 10] + [ref]
    need_mcq = max(r["mcq"]["last"] for r in bar)
    need_neg = max(r["negation"]["last"] for r in bar)
    max_zs, max_r5 = max(drift(ref, "zeroshot"), 0) / 3, max(drift(ref, "r5"), 0) / 3
    out = [r for r in rows if r["objective"] == "negft" and r["mcq"]["last"] >= need_mcq
           and r["negation"]["last"] >= need_neg and drift(r, "zeroshot") <= max_zs and drift(r, "r5") <= max_r5]
    why = (f"needs MCQ ≥ {need_mcq:.3f}, negation-type ≥ {need_neg:.3f} (NegBench points with R@5 drift ≤ 10 and "
           f"α = 0.1), zero-shot drift ≤ {max_zs:.2f} and R@5 drift ≤ {max_r5:.2f} points (a third of α = 0.1's)")
    return out, why


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, short, label, y in ((axes[0], "zeroshot", "zero-shot top-1 drift (points)", "mcq"),
                                (axes[1], "r5", "affirmative R@5 drift (points)", "mcq"),
                                (axes[2], "r5", "affirmative R@5 drift (points)", "negation")):
        for objective, colour, marker in (("negbench", "tab:blue", "o"), ("negft", "tab:red", "*")):
            pts = [r for r in rows if r["objective"] == objective]
            if not pts:
                continue
            ax.scatter([drift(r, short) for r in pts], [r[y]["last"] for r in pts], c=colour, marker=marker,
                       s=90 if marker == "*" else 40,
                       label="NegBench α·L_clip + (1−α)·L_mcq" if objective == "negbench" else "negft (guarded)")
            for r in pts:
                ax.annotate(tag(r), (drift(r, short), r[y]["last"]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
        if rows:
            ax.axhline(rows[0][y]["epoch0"], color="gray", lw=0.8, ls="--", label="epoch 0")
        ax.axvline(0, color="gray", lw=0.8)
        ax.set_xlabel(label)
        ax.set_ylabel("MCQ-Neg accuracy" + (", negation-type questions" if y == "negation" else "")
                      + " (test, last epoch)")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("MCQ against drift on the world: NegBench's α sweep and negft's guarded objective "
                 "(c: loss.guard.caption, t2i: loss.negfull.t2i, nw: loss.negfull.negation_weight)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def tag(row: dict) -> str:
    """A point's short label: NegBench's α, or negft's settings (α, guard weights, t2i, negation weight)."""
    if row["objective"] == "negbench":
        return f"α={row['alpha']}"
    return (row["name"].replace("negft-", "").replace("alpha=", "α").replace("g.caption=", "c")
            .replace("negation_weight=", "nw").replace("train_logit_scale=false", "fixed scale").replace("-", " "))


def fmt(m: dict) -> str:
    return f"{m['epoch0']:.3f}→{m['last']:.3f} [{m['last_ci95'][0]:.3f},{m['last_ci95'][1]:.3f}]"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/frontier")
    ap.add_argument("--alphas", default=ALPHAS, help="NegBench α values, comma-separated ('' for none)")
    ap.add_argument("--grid", default=GRID, help="negft points: ';' between points, ',' between overrides ('' for none)")
    ap.add_argument("--world-seed", type=int, default=0)
    ap.add_argument("--only", choices=("negbench", "negft"), default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the runs and read what exists; train nothing")
    ap.add_argument("extra", nargs="*", help="more train.py overrides for every run (after --)")
    args = ap.parse_args(argv)
    out = Path(args.out)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    common = [f"world.seed={args.world_seed}", "patch.sweep=false", *args.extra]
    plan = []
    if args.only != "negft":
        for a in filter(None, args.alphas.split(",")):
            plan.append(("negbench", [f"loss.negfull.alpha={a}", *NEGBENCH_OFF], {"alpha": a}))
    if args.only != "negbench":
        for p in filter(None, (x.strip() for x in args.grid.split(";"))):
            plan.append(("negft", [o.strip() for o in p.split(",") if o.strip()], {}))
    rows = []
    for objective, overrides, extra in plan:
        name = run_name(objective, [o for o in overrides if o not in NEGBENCH_OFF])
        run = out / "runs" / name
        if not finished(run):
            cmd = [sys.executable, "train.py", "recipe=demo", f"out={run}", *DEFAULTS, *common, *overrides]
            print(f"[frontier] {'would run' if args.dry_run else 'running'}: {' '.join(cmd[1:])}", flush=True)
            if args.dry_run:
                continue
            t0 = time.time()
            log = run.parent / f"{name}.log"
            with open(log, "w") as f:
                proc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                print(f"[frontier] {name} failed (status {proc.returncode}); see {log}", flush=True)
                continue
            print(f"[frontier] {name}: {time.time() - t0:.0f}s", flush=True)
        row = {**point(objective, overrides, run), **extra, "name": name}
        rows.append(row)
    if not rows:
        print("[frontier] nothing to report yet")
        return 0
    with open(out / "frontier.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    plot(rows, out / "frontier.png")
    w = max(len(r["name"]) for r in rows)
    print(f"\n{'run':{w}s} {'MCQ':>26s} {'negation-type':>26s} {'R-Neg R@5':>26s} {'aff R@5':>26s} {'zero-shot':>26s}")
    for r in rows:
        print(f"{r['name']:{w}s} " + " ".join(f"{fmt(r[s]):>26s}" for s in METRICS))
    winners, why = dominating(rows)
    if winners:
        best = max(winners, key=lambda r: (r["negation"]["last"], r["mcq"]["last"]))
        print(f"[frontier] summary: a negft point dominates NegBench's frontier: {best['name']} "
              f"(MCQ {best['mcq']['last']:.3f}, negation-type {best['negation']['last']:.3f}, zero-shot drift "
              f"{drift(best, 'zeroshot'):.2f}, R@5 drift {drift(best, 'r5'):.2f} points; {why}); "
              f"{len(winners)} dominating point(s): {', '.join(w['name'] for w in winners)}")
    else:
        print(f"[frontier] summary: no negft point dominates NegBench's frontier ({why})")
    print(f"[frontier] wrote {out / 'frontier.jsonl'} and {out / 'frontier.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
