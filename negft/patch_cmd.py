"""``negft patch``: sweep α per tower mode on the val split, choose by the rule, report it on the test split.

Writes ``sweep.jsonl`` (one line per tower mode and α), ``sweep.png`` (target gain against drift),
``selected.json`` and ``selected/`` (the chosen patched model, an open_clip local-dir like
``checkpoints/epoch_N``). α is the weight of the fine-tuned model throughout.
"""
from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
import yaml
from tqdm import tqdm

from negft import models
from negft.evaluate import datasets_for, evaluate, world_root
from negft.probes.base import PixelCache
from negft.io import atomic_write
from negft.patching import MODES, Rule, check_towers, gain_and_drift, interpolate, parse_alphas, select
from negft.provenance import code, provenance as result_provenance
from negft.train.ledger import now


def run_rule(ckpt: Path) -> Rule:
    """The fine-tuned run's patch rule (the config.yaml of the run the checkpoint records), else the defaults."""
    from negft.config import PatchCfg
    cfg = PatchCfg()
    run = models.run_dir_of(ckpt)
    if run is not None:
        patch = (yaml.safe_load((run / "config.yaml").read_text()) or {}).get("patch") or {}
        cfg = PatchCfg(**{k: v for k, v in patch.items() if k in ("targets", "drift", "max_drift")})
    return Rule(list(cfg.targets), list(cfg.drift), float(cfg.max_drift))


def build_base(base: str, info: dict, arch: str = "", verify: bool = True):
    """The base model's bundle: ``base`` = a checkpoint dir, a file, a tag (arch from the fine-tuned
    checkpoint's record unless given) or ``recorded`` (the base the checkpoint records). A release whose files
    fail its ``SHA256SUMS`` is refused unless ``verify`` is false."""
    from negft.release import check_release
    src = info.get("base", "") if base == "recorded" else base
    if not src:
        raise ValueError(f"base='{base}': the checkpoint records no base model; pass base=DIR|FILE|TAG")
    check_release("base", src[len(models.LOCAL_DIR):] if src.startswith(models.LOCAL_DIR) else src, verify)
    return models.build(arch or info.get("arch", ""), models.LOCAL_DIR + src if Path(src).is_dir() else src)


def load_pair(base: str, finetuned: str, arch: str = "", verify: bool = True):
    """(bundle of the fine-tuned model, base state, fine-tuned state, fine-tuned negft block)."""
    from negft.release import check_release
    ft_path = Path(finetuned)
    if not (ft_path / models.CONFIG_FILE).exists():
        raise FileNotFoundError(f"finetuned '{finetuned}' is not a checkpoint directory "
                                f"(expected {models.CONFIG_FILE} in it, e.g. runs/negfull/checkpoints/epoch_3)")
    check_release("finetuned", ft_path, verify)
    info = models.negft_info(ft_path)
    bundle = models.build("", models.LOCAL_DIR + str(ft_path))
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
        return evaluate(model, bundle.preprocess_val, bundle.tokenizer, datasets, suite, batch_size, n_boot,
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
    ax.set_xlabel(f"drift: largest drop in {', '.join(rule.drift)}")
    ax.set_ylabel(f"gain: mean change in {', '.join(rule.targets)}")
    ax.set_title("patching sweep (val split); α = weight of the fine-tuned model", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    atomic_write(path, lambda p: fig.savefig(p, dpi=120), suffix=".png")
    plt.close(fig)


def patch(base: str, finetuned: Path, out: Path, alphas: Sequence[float] | None = None, towers: Sequence[str] = MODES,
          rule: Rule | None = None, suite: str = "default", arch: str = "", world_dir: Path | None = None,
          batch_size: int = 256, bootstrap: int = 1000, verify: bool = True, test_caches: dict | None = None,
          test_results: dict | None = None) -> Path:
    """Sweep θ(α) = (1 − α)·θ_base + α·θ_finetuned over ``alphas`` (None: 0, 0.1, ..., 1) and tower modes
    ``towers`` on the val split, choose by ``rule`` (None: the fine-tuned run's), and write ``out``.
    ``base``: a checkpoint directory or file, an open_clip tag, or ``recorded`` (the checkpoint's record).
    ``verify``: refuse a release whose files fail its SHA256SUMS. ``test_caches``: evaluation caches of the
    test split whose image / text features are the base model's (a training run's frozen tower), reused.
    ``test_results``: the test split's results (metrics, ci95, skipped) of the ``base`` and the ``finetuned``
    checkpoint as the training run evaluated them: not evaluated again (the fine-tuned one where the selected
    model is it, weight for weight). ``selected.json`` carries the ``provenance`` of its numbers (negft's version,
    git commit, each probe's version: ``negft.provenance``), which the model card of ``selected/`` shows."""
    code()                  # the code's provenance, read before anything else runs
    out_dir, finetuned = Path(out), Path(finetuned)
    if (out_dir / "selected.json").exists():
        raise FileExistsError(f"out '{out_dir}' already holds a sweep (selected.json): choose a new out")
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
        known["base"] = summary(evaluate(bundle.model, bundle.preprocess_val, bundle.tokenizer, test, **kw,
                                         image_cache=images, text_cache=texts, token_cache=tokens, pixel_cache=pixels))
    bundle.model.load_state_dict(state)
    if chosen["alpha"] == 0.0:
        sel_test = known["base"]
    elif "finetuned" in known and all(torch.equal(state[k], ft_state[k]) for k in ft_state):
        sel_test = known["finetuned"]
    else:
        sel_test = summary(evaluate(bundle.model, bundle.preprocess_val, bundle.tokenizer, test, **kw,
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
                "base_metrics": base_val},
        "test": {"metrics": sel_test["metrics"], "ci95": sel_test["ci95"], "base_metrics": base_test["metrics"],
                 "base_ci95": base_test["ci95"], "skipped": sel_test["skipped"]},
        "base": provenance["base"], "finetuned": str(finetuned), "checkpoint": str(out_dir / "selected"),
        "provenance": result_provenance([*sel_test["metrics"], *sel_test["skipped"]]),
        "sweep_seconds": round(sweep_seconds, 2), "evaluations": len({(r["tower"], r["alpha"]) for r in rows
                                                                     if r["alpha"] != 0.0}) + 1,
    }
    atomic_write(out_dir / "selected.json", json.dumps(selected, indent=2) + "\n")
    return out_dir / "selected.json"
