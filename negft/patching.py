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
- A sweep encodes the tower that does not move once for every α (``sweep``); the references
  re-encode everything for each α. Selection is made on the validation split by ``select`` and only the
  selected model is evaluated on the test split.

``patch`` is ``negft patch`` and the training run's ``patch.sweep``: the sweep on the val split, the choice, the
selected model and its test-split numbers, written as ``sweep.jsonl``, ``sweep.png``, ``selected.json`` and
``selected/`` (an open_clip local-dir like ``checkpoints/epoch_N``).
"""
from __future__ import annotations

import fnmatch
import json
import math
import textwrap
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from negft import models
from negft.config import TOWERS, PatchCfg
from negft.evaluation import datasets_for, print_skipped_rows, run_suite, world_root
from negft.io import atomic_write
from negft.models import tower_of
from negft.outdir import refuse_results, remove_entries
from negft.probes.base import PixelCache, ProbeResult
from negft.provenance import code, now, provenance as result_provenance

MODES = TOWERS          # a patch's tower modes: the keys it moves
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
    max_drift: float = PatchCfg.max_drift

    @classmethod
    def of(cls, cfg: PatchCfg) -> "Rule":
        """The rule a run's ``patch`` block states."""
        return cls(list(cfg.targets), list(cfg.drift), float(cfg.max_drift))

    def describe(self) -> str:
        return (f"largest mean gain over the base in [{', '.join(self.targets)}] among (tower, α) whose drop "
                f"in every one of [{', '.join(self.drift)}] is at most {self.max_drift} (validation split); "
                f"ties: smaller α, then fewer patched weights")


def _match(patterns: list[str], metrics: dict) -> list[str]:
    return sorted({k for p in patterns for k in metrics if fnmatch.fnmatchcase(k, p)})


def targets_error(targets: list[str], suite: str) -> str | None:
    """Why a sweep with probe suite ``suite`` could not choose by ``targets`` (None: it can): no probe of the suite
    is a target's first name (a metric is ``<probe>/<dataset>/<metric>``). Known before any model is loaded."""
    from negft.probes import suite as probes_of
    try:
        probes = probes_of(suite)
    except ValueError as e:
        return str(e)
    if any(fnmatch.fnmatchcase(p, t.split("/")[0]) for t in targets for p in probes):
        return None
    return (f"no metric of suite={suite} matches the targets {', '.join(targets)} (its probes: "
            f"{', '.join(probes) or 'none'}), so no α could be chosen")


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


# --------------------------------------------------------------------------- the sweep
def run_rule(ckpt: Path) -> Rule:
    """The fine-tuned run's patch rule (the config.yaml of the run the checkpoint records), else the defaults."""
    cfg = PatchCfg()
    run = models.run_dir_of(ckpt)
    if run is not None:
        patch = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("patch") or {}
        cfg = PatchCfg(**{k: v for k, v in patch.items() if k in ("targets", "drift", "max_drift")})
    return Rule.of(cfg)


def build_base(base: str, info: dict, arch: str = "", verify: bool = True):
    """The base model's bundle: ``base`` = a checkpoint dir, ``local-dir:DIR``, ``hf-hub:ORG/NAME``, a file or a
    tag (arch from the fine-tuned checkpoint's record unless given), or ``recorded`` (the base the checkpoint
    records), loaded as ``models.load`` loads any model (a release checked against its ``SHA256SUMS`` unless
    ``verify`` is false)."""
    src = info.get("base", "") if base == "recorded" else base
    if not src:
        raise ValueError(f"base='{base}': the checkpoint records no base model; pass base=DIR|FILE|TAG|hf-hub:ORG/NAME")
    return models.load(src, arch or info.get("arch", ""), key="base", verify=verify,
                       name_arch="arch= (negft patch) or model= (eval.py)")


def load_pair(base: str, finetuned: str, arch: str = "", verify: bool = True):
    """(bundle of the fine-tuned model, base state, fine-tuned state, fine-tuned negft block)."""
    ft_path = Path(finetuned)
    if not (ft_path / models.CONFIG_FILE).exists():
        raise FileNotFoundError(f"finetuned '{finetuned}' is not a checkpoint directory "
                                f"(expected {models.CONFIG_FILE} in it, e.g. runs/negfull/checkpoints/epoch_3)")
    info = models.negft_info(ft_path)
    bundle = models.load(str(ft_path), key="finetuned", verify=verify)
    ft_state = {k: v.detach().clone() for k, v in bundle.model.state_dict().items()}
    base_state = {k: v.detach().clone() for k, v in build_base(base, info, arch, verify).model.state_dict().items()}
    return bundle, base_state, ft_state, info


def sweep(bundle, base_state: dict, ft_state: dict, alphas: list[float], modes: list[str], datasets, suite: str,
          batch_size: int, n_boot: int, device, progress: bool = True) -> list[dict]:
    """Evaluate θ(α) for every mode and α. The tower a mode does not move is encoded once for the sweep:
    mode t reuses the base model's image features, mode v its text features, and α = 0 (the base model,
    the same in every mode) is evaluated once."""
    model = bundle.model.to(device)

    def run(state, image_cache=None, text_cache=None):
        model.load_state_dict(state)
        return run_suite(model, bundle.preprocess_val, bundle.tokenizer, datasets, suite, batch_size, n_boot,
                        device, image_cache=image_cache, text_cache=text_cache, token_cache=tokens,
                        pixel_cache=pixels)

    base_images, base_texts, tokens, pixels = {}, {}, {}, PixelCache()
    base = run(base_state, base_images, base_texts)
    rows = []
    todo = [(m, a) for m in modes for a in alphas if a != 0.0]
    bar = tqdm(total=len(todo), desc="patch sweep", disable=not progress)
    for mode in modes:
        for alpha in alphas:
            t0 = time.time()
            if alpha == 0.0:
                result = base
            else:
                result = run(interpolate(base_state, ft_state, alpha, mode),
                             image_cache=base_images if mode == "t" else None,
                             text_cache=base_texts if mode == "v" else None)
                bar.update(1)
            rows.append({"tower": mode, "alpha": alpha, "metrics": result.metrics, "ci95": result.ci95,
                         "eval_seconds": round(time.time() - t0, 3)})
    bar.close()
    return rows


def summary(result) -> dict:
    """What selected.json reports of an evaluation (a training run's ledger line holds the same)."""
    return {"metrics": result.metrics, "ci95": result.ci95, "skipped": result.skipped}


def plot(rows: list[dict], rule: Rule, chosen: dict, path: Path) -> None:
    """Target gain against drift, one curve per tower mode, α written at each point."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    base = next(r["metrics"] for r in rows if r["alpha"] == 0.0)
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for mode in MODES:
        pts = sorted((r["alpha"], *gain_and_drift(rule, r["metrics"], base)) for r in rows if r["tower"] == mode)
        if not pts:
            continue
        ax.plot([d for _, _, d in pts], [g for _, g, _ in pts], marker="o", label=f"tower {mode}")
        for a, g, d in pts:
            ax.annotate(f"{a:g}", (d, g), textcoords="offset points", xytext=(3, 3), fontsize=7)
    g, d = gain_and_drift(rule, chosen["metrics"], base)
    ax.scatter([d], [g], s=160, facecolors="none", edgecolors="k", label=f"selected: {chosen['tower']}, α={chosen['alpha']:g}")
    ax.axvline(rule.max_drift, ls="--", c="gray", lw=1, label=f"drift bound {rule.max_drift:g}")
    # wrapped: a rule of several metrics names them all, and an unwrapped label runs off the figure
    ax.set_xlabel(textwrap.fill(f"drift: largest drop in {', '.join(rule.drift)}", 70), fontsize=8)
    ax.set_ylabel(textwrap.fill(f"gain: mean change in {', '.join(rule.targets)}", 50), fontsize=8)
    ax.set_title("patching sweep (val split); α = weight of the fine-tuned model", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, dpi=120), suffix=".png")
    plt.close(fig)


SWEEP_FILES = ("sweep.jsonl", "sweep.png", "selected.json", "selected")      # what a sweep writes into its out


def patch(base: str, finetuned: Path, out: Path, alphas: Sequence[float] | None = None, towers: Sequence[str] = MODES,
          rule: Rule | None = None, suite: str = "default", arch: str = "", world_dir: Path | None = None,
          batch_size: int = 256, bootstrap: int = 1000, verify: bool = True, test_caches: dict | None = None,
          test_results: dict | None = None, overwrite: bool = False) -> Path:
    """Sweep θ(α) = (1 − α)·θ_base + α·θ_finetuned over ``alphas`` (None: 0, 0.1, ..., 1) and tower modes
    ``towers`` on the val split, choose by ``rule`` (None: the fine-tuned run's), and write ``out``.
    ``base``: a checkpoint directory or file, an open_clip tag, or ``recorded`` (the checkpoint's record).
    ``verify``: refuse a release whose files fail its SHA256SUMS. ``test_caches``: evaluation caches of the
    test split whose image / text features are the base model's (a training run's frozen tower), reused.
    ``test_results``: the test split's results (metrics, ci95, skipped) of the ``base`` and the ``finetuned``
    checkpoint as the training run evaluated them: not evaluated again (the fine-tuned one where the selected
    model is it, weight for weight). ``selected.json`` carries the ``provenance`` of its numbers (negft's version,
    git commit, each probe's version: ``negft.provenance``), which the model card of ``selected/`` shows.
    An ``out`` holding an earlier sweep is refused (``ConfigError``) unless ``overwrite``, which replaces it whole."""
    code()                  # the code's provenance, read before anything else runs
    out_dir, finetuned = Path(out), Path(finetuned)
    refuse_results(out_dir, SWEEP_FILES, "a patching sweep", overwrite)
    modes = list(towers)
    check_towers(modes)
    grid = list(alphas) if alphas is not None else parse_alphas("0:1:0.1")
    if 0.0 not in grid:
        grid = [0.0] + grid                  # the base model: gain and drift are measured against it
    rule = rule if rule is not None else run_rule(finetuned)
    bundle, base_state, ft_state, info = load_pair(base, str(finetuned), arch, verify)
    world = world_root(info, str(world_dir or "")) if info.get("data") == "world" or world_dir else None
    device = "cuda" if torch.cuda.is_available() else "cpu"
    kw = dict(suite=suite, batch_size=batch_size, n_boot=bootstrap, device=device)
    t0 = time.time()
    rows = sweep(bundle, base_state, ft_state, grid, modes,
                 datasets_for(world / "val" if world else None), **kw)
    sweep_seconds = time.time() - t0
    chosen = select(rule, rows)
    out_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        remove_entries(out_dir, SWEEP_FILES)        # the earlier sweep goes whole
    atomic_write(out_dir / "sweep.jsonl", "".join(json.dumps({"split": "val", **r}) + "\n" for r in rows))
    plot(rows, rule, chosen, out_dir / "sweep.png")
    # the chosen model, then its test-split numbers beside the base model's
    state = interpolate(base_state, ft_state, chosen["alpha"], chosen["tower"])
    test = datasets_for(world / "test" if world else None)
    # as in the sweep: the selected model shares the base's features of the tower its mode does not move
    given = test_caches or {}
    images, texts = given.get("image_cache") or {}, given.get("text_cache") or {}
    tokens, pixels = given.get("token_cache") or {}, given.get("pixel_cache") or PixelCache()
    known = dict(test_results or {})
    if "base" not in known:
        bundle.model.load_state_dict(base_state)
        known["base"] = summary(run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, test, **kw,
                                         image_cache=images, text_cache=texts, token_cache=tokens, pixel_cache=pixels))
    bundle.model.load_state_dict(state)
    if chosen["alpha"] == 0.0:
        sel_test = known["base"]
    elif "finetuned" in known and all(torch.equal(state[k], ft_state[k]) for k in ft_state):
        sel_test = known["finetuned"]
    else:
        sel_test = summary(run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer, test, **kw,
                                    image_cache=images if chosen["tower"] == "t" else None,
                                    text_cache=texts if chosen["tower"] == "v" else None,
                                    token_cache=tokens, pixel_cache=pixels))
    base_test = known["base"]
    provenance = {**{k: v for k, v in info.items()
                     if k in ("recipe", "data", "arch", "world_dir", "tower", "run_dir")},
                  "base": base if base != "recorded" else info.get("base", ""), "finetuned": str(finetuned),
                  "patch": {"alpha": chosen["alpha"], "tower": chosen["tower"],
                            "convention": "theta = (1 - alpha) * base + alpha * finetuned"}}
    models.save(bundle.model, out_dir / "selected", bundle.model_cfg, bundle.preprocess_cfg, extra=provenance)
    base_val = next(r["metrics"] for r in rows if r["alpha"] == 0.0)
    gain, drop = gain_and_drift(rule, chosen["metrics"], base_val)
    selected = {
        "time": now(), "rule": rule.describe(), "targets": rule.targets, "drift": rule.drift,
        "max_drift": rule.max_drift, "tower": chosen["tower"], "alpha": chosen["alpha"],
        "alpha_convention": "weight of the fine-tuned model: theta = (1 - alpha) * base + alpha * finetuned",
        "val": {"metrics": chosen["metrics"], "ci95": chosen["ci95"], "target_gain": gain, "drift": drop,
                "drift_metrics": _match(rule.drift, base_val), "base_metrics": base_val},
        "test": {"metrics": sel_test["metrics"], "ci95": sel_test["ci95"], "base_metrics": base_test["metrics"],
                 "base_ci95": base_test["ci95"], "skipped": sel_test["skipped"]},
        "base": provenance["base"], "finetuned": str(finetuned), "checkpoint": str(out_dir / "selected"),
        "provenance": result_provenance([*sel_test["metrics"], *sel_test["skipped"]]),
        "sweep_seconds": round(sweep_seconds, 2), "evaluations": len({(r["tower"], r["alpha"]) for r in rows
                                                                     if r["alpha"] != 0.0}) + 1,
    }
    atomic_write(out_dir / "selected.json", json.dumps(selected, indent=2) + "\n")
    print_skipped_rows(ProbeResult(metrics=sel_test["metrics"], skipped=sel_test["skipped"]))
    return out_dir / "selected.json"
