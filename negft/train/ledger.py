"""The run directory's record: ledger.jsonl, TensorBoard scalars, report.md — all written atomically.

Every ledger line carries its ``provenance`` (``negft.provenance``): negft's version, the git commit it ran from,
and the version of each probe whose numbers or skips it holds."""
from __future__ import annotations

import json
import os
from pathlib import Path

import yaml

from negft.io import atomic_write
from negft.provenance import describe, now, provenance
from negft.results import read_values, write_values
from negft.tables import headline, metric_table


class Ledger:
    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / "ledger.jsonl"

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]

    def append(self, epoch: int, step: int, metrics: dict, ci95: dict, skipped: dict, **extra) -> dict:
        """Add (or replace, after a resume) the line for ``epoch``, with its provenance."""
        keys = [*metrics, *skipped, *(extra.get("patched") or {}).get("metrics", {})]
        line = {"epoch": epoch, "step": step, "time": now(), "metrics": metrics, "ci95": ci95,
                "skipped": skipped, **extra, "provenance": provenance(keys)}
        lines = [entry for entry in self.read() if entry["epoch"] != epoch] + [line]
        lines.sort(key=lambda entry: entry["epoch"])
        atomic_write(self.path, "".join(json.dumps(entry) + "\n" for entry in lines))
        return line


def save_values(run_dir: Path, epoch: int, values: dict) -> None:
    """Per-example values of an evaluation (``examples/epoch_N.npz``), for paired tests against epoch 0."""
    write_values(Path(run_dir) / "examples" / f"epoch_{epoch}.npz", values)


def load_values(run_dir: Path, epoch: int) -> dict:
    """The per-example values ``save_values`` wrote for ``epoch`` (empty if none were)."""
    return read_values(Path(run_dir) / "examples" / f"epoch_{epoch}.npz")


def _headline(run_dir: Path, lines: list[dict]) -> list[str]:
    """tables.headline of a run: epoch 0 → last → released (patch/selected.json's test-split values), with a link
    to bench/frontier.py's plot when one sits beside the run (OUT/../frontier/) or in runs/frontier/."""
    if len(lines) < 2:
        return []
    released = None
    sel_path = run_dir / "patch" / "selected.json"
    if sel_path.exists():
        sel = json.loads(sel_path.read_text())
        released = {"metrics": sel["test"]["metrics"], "alpha": sel.get("alpha"), "tower": sel.get("tower"),
                    "p": sel["test"].get("paired_p", {})}
    frontier = None
    for path in (run_dir.parent / "frontier" / "frontier.png", Path("runs") / "frontier" / "frontier.png"):
        if path.exists():
            frontier = os.path.relpath(path.resolve(), run_dir.resolve())
            break
    return headline(lines[0], lines[-1], released, frontier, drift=_drift_patterns(run_dir))


def _drift_patterns(run_dir: Path) -> tuple:
    """The run's drift metrics (``patch.drift`` in its config.yaml), else the default's."""
    from negft.config import DEFAULT_DRIFT
    path = Path(run_dir) / "config.yaml"
    cfg = (yaml.safe_load(path.read_text()) or {}) if path.exists() else {}
    return tuple((cfg.get("patch") or {}).get("drift") or DEFAULT_DRIFT)


NEEDS_SPACY = "spaCy's en_core_web_sm"        # a probe's skip that only an installed tagger would have avoided


def skipped_lines(skipped: dict) -> list[str]:
    """report.md's word on what was skipped, in three kinds: a file the world does not have (the probe reads a
    real benchmark's files, which the world's split does not hold: not a failure, one line), a task that needs
    spaCy's tagger where it is not installed (one line; installing it needs the network), and the rest, each with
    why: what the run was meant to read and could not."""
    absent = sorted(k for k, v in skipped.items() if k.split("/")[1:2] == ["world"] and v.startswith("data not found"))
    tagger = sorted(k for k, v in skipped.items() if NEEDS_SPACY in v and k not in absent)
    rest = {k: v for k, v in skipped.items() if k not in absent and k not in tagger}
    out = []
    if rest:
        out += ["", "Skipped (the run was meant to read these and could not):", ""]
        out += [f"- `{k}`: {v}" for k, v in sorted(rest.items())]
    notes = []
    if absent:
        notes.append(f"- Not in this world (benchmark files it does not generate; not a failure): "
                     f"{', '.join(f'`{k}`' for k in absent)}.")
    if tagger:
        notes.append(f"- Needs {NEEDS_SPACY}, not installed here (it installs from the network only; README "
                     f"\"Metrics\"): {', '.join(f'`{k}`' for k in tagger)}.")
    return out + (["", "Not run:", "", *notes] if notes else [])


def _provenance_lines(lines: list[dict]) -> list[str]:
    """One line per provenance the ledger's lines record (one unless a resume ran other code), with its epochs."""
    epochs: dict[str, list[int]] = {}
    for entry in lines:
        epochs.setdefault(describe(entry.get("provenance")), []).append(entry["epoch"])
    return [f"- epoch{'s' if len(e) > 1 else ''} {', '.join(map(str, e))}: {text}" for text, e in epochs.items()]


def write_report(run_dir: Path, title: str, notes: list[str] | None = None) -> Path:
    """report.md: every ledger metric per epoch with its 95% interval and the change from epoch 0,
    starred where the last line's paired test against epoch 0 (its ``paired_p``) gives p < 0.05."""
    lines = Ledger(run_dir).read()
    out = [f"# {title}", ""]
    out += _headline(Path(run_dir), lines)
    out += notes or []
    if lines:
        metrics = sorted({k for entry in lines for k in entry["metrics"]})
        out += ["", "Metrics per epoch (mean [95% bootstrap interval]); Δ = last epoch − epoch 0, "
                    "\\* where a paired bootstrap test over the same examples gives p < 0.05.", ""]
        out += metric_table([(f"epoch {e['epoch']}", e["metrics"], e["ci95"]) for e in lines], metrics,
                            reference=lines[0]["metrics"], p_values=lines[-1].get("paired_p", {}))
        patched = [entry for entry in lines if "patched" in entry]
        if patched:
            p = patched[-1]["patched"]
            out += ["", f"Patched model after each epoch: θ = (1 − α)·θ_base + α·θ_epoch with α = {p['alpha']} "
                        f"(the weight of the fine-tuned model), tower mode `{p['tower']}`; Δ = its value − epoch 0.",
                    ""]
            out += metric_table([(f"epoch {e['epoch']}", e["patched"]["metrics"], e["patched"]["ci95"])
                                 for e in patched], metrics, reference=lines[0]["metrics"])
        out += skipped_lines({k: v for entry in lines for k, v in entry.get("skipped", {}).items()})
        out += ["", "Provenance:", ""] + _provenance_lines(lines)
    path = Path(run_dir) / "report.md"
    atomic_write(path, "\n".join(out) + "\n")
    return path
