"""Weight-space patching (PAINT / WiSE-FT): interpolate, sweep α per tower mode, choose α by a stated rule.

θ(α) = (1 − α)·θ_base + α·θ_ft, α the weight of the *fine-tuned* model (α = 0: base, α = 1: fine-tuned),
computed in fp32. Where we differ from the reference code, deliberately:

- Tower modes: ``v`` moves only ``visual.*`` keys, ``t`` only the text keys, ``vt`` all. PAINT and
  WiSE-FT move every key.
- ``logit_scale`` / ``logit_bias`` are shared by the towers; they are interpolated with α in every mode,
  so the temperature moves with the patch (it changes confidences, never a ranking).
- Entries equal in both models are copied, not recomputed, so α = 0 and α = 1 reproduce the two models
  bit for bit and −inf attention masks never turn into NaN. Integer buffers must match and are copied,
  except batch-norm step counters (``num_batches_tracked``, which no forward pass of open_clip's ResNets
  reads): a patched tower takes them from the model with the larger weight, the fine-tuned one at α ≥ 0.5.
- A sweep encodes the tower that does not move once for every α (``negft.patch_cmd.sweep``); the references
  re-encode everything for each α. Selection is made on the validation split by ``select`` and only the
  selected model is evaluated on the test split.
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass

import torch

from negft.models import tower_of

MODES = ("v", "t", "vt")
COUNTER_SUFFIX = "num_batches_tracked"


def check_compatible(base: dict, finetuned: dict) -> None:
    """Refuse state dicts whose keys, shapes or integer buffers differ, listing every difference."""
    problems = []
    only_base, only_ft = sorted(set(base) - set(finetuned)), sorted(set(finetuned) - set(base))
    if only_base:
        problems.append(f"keys only in the base model: {', '.join(only_base)}")
    if only_ft:
        problems.append(f"keys only in the fine-tuned model: {', '.join(only_ft)}")
    for k in sorted(set(base) & set(finetuned)):
        a, b = base[k], finetuned[k]
        if a.shape != b.shape:
            problems.append(f"{k}: shape {tuple(a.shape)} in the base, {tuple(b.shape)} fine-tuned")
        elif not a.is_floating_point() and not torch.equal(a, b) and not k.endswith(COUNTER_SUFFIX):
            problems.append(f"{k}: integer buffer differs")
    if problems:
        raise ValueError("cannot interpolate these checkpoints (are they the same architecture?):\n  "
                         + "\n  ".join(problems))


def interpolate(base: dict, finetuned: dict, alpha: float, mode: str = "vt") -> dict:
    """θ(α) for the keys of ``mode``; every other key is the base model's."""
    if mode not in MODES:
        raise ValueError(f"bad tower mode '{mode}'. Valid choices: {', '.join(MODES)}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"bad alpha {alpha}: it must lie in [0, 1] (the weight of the fine-tuned model)")
    check_compatible(base, finetuned)
    out = {}
    for k, a in base.items():
        b = finetuned[k]
        if tower_of(k) != "shared" and tower_of(k) not in mode:
            out[k] = a.clone()
            continue
        if not a.is_floating_point():
            out[k] = (b if alpha >= 0.5 else a).clone()
            continue
        a32, b32 = a.float(), b.float()
        mixed = (1.0 - alpha) * a32 + alpha * b32
        out[k] = torch.where(a32 == b32, a32, mixed).to(a.dtype)
    return out


def parse_alphas(spec: str) -> list[float]:
    """``start:stop:step`` (stop included) or a comma list, e.g. ``0:1:0.1`` → 11 values."""
    try:
        if ":" in spec:
            start, stop, step = (float(x) for x in spec.split(":"))
            if step <= 0:
                raise ValueError
            n = int(math.floor((stop - start) / step + 1e-9)) + 1
            values = [round(start + i * step, 10) for i in range(n)]
        else:
            values = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"bad value '{spec}' for 'alphas': use start:stop:step (e.g. 0:1:0.1) or a "
                         f"comma list (e.g. 0,0.2,1)") from None
    bad = [a for a in values if not 0.0 <= a <= 1.0]
    if not values or bad:
        raise ValueError(f"bad value '{spec}' for 'alphas': every α must lie in [0, 1]")
    return values


def parse_towers(spec: str) -> list[str]:
    """A comma list of tower modes, e.g. ``v,t,vt``."""
    modes = [m.strip() for m in spec.split(",") if m.strip()]
    check_towers(modes, spec)
    return modes


def check_towers(modes, spec=None) -> None:
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ValueError(f"bad value '{spec if spec is not None else ','.join(modes)}' for 'towers'. Valid "
                         f"choices: comma list of {', '.join(MODES)}")


@dataclass
class Rule:
    """Largest mean target gain over the base whose drift (drop of any drift metric) stays within ``max_drift``.

    Metric names may use ``*`` for the dataset (``mcq_neg/*/acc``). Ties go to the smaller α (closer to
    the base model), then to the mode that moves fewer weights (t, v, vt).
    """
    targets: list[str]
    drift: list[str]
    max_drift: float = 0.03

    def describe(self) -> str:
        return (f"largest mean gain over the base in [{', '.join(self.targets)}] among (tower, α) whose drop "
                f"in every one of [{', '.join(self.drift)}] is at most {self.max_drift} (validation split); "
                f"ties: smaller α, then fewer patched weights")


def _match(patterns: list[str], metrics: dict) -> list[str]:
    return sorted({k for p in patterns for k in metrics if fnmatch.fnmatchcase(k, p)})


def gain_and_drift(rule: Rule, metrics: dict, base: dict) -> tuple[float, float]:
    """(mean target gain, largest drift drop) of ``metrics`` against the base model's ``base``: changes toward
    each metric's better side, as its probe registers it (``negft.probes.direction``)."""
    from negft.probes import direction
    targets, drifts = _match(rule.targets, base), _match(rule.drift, base)
    if not targets:
        raise ValueError(f"no metric matches the targets {rule.targets}; metrics: {', '.join(sorted(base))}")
    sign = {k: direction(k) for k in targets + drifts}
    aimless = [k for k, s in sign.items() if s == 0]
    if aimless:
        raise ValueError(f"{', '.join(aimless)}: no better direction (a count, a share of picks or a feature "
                         f"effect), so no gain or drift to measure; choose other targets= / drift= metrics")
    gain = sum(sign[k] * (metrics[k] - base[k]) for k in targets) / len(targets)
    drop = max((sign[k] * (base[k] - metrics[k]) for k in drifts), default=0.0)
    return gain, drop


def select(rule: Rule, rows: list[dict]) -> dict:
    """The row ({tower, alpha, metrics}) the rule chooses; ``rows`` must include α = 0 (the base)."""
    base = next((r["metrics"] for r in rows if r["alpha"] == 0.0), None)
    if base is None:
        raise ValueError("the sweep needs α = 0 (the base model) to measure gain and drift")
    order = {m: i for i, m in enumerate(("t", "v", "vt"))}
    ok = []
    for r in rows:
        gain, drop = gain_and_drift(rule, r["metrics"], base)
        if drop <= rule.max_drift + 1e-12:
            ok.append((-gain, r["alpha"], order[r["tower"]], r))
    return min(ok, key=lambda x: x[:3])[3]
