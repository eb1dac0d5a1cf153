"""``train.py`` / ``negft train``: a recipe's stages, each a library call: world → base → fine-tune → patching sweep →
release. Its keys: the recipe's, ``negft.config.Config`` and the dataclasses its fields name.

``run(cfg)``: the embedded world is built (once), the world's base model is the cached result of the
``world-pretrain`` recipe (trained here the first time), the recipe fine-tunes it (``negft.train.loop.train``),
and with ``patch.sweep`` the last epoch is swept toward the base (``negft.patching.patch``) and the selected model
released (``negft.release.release``). Every rank of a DeepSpeed launch runs the stages; training is collective,
the sweep and the release are rank 0's.
"""
from __future__ import annotations

import dataclasses
import json
import re
import signal
import sys
from pathlib import Path

from negft.commands.keys import (fail, quiet_on_closed_pipe, recipes_line, sections, shown, skip_the_last_collection,
                                 synopsis, wants_help, wrap)
from negft.config import Config, ConfigError, load_config, model_arch
from negft.outdir import RUN_ENTRIES, check_run_dir, check_writable, hold_run_dir, remove_entries

# README.md sections (a heading starting so) that document the training keys, with what each covers
TRAIN_SECTIONS = (
    ("Commands", "overrides (dotted keys) and the top-level keys"),
    ("Recipes", "each recipe, streams.NAME.*, the objective loss.*"),
    ("Models", "model.*"),
    ("Towers, precision, scale", "tower, model.train_logit_scale, train.* (precision, ZeRO, speed)"),
    ("Checkpoints and resume", "resume (latest, auto), train.checkpoint_every, train.dist_timeout_s"),
    ("Running on a cluster", "srun, torchrun, resume=auto, SIGUSR1 and the requeue, DEEPSPEED_TIMEOUT"),
    ("The embedded world", "data=world, world.*"),
    ("Training on real data", "streams.NAME.manifest / urls, $NEGFT_DATA"),
    ("Patching and release", "patch.*"),
    ("Metrics", "eval.suite and the metric names"),
)


def synopses() -> list[tuple[str, str]]:
    return [(synopsis("negft train", Config, ("recipe", "out")), "same as python train.py")]


def config_blocks() -> tuple[list[str], list[tuple[str, str]]]:
    """(the top-level keys, [(block, the file and class that define its keys)]), read off ``Config`` itself: a
    block's class is its field's default (``loss``: the class its default factory builds, wherever it lives)."""
    top, blocks = [], []
    for f in dataclasses.fields(Config):
        kind = str(f.type)
        if f.default_factory is dataclasses.MISSING:
            top.append(f.name)
        elif kind.startswith(("Dict", "dict")):
            classes = re.findall(r"\b([A-Z]\w*Cfg)\b", kind)
            blocks.append((f"{f.name}.NAME.*", f"negft/config.py {classes[-1]}") if classes
                          else (f"{f.name}.*", f"negft/config.py Config.{f.name}"))
        elif f.name == "loss":        # its class lives beside the losses (torch): named by the snapshot
            blocks.append(("loss.*", loss_keys()["class"]))
        else:
            cls = type(f.default_factory())
            blocks.append((f"{f.name}.*", f"{cls.__module__.replace('.', '/')}.py {cls.__name__}"))
    return top, blocks


# the loss keys as --help shows them, a snapshot of negft.losses.LossCfg (whose settings live beside the losses and
# import torch): written by `python -m negft.commands.train --loss-keys`, checked against the registry by
# tests/test_convert_keys.py, so that --help answers without importing torch
LOSS_KEYS = Path(__file__).with_name("loss_keys.json")


def live_loss_keys() -> dict:
    """{class: its file and name, rows: [[key=DEFAULT, doc; rule], ...]} read off ``LossCfg`` (imports torch)."""
    from negft.fields import doc, items
    from negft.losses import LossCfg
    rows = [[f"{k}={shown(v)}", "; ".join(t for t in (doc(f), rule(f)) if t)] for k, f, v in items(LossCfg(), "loss.")]
    return {"class": f"{LossCfg.__module__.replace('.', '/')}.py {LossCfg.__name__}", "rows": rows}


def loss_keys() -> dict:
    return json.loads(LOSS_KEYS.read_text())


def rule(f) -> str:
    """A field's allowed values as ``--help`` shows them: its choices or its range, from its declaration."""
    if "choices" in f.metadata:
        return "one of " + ", ".join(shown(c) or '""' for c in f.metadata["choices"])
    lo, hi = f.metadata.get("range", (None, None))
    return f"in [{lo}, {hi}]" if lo is not None and hi is not None else f">= {lo}" if lo is not None else (
        f"<= {hi}" if hi is not None else "")


def key_lines() -> list[str]:
    """Every training key with its default, allowed values and doc, read off ``Config`` in its order
    (``streams.NAME.*``: the fields of ``StreamCfg``, each stream's keys)."""
    from negft.config import StreamCfg
    from negft.fields import doc, items
    rows = []
    for k, f, v in items(Config(loss={})):        # the loss keys from their snapshot (LOSS_KEYS)
        if k == "streams":
            rows += [(f"{key}={shown(value)}", "; ".join(t for t in (doc(g), rule(g)) if t))
                     for key, g, value in items(StreamCfg(), "streams.NAME.")]
        elif k == "on_world":
            rows.append(("on_world.KEY=VALUE", "a recipe's value when data=world"))
        elif k == "loss":
            rows += [tuple(r) for r in loss_keys()["rows"]]
        else:
            rows.append((f"{k}={shown(v)}", "; ".join(t for t in (doc(f), rule(f)) if t)))
    width = max(len(w) for w, _ in rows if len(w) < 40) + 2
    return [wrap(f"  {word.ljust(width)}{text}" if len(word) < width else f"  {word}  {text}", width + 2)
            for word, text in rows]


def help_() -> str:
    """``train.py --help``: usage, the recipes, every key (``Config`` itself), the README's sections."""
    top, blocks = config_blocks()
    width = max(len(b) for b, _ in blocks) + 2
    return "\n".join([
        "usage: python train.py [recipe=NAME] [key=value ...]",
        "       negft train [recipe=NAME] [key=value ...]",
        "       deepspeed [--num_gpus N] [--hostfile F] train.py [recipe=NAME] [key=value ...]",
        "       torchrun --nproc_per_node N train.py ...  |  srun python train.py ...   (ranks from the environment)",
        "",
        "Train a recipe into out=DIR (default runs/<recipe>), with its probe suite before training and after every",
        "epoch. Keys are dotted (optim.lr=1e-5 streams.negmcq.batch_size=32); an unknown key or bad value exits 2",
        "before anything is written, naming the valid choices.",
        "",
        recipes_line(),
        "",
        "blocks of keys, each a dataclass (its comments say more):",
        f"  {'top level'.ljust(width)}negft/config.py Config: {', '.join(top)}",
        *[f"  {block.ljust(width)}{cls}" for block, cls in blocks],
        "",
        "keys (key=DEFAULT before a recipe sets it; negft recipes cp NAME DEST.yaml shows a recipe's values):",
        *key_lines(),
        "",
        "README.md sections:",
        *sections(TRAIN_SECTIONS),
    ])



@quiet_on_closed_pipe
def main(argv: list[str]) -> int:
    """``train.py ARGS`` / ``negft train ARGS``: 0 when the run is done, 2 for a bad recipe, key or value, an
    ``out`` that cannot be written, holds another run or is in use by one, or a sweep that cannot choose (before
    anything is written), 1 when the run cannot go on, 128 + the signal when stopped by SIGTERM / SIGUSR1 / SIGINT
    (Ctrl-C)."""
    if wants_help(argv):
        print(help_())
        return 0
    skip_the_last_collection()
    try:
        cfg = load_config(argv)
        from negft import probes        # the metric names the patching rule may read are the probes' to declare
        bad = probes.pattern_errors("patch.targets", cfg.patch.targets) + probes.pattern_errors("patch.drift",
                                                                                              cfg.patch.drift)
        if bad:
            raise ConfigError("; ".join(bad))
        check_writable(cfg.out)
        check_sweep(cfg)
    except ConfigError as e:
        return fail(str(e))
    from negft.provenance import code
    code()                  # the commit the ledger lines record, read as the run starts (negft.provenance)
    from negft.data.pipeline import DataError
    from negft.io import WriteError
    from negft.train.engine import launched
    from negft.train.loop import BadSteps
    from negft.train.stop import Stopped
    try:
        with hold_run_dir(cfg.out, launched().rank):
            check_run_dir(cfg, lambda word: rerun_command(argv, word))
            if cfg.overwrite and launched().rank == 0:
                remove_entries(cfg.out, RUN_ENTRIES)
            run(cfg)
    except ConfigError as e:
        return fail(str(e))
    except Stopped as e:    # a stop signal: stopped after writing a checkpoint; 128 + the signal, as killed by it
        if _rank() == 0:
            print(f"negft: {e}. Continue with:\n  {continue_command(argv, cfg)}", file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt:   # a second Ctrl-C, or one before the training loop: no step to finish
        if _rank() == 0:
            print(f"negft: interrupted (SIGINT). {_where_to_continue(argv, cfg, 'continue with')}", file=sys.stderr,
                  flush=True)
        return 128 + signal.SIGINT
    except (DataError, WriteError, BadSteps) as e:      # the run cannot go on as it is: exit 1 (2 is for bad input)
        print(f"negft: error: {e}\n{_where_to_continue(argv, cfg)}", file=sys.stderr, flush=True)
        return 1
    except Exception as e:
        from negft.train.engine import collective_timeout, lost_rank
        if not lost_rank(e):
            raise
        print(f"negft: error: rank {_rank()} lost the other ranks in a collective ({str(e).splitlines()[0]}): a rank "
              f"died, hung or became unreachable (a collective waits {collective_timeout(cfg.train.dist_timeout_s)[1]}"
              f"). Look for the first rank that failed in the log.\n"
              f"{_where_to_continue(argv, cfg)}", file=sys.stderr, flush=True)
        return 1
    return 0


def _rank() -> int:
    import torch.distributed as dist
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def continue_command(argv: list[str], cfg) -> str:
    """The command that continues this run: the launcher that started it, its settings, its ``out``, and
    ``resume=auto`` where it was launched so (the same command line, as a requeued job repeats it), else
    ``resume=latest`` where ``out`` holds the run (before that, a world base model was training, and the same
    command resumes it)."""
    import shlex
    args = [a for a in argv if not a.lstrip("-").startswith(("local_rank", "resume=", "overwrite="))]
    if not any(a.lstrip("-").startswith("out=") for a in args):
        args.append(f"out={cfg.out}")
    if cfg.resume == "auto":
        args.append("resume=auto")
    elif (Path(cfg.out) / "config.yaml").exists():
        args.append("resume=latest")
    return " ".join([*launch_words(), *map(shlex.quote, args)])


def launch_words() -> list[str]:
    """The launcher and entry that started this process, with its rank count (``negft.train.engine.launch_env``).
    A launcher's other options are not visible to a rank: one machine, or placeholders for what spans several."""
    from negft.train.engine import launched
    env = launched()
    entry = ["negft", "train"] if Path(sys.argv[0]).name in ("negft", "__main__.py") else ["python", "train.py"]
    one_machine = env.local_size == env.world_size
    if env.launcher == "srun":
        return ["srun", "--ntasks", str(env.world_size), *entry]
    if env.launcher == "torchrun":
        nodes = ["--nproc_per_node", str(env.world_size)] if one_machine else [
            "--nnodes", str(env.world_size // env.local_size), "--nproc_per_node", str(env.local_size),
            "--rdzv_endpoint", "HOST:PORT"]
        return ["torchrun", *nodes, "train.py"]
    if env.launcher == "deepspeed" and env.world_size > 1:
        return ["deepspeed", *(["--num_gpus", str(env.world_size)] if one_machine else ["--hostfile", "HOSTFILE"]),
                "train.py"]
    return entry


def _where_to_continue(argv: list[str], cfg, how: str = "once that is put right, continue with") -> str:
    """The last complete checkpoint and the command that continues from it, once the fault is put right."""
    from negft.train.loop import latest_checkpoint
    ckpt = latest_checkpoint(Path(cfg.out))
    where = f"The last complete checkpoint is {ckpt}" if ckpt else f"There is no complete checkpoint in {cfg.out}"
    return f"{where}; {how}:\n  {continue_command(argv, cfg)}"


def rerun_command(argv: list[str], word: str) -> str:
    """This command line (its launcher's words too) with ``word`` (``resume=latest``, ``overwrite=true``) in place of
    its own ``resume=`` and ``overwrite=``."""
    import shlex
    args = [a for a in argv if not a.lstrip("-").startswith(("local_rank", "resume=", "overwrite="))]
    return " ".join([*launch_words(), *map(shlex.quote, args), word])


def check_sweep(cfg: Config) -> None:
    """Refuse a run whose patching sweep (``patch.sweep``) could not choose: no probe of ``eval.suite`` measures a
    metric of ``patch.targets`` (``negft.patching.targets_error``); found now, not after the training. A run from
    random weights skips its sweep (``sweep_and_release``): nothing to refuse."""
    random_init = not (cfg.model.world_pretrained if cfg.data == "world" else cfg.model.pretrained)
    if not cfg.patch.sweep or cfg.train.synthetic or random_init:
        return
    from negft.patching import targets_error
    error = targets_error(list(cfg.patch.targets), cfg.eval.suite)
    if error:
        raise ConfigError(f"patch.sweep=true: {error}. Pass patch.sweep=false (smoke=true turns it off too), or an "
                          "eval.suite that measures patch.targets")


def run(cfg: Config) -> Path:
    """Every stage the recipe asks for; returns the run directory."""
    from negft.train.engine import barrier
    from negft.train.ledger import write_report
    from negft.train.loop import setup, train
    from negft.train.recorder import report_title, run_notes
    from negft.train.world_base import base_weights
    where = setup(cfg)                  # once: the world a base trains on is built before the base
    rank = where.rank
    base = base_weights(cfg, where)
    caches = {}
    run_dir = train(cfg, base, where, caches)
    if rank == 0:
        if cfg.patch.sweep and not cfg.train.synthetic:
            notes = sweep_and_release(cfg, run_dir, base, caches)
            write_report(run_dir, report_title(cfg), run_notes(cfg, run_dir, base) + notes)
        print(f"[negft] done: {run_dir if cfg.train.synthetic else run_dir / 'report.md'}", flush=True)
    barrier()
    return run_dir


# --------------------------------------------------------------------------- after training
def ledger_results(run_dir: Path, epochs: dict[str, int]) -> dict[str, dict]:
    """{name: the ledger's metrics, ci95 and skipped at epoch} for those of ``epochs`` the run's ledger holds."""
    from negft.train.ledger import Ledger
    lines = {line["epoch"]: line for line in Ledger(run_dir).read()}
    return {name: {k: lines[e][k] for k in ("metrics", "ci95", "skipped")} for name, e in epochs.items()
            if e in lines}


def sweep_and_release(cfg: Config, run_dir: Path, base: str, eval_caches: dict | None = None) -> list[str]:
    """patch.sweep: patch the last epoch toward ``base`` (negft patch), release the selected model; returns
    report.md's notes on both. Both are kept if they exist (a re-run into the same run directory), never
    overwritten. ``eval_caches``: the training run's evaluation caches; its frozen tower's features are the
    base's, so the patch's test-split evaluations reuse them where they are the same data at the same precision,
    and take the base's and the last epoch's results from the run's ledger (epoch 0 and the last epoch)."""
    from negft.patching import Rule, parse_alphas, parse_towers, patch
    from negft.release import release
    from negft.tables import patch_choice
    if not base:
        print("[negft] patch.sweep skipped: the run started from random weights, there is no base to patch "
              "toward", flush=True)
        return []
    last = max((run_dir / "checkpoints").glob("epoch_*"), key=lambda p: int(p.name.split("_")[1]))
    out, rel = run_dir / "patch", run_dir / "release"
    if not (out / "selected.json").exists():
        print(f"[negft] patching sweep: towers {cfg.patch.towers}, alphas {cfg.patch.alphas} → {out}", flush=True)
        # the patch's test split is the one the run evaluated on, the same way: its caches and results carry over
        same_test = cfg.data == "world" and cfg.eval.split == "test" and cfg.train.precision == "fp32"
        patch(base, last, out, parse_alphas(cfg.patch.alphas), parse_towers(cfg.patch.towers),
              Rule.of(cfg.patch),
              suite=cfg.eval.suite, arch=model_arch(cfg), batch_size=cfg.eval.batch_size,
              bootstrap=cfg.eval.bootstrap, test_caches=eval_caches if same_test else None,
              test_results=ledger_results(run_dir, {"base": 0, "finetuned": int(last.name.split("_")[1])})
              if same_test else None)
    if not rel.exists():
        release(out / "selected", rel)
    sel = json.loads((out / "selected.json").read_text())
    print(f"[negft] selected: {patch_choice(sel['alpha'], sel['tower'])}; released {rel}", flush=True)
    return ["", f"Patching sweep of `{last.name}` toward the base (α = weight of the fine-tuned model): "
                f"[sweep.png](patch/sweep.png), [sweep.jsonl](patch/sweep.jsonl), "
                f"[selected.json](patch/selected.json) — {patch_choice(sel['alpha'], sel['tower'])}, chosen on the "
                f"val split by: {sel['rule']}.",
            "Release of the selected model: [release/](release/) ([README.md](release/README.md))."]


if __name__ == "__main__" and sys.argv[1:] == ["--loss-keys"]:
    from negft.io import atomic_write
    atomic_write(LOSS_KEYS, json.dumps(live_loss_keys(), indent=1) + "\n")
    print(f"[negft] wrote {LOSS_KEYS}")
