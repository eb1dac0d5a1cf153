"""The run directory's record: ledger.jsonl, TensorBoard scalars, report.md — all written atomically."""
from __future__ import annotations

import json
import math
from datetime import datetime, timezone
from pathlib import Path

from negft.io import atomic_write


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class Ledger:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "ledger.jsonl"

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, epoch: int, step: int, metrics: dict, ci95: dict, skipped: dict, **extra) -> dict:
        """Add (or replace, after a resume) the line for ``epoch``."""
        line = {"epoch": epoch, "step": step, "time": now(), "metrics": metrics, "ci95": ci95,
                "skipped": skipped, **extra}
        lines = [entry for entry in self.read() if entry["epoch"] != epoch] + [line]
        lines.sort(key=lambda entry: entry["epoch"])
        atomic_write(self.path, "".join(json.dumps(entry) + "\n" for entry in lines))
        return line


def _fmt(value: float, ci=None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    text = f"{value:.3f}"
    if ci:
        text += f" [{ci[0]:.3f}, {ci[1]:.3f}]"
    return text


def save_values(run_dir: Path, epoch: int, values: dict) -> None:
    """Per-example values of an evaluation (``examples/epoch_N.npz``), for paired tests against epoch 0."""
    import numpy as np
    arrays = {k.replace("/", "__"): v for k, v in values.items()}
    atomic_write(Path(run_dir) / "examples" / f"epoch_{epoch}.npz", lambda p: np.savez_compressed(p, **arrays),
                 suffix=".npz")


def load_values(run_dir: Path, epoch: int) -> dict:
    """The per-example values ``save_values`` wrote for ``epoch`` (empty if none were)."""
    import numpy as np
    path = Path(run_dir) / "examples" / f"epoch_{epoch}.npz"
    if not path.exists():
        return {}
    with np.load(path) as f:
        return {k.replace("__", "/"): f[k] for k in f.files}


def write_report(run_dir: Path, title: str, notes: list[str] | None = None) -> Path:
    """report.md: every ledger metric per epoch with its 95% interval and the change from epoch 0,
    starred where the last line's paired test against epoch 0 (its ``paired_p``) gives p < 0.05."""
    lines = Ledger(run_dir).read()
    out = [f"# {title}", ""]
    out += notes or []
    if lines:
        epochs = [entry["epoch"] for entry in lines]
        metrics = sorted({k for entry in lines for k in entry["metrics"]})
        p_values = lines[-1].get("paired_p", {})
        out += ["", "Metrics per epoch (mean [95% bootstrap interval]); Δ = last epoch − epoch 0, "
                    "\\* where a paired bootstrap test over the same examples gives p < 0.05.", "",
                "| metric | " + " | ".join(f"epoch {e}" for e in epochs) + " | Δ |",
                "|---|" + "---|" * (len(epochs) + 1)]
        for m in metrics:
            cells = [_fmt(entry["metrics"].get(m), entry["ci95"].get(m)) for entry in lines]
            first, last = lines[0]["metrics"].get(m), lines[-1]["metrics"].get(m)
            delta = f"{last - first:+.3f}" if first is not None and last is not None else "–"
            if p_values.get(m, 1.0) < 0.05:
                delta += " \\*"
            out.append(f"| {m} | " + " | ".join(cells) + f" | {delta} |")
        patched = [entry for entry in lines if "patched" in entry]
        if patched:
            p = patched[-1]["patched"]
            out += ["", f"Patched model after each epoch: θ = (1 − α)·θ_base + α·θ_epoch with α = {p['alpha']} "
                        f"(the weight of the fine-tuned model), tower mode `{p['tower']}`; Δ = its value − epoch 0.",
                    "", "| metric | " + " | ".join(f"epoch {e['epoch']}" for e in patched) + " | Δ |",
                    "|---|" + "---|" * (len(patched) + 1)]
            for m in metrics:
                cells = [_fmt(e["patched"]["metrics"].get(m), e["patched"]["ci95"].get(m)) for e in patched]
                first, last = lines[0]["metrics"].get(m), patched[-1]["patched"]["metrics"].get(m)
                delta = f"{last - first:+.3f}" if first is not None and last is not None else "–"
                out.append(f"| {m} | " + " | ".join(cells) + f" | {delta} |")
        skipped = {k: v for entry in lines for k, v in entry.get("skipped", {}).items()}
        if skipped:
            out += ["", "Skipped:", ""] + [f"- `{k}`: {v}" for k, v in sorted(skipped.items())]
    path = Path(run_dir) / "report.md"
    atomic_write(path, "\n".join(out) + "\n")
    return path
