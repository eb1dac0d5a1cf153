"""``negft patch``: sweep α per tower mode on the val split, choose by the rule, report it on the test split
(``negft.patching.patch``, which a training run's ``patch.sweep`` calls too). Its keys: ``PatchKeys``."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from negft.commands.keys import fail, help_text, key, outcome, parse, suites_line, synopsis, wants_help
from negft.config import ConfigError, EvalCfg, PatchCfg
from negft.fields import bounded


@dataclass(kw_only=True)
class PatchKeys:
    """The keys of ``negft patch``; the defaults they share with a run's ``patch.sweep`` are its
    (``negft.config.PatchCfg``, ``EvalCfg``)."""
    base: str = key(doc="the base model: a checkpoint, local-dir:DIR, hf-hub:ORG/NAME, a file, an open_clip tag, or "
                        "recorded (the one the checkpoint records)")
    finetuned: str = key(doc="the fine-tuned checkpoint directory")
    out: str = key(doc="the folder for sweep.jsonl, sweep.png, selected.json and selected/")
    alphas: str = key(PatchCfg.alphas, "the weights of the fine-tuned model to try: start:stop:step (stop included) or a "
                                 "comma list")
    towers: str = key(PatchCfg.towers, "tower modes to try, comma-separated: v, t, vt")
    suite: str = key(EvalCfg.suite, "the probe suite of the sweep (README \"Metrics\")")
    arch: str = key("", "the architecture of a weights file or tag base= (default: the checkpoint's record)")
    world_dir: str = key("", "the world's folder; empty: the one the checkpoint records")
    targets: str = key("", "metrics to gain, comma-separated, * for the dataset (default: the run's patch.targets)")
    drift: str = key("", "metrics that may not drop by more than max_drift (default: the run's patch.drift)")
    max_drift: Optional[float] = bounded(None, lo=0.0, doc="the largest drop allowed in a drift metric (default: the "
                                                           "run's patch.max_drift)")
    batch_size: int = bounded(EvalCfg.batch_size, lo=1, doc="images or texts per forward pass")
    bootstrap: int = bounded(EvalCfg.bootstrap, lo=1, doc="resamples for the 95% intervals and the paired tests")
    verify: bool = key(True, "false: use a release whose files fail its SHA256SUMS")
    overwrite: bool = key(False, "true: replace the sweep an earlier run left in out (without it such an out is "
                                 "refused)")


WHAT = ("Sweep θ(α) = (1 − α)·θ_base + α·θ_finetuned per tower mode on the val split, choose α by the run's rule, "
        "report it on the test split.")
README = (("Patching and release", "the sweep, the rule, selected/"),)


def synopses() -> list[tuple[str, str]]:
    return [(synopsis("negft patch", PatchKeys, ("alphas", "towers", "suite")), "sweep α, select on val, report test")]


def help_() -> str:
    return help_text(synopses(), WHAT, PatchKeys, README, "negft/commands/patch.py, negft/patching.py (patch)",
                     suites_line())


def main(argv: list[str]) -> int:
    """``negft patch ARGS``: 0 with selected.json written, 2 for bad input, 1 for a failed write."""
    if wants_help(argv):
        print(help_())
        return 0
    from negft import probes
    from negft.outdir import check_writable, refuse_results
    from negft.patching import SWEEP_FILES, parse_alphas, parse_towers, patch, run_rule, targets_error
    try:
        keys = parse(PatchKeys, argv)
        probes.suite(keys.suite)
        alphas, towers = parse_alphas(keys.alphas), parse_towers(keys.towers)
        bad = [e for k in ("targets", "drift") if getattr(keys, k)
               for e in probes.pattern_errors(k, getattr(keys, k).split(","))]
        if bad:
            raise ValueError("; ".join(bad))
        check_writable(keys.out)
        refuse_results(keys.out, SWEEP_FILES, "a patching sweep", keys.overwrite)
    except (ConfigError, ValueError) as e:
        return fail(str(e))

    def sweep() -> Path:
        rule = run_rule(Path(keys.finetuned))                 # the run's rule, with the command line's changes
        if keys.targets:
            rule.targets = keys.targets.split(",")
        if keys.drift:
            rule.drift = keys.drift.split(",")
        if keys.max_drift is not None:
            rule.max_drift = keys.max_drift
        error = targets_error(rule.targets, keys.suite)
        if error:
            raise ConfigError(f"{error}: pass targets= that suite= measures, or a suite= that measures them")
        return patch(keys.base, Path(keys.finetuned), Path(keys.out), alphas, towers, rule, keys.suite, keys.arch,
                     Path(keys.world_dir) if keys.world_dir else None, keys.batch_size, keys.bootstrap, keys.verify,
                     overwrite=keys.overwrite)
    return outcome(sweep, chosen)


def chosen(path: Path) -> str:
    """The sweep's choice, as the command's last line: α and tower, and where the model is."""
    import json
    from negft.tables import patch_choice
    sel = json.loads(path.read_text())
    return (f"[negft] selected: {patch_choice(sel['alpha'], sel['tower'])}, chosen on the val split; the model: "
            f"{sel['checkpoint']}; the sweep: {path}")
