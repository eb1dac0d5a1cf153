"""Command lines: ``train.py``, ``eval.py`` and the ``negft`` console script.

Bad keys or values exit with status 2 before anything is written; ``--help`` / ``-h`` prints the command's usage,
keys and where they are documented (``negft.cli_help``) and exits 0.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from negft.cli_help import COMMAND_KEYS, wants_help
from negft.config import ConfigError, load_config, parse_overrides

USAGE = """usage:
  negft data world out=DIR [seed=N] [size=tiny|demo|full] [workers=N]   build the embedded world
  negft data convert FORMAT ... out=DIR                                  released files -> shards (negft data help)
  negft data negate | relcomp | check ...                                NegCap/NegMCQ, RelComp, presence checks
  negft recipes                                                          the recipes, each with what it is
  negft recipes cp NAME DEST.yaml                                        copy one out to edit; recipe=DEST.yaml
  negft train [recipe=NAME] [key=value ...]                              same as python train.py
  negft eval ckpt=DIR|FILE [suite=...] [base=CKPT|TAG|recorded] [format=clip_benchmark] [verify=false] out=DIR
                                                                         same as python eval.py
  negft patch base=CKPT|TAG|recorded finetuned=CKPT out=DIR [alphas=0:1:0.1] [towers=v,t,vt]
              [suite=default] [targets=M,M] [drift=M,M] [max_drift=0.03] [verify=false]
                                                                         sweep α, select on val, report test
  negft release ckpt=DIR out=DIR [license=ID] [push=ORG/NAME [private=true] [dry_run=true]]
                                                                         safetensors + config + README.md card +
                                                                         SHA256SUMS; push: upload it to the Hub
  negft COMMAND --help                                                   its keys and where they are documented
"""


def _fail(message: str) -> int:
    print(f"negft: error: {message}", file=sys.stderr)
    return 2


def _write_failed(e: Exception) -> int:
    """A write that failed (a full disk, a read-only out): its ``WriteError`` names the path and what was kept;
    exit 1 (2 is for bad input)."""
    print(f"negft: error: {e}\nFree space or fix the permissions, then run the same command again.", file=sys.stderr)
    return 1


def run_train(argv: list[str]) -> int:
    from negft.config import check_run_dir
    if wants_help(argv):
        from negft.cli_help import train_help
        print(train_help())
        return 0
    try:
        cfg = load_config(argv)
        check_run_dir(cfg)
    except ConfigError as e:
        return _fail(str(e))
    from negft.provenance import code
    code()                  # the commit the ledger lines record, read as the run starts (negft.provenance)
    from negft.data.pipeline import DataError
    from negft.io import WriteError
    from negft.stages import run
    from negft.train.loop import BadSteps
    from negft.train.stop import Stopped
    try:
        run(cfg)
    except ConfigError as e:
        return _fail(str(e))
    except Stopped as e:    # SIGTERM / SIGUSR1: stopped after writing a checkpoint; 128 + the signal, as killed by it
        if _rank() == 0:
            print(f"negft: {e}. Continue with:\n  {continue_command(argv, cfg)}", file=sys.stderr, flush=True)
        return e.exit_code
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
    args = [a for a in argv if not a.startswith(("--local_rank", "resume=", "--resume="))]
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


def _where_to_continue(argv: list[str], cfg) -> str:
    """The last complete checkpoint and the command that continues from it, once the fault is put right."""
    from negft.train.loop import latest_checkpoint
    ckpt = latest_checkpoint(Path(cfg.out))
    where = f"The last complete checkpoint is {ckpt}" if ckpt else f"There is no complete checkpoint in {cfg.out}"
    return f"{where}; once that is put right, continue with:\n  {continue_command(argv, cfg)}"


def _take(args: dict, allowed: dict) -> dict:
    """Validate ``key=value`` args against ``allowed`` {key: default}; unknown keys are an error."""
    import difflib
    for key in args:
        if key not in allowed:
            close = difflib.get_close_matches(key, list(allowed), n=1)
            raise ConfigError(f"unknown key '{key}'." + (f" Did you mean '{close[0]}'?" if close else "")
                              + f" Valid keys: {', '.join(allowed)}")
    missing = [k for k, v in allowed.items() if v is ... and k not in args]
    if missing:
        raise ConfigError(f"missing required key(s): {', '.join(f'{k}=...' for k in missing)}")
    return {k: args.get(k, v) for k, v in allowed.items()}


def _command(argv: list[str], allowed: dict, action, done: str, check=None) -> int:
    """Validate ``key=value`` args (and ``check`` them) before anything runs, then run ``action(**args)``;
    bad input exits 2 with the message, success prints ``done`` and the path ``action`` returns."""
    try:
        args = _take(parse_overrides(argv), allowed)
        if check:
            check(args)
    except (ConfigError, ValueError) as e:
        return _fail(str(e))
    from negft.io import WriteError
    try:
        path = action(**args)
    except (FileNotFoundError, FileExistsError, ValueError) as e:
        return _fail(str(e))
    except WriteError as e:
        return _write_failed(e)
    print(f"[negft] {done}: {path}")
    return 0


def _help(command: str) -> int:
    from negft.cli_help import command_help
    print(command_help(command))
    return 0


def _check_suite(args: dict) -> None:
    from negft import probes
    probes.suite(args["suite"])


RECIPES_USAGE = "usage: negft recipes\n       negft recipes cp NAME DEST.yaml"


def run_recipes(argv: list[str]) -> int:
    """``negft recipes``: list them; ``negft recipes cp NAME DEST.yaml``: copy one out to edit."""
    from negft import cli_help
    if wants_help(argv):
        print(cli_help.recipes_help(RECIPES_USAGE))
        return 0
    if not argv:
        print(cli_help.recipes_listing())
        return 0
    if argv[0] != "cp" or len(argv) != 3:
        return _fail(f"bad arguments '{' '.join(argv)}'.\n{RECIPES_USAGE}")
    from negft.io import WriteError
    try:
        dest = copy_recipe(argv[1], Path(argv[2]))
    except (ConfigError, FileExistsError, FileNotFoundError) as e:
        return _fail(str(e))
    except WriteError as e:
        return _write_failed(e)
    print(f"[negft] copied recipe {argv[1]} to {dest}; edit it, then: negft train recipe={dest}")
    return 0


def copy_recipe(name: str, dest: Path) -> Path:
    """Copy recipe ``name`` to ``dest``, a new ``.yaml`` file (recipe=DEST reads only those); never overwrites."""
    from negft.config import resolve_recipe_path
    from negft.io import atomic_path
    source = resolve_recipe_path(name)
    if dest.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"DEST '{dest}' must end in .yaml, so that recipe={dest} reads it as a file")
    try:
        with atomic_path(dest, overwrite=False) as staged:
            staged.write_text(source.read_text(encoding="utf-8"), encoding="utf-8")
    except FileExistsError:
        raise FileExistsError(f"'{dest}' exists; negft recipes cp never overwrites it: choose another DEST or "
                              "remove it") from None
    return dest


def run_eval(argv: list[str]) -> int:
    if wants_help(argv):
        return _help("eval")
    from negft.eval_cmd import FORMATS, evaluate_checkpoint

    def check(args):
        _check_suite(args)
        if args["format"] not in FORMATS:
            raise ConfigError(f"bad value '{args['format']}' for 'format'. Valid choices: clip_benchmark "
                              "(or leave it out)")
    return _command(argv, COMMAND_KEYS["eval"], evaluate_checkpoint, "results", check)


# `negft data SUB ...`: each sub-command is a function; positional words fill its leading parameters in
# order, key=value words its keywords (checked against its signature before it runs)
DATA_COMMANDS = {
    "convert negbench-negcap": "negft.convert.negbench:convert_negcap",
    "convert negbench-mcq": "negft.convert.negbench:convert_mcq",
    "convert img2dataset": "negft.convert.img2dataset:convert",
    "convert coco": "negft.convert.coco:convert",
    "negate": "negft.convert.negate:negate",
    "relcomp": "negft.convert.relcomp_vg:relcomp",
}


def _data_usage() -> str:
    import importlib
    import inspect
    lines = ["usage:", "  negft data world out=DIR [seed=N] [size=tiny|demo|full] [workers=N]",
             "  negft data check MANIFEST|all [checksums=false]"]
    for name, target in DATA_COMMANDS.items():
        module, func = target.split(":")
        try:
            fn = getattr(importlib.import_module(module), func)
        except (ImportError, AttributeError):
            continue
        params = inspect.signature(fn).parameters.values()
        words = [p.name.upper() if p.default is inspect.Parameter.empty else f"[{p.name}={p.default}]"
                 for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
        lines.append(f"  negft data {name} {' '.join(words)}")
    return "\n".join(lines)


def _call(fn, words: list[str]):
    """Call ``fn`` with positional words and key=value words, refusing unknown or missing ones by name."""
    import difflib
    import inspect
    params = inspect.signature(fn).parameters
    positional = [w for w in words if "=" not in w or w.startswith(("/", "."))]
    keywords = parse_overrides([w for w in words if w not in positional])
    names = list(params)
    if len(positional) > len(names):
        raise ConfigError(f"too many positional arguments: {' '.join(positional[len(names):])}")
    bound = dict(zip(names, positional))
    for key, value in keywords.items():
        if key not in params:
            close = difflib.get_close_matches(key, names, n=1)
            raise ConfigError(f"unknown key '{key}'." + (f" Did you mean '{close[0]}'?" if close else "")
                              + f" Valid keys: {', '.join(names)}")
        if key in bound:
            raise ConfigError(f"'{key}' given twice (positionally and as {key}=)")
        bound[key] = value
    missing = [n for n, p in params.items() if p.default is inspect.Parameter.empty and n not in bound]
    if missing:
        raise ConfigError(f"missing: {', '.join(n.upper() for n in missing)}")
    return fn(**bound)


def run_data(argv: list[str]) -> int:
    import importlib
    if not argv or argv[0] == "help" or wants_help(argv):
        from negft.cli_help import data_help
        print(data_help(_data_usage()) if argv else _data_usage())
        return 0 if argv else 2
    if argv[0] == "world":
        return run_world(argv[1:])
    if argv[0] == "check":
        from negft.data.check import main as check_main
        return check_main(argv[1:])
    name = " ".join(argv[:2]) if argv[0] == "convert" else argv[0]
    if name not in DATA_COMMANDS:
        formats = [n.split(" ", 1)[1] for n in DATA_COMMANDS if n.startswith("convert ")]
        if argv[0] == "convert":
            return _fail(f"unknown format '{' '.join(argv[1:2])}' for negft data convert. "
                         f"Formats: {', '.join(formats)}")
        return _fail(f"unknown data command '{argv[0]}'.\n{_data_usage()}")
    module, func = DATA_COMMANDS[name].split(":")
    fn = getattr(importlib.import_module(module), func)
    words = argv[2:] if argv[0] == "convert" else argv[1:]
    from negft.io import WriteError
    try:
        result = _call(fn, words)
    except (ConfigError, FileNotFoundError, FileExistsError, ValueError) as e:
        return _fail(str(e))
    except WriteError as e:
        return _write_failed(e)
    summary = {k: result[k] for k in ("out", "counts", "skipped", "images_per_second") if k in result}
    print(json.dumps(summary))
    return 0


def run_world(argv: list[str]) -> int:
    try:
        args = _take(parse_overrides(argv), {"out": ..., "seed": "0", "size": "demo", "workers": ""})
        from negft.world.generator import SIZES
        if args["size"] not in SIZES:
            raise ConfigError(f"bad value '{args['size']}' for 'size'. Valid choices: {', '.join(SIZES)}")
        seed = int(args["seed"])
        workers = int(args["workers"]) if args["workers"] else None
    except ValueError as e:
        return _fail(str(e))
    from negft.io import WriteError
    from negft.world.generator import build_world
    try:
        meta = build_world(Path(args["out"]), seed=seed, size=args["size"], workers=workers)
    except WriteError as e:
        return _write_failed(e)
    print(json.dumps({"out": args["out"], "counts": meta.get("counts"), "images_per_second": meta.get("images_per_second")}))
    return 0


def run_patch(argv: list[str]) -> int:
    if wants_help(argv):
        return _help("patch")
    from negft.patch_cmd import patch, run_rule
    from negft.patching import parse_alphas, parse_towers
    from negft.release import parse_verify

    def check(args):
        _check_suite(args)
        parse_alphas(args["alphas"])
        parse_towers(args["towers"])
        parse_verify(args["verify"])

    def action(base, finetuned, out, alphas, towers, suite, arch, world_dir, targets, drift, max_drift,
               batch_size, bootstrap, verify):
        rule = run_rule(Path(finetuned))                 # the run's rule, with the command line's changes
        if targets:
            rule.targets = targets.split(",")
        if drift:
            rule.drift = drift.split(",")
        if max_drift:
            rule.max_drift = float(max_drift)
        return patch(base, Path(finetuned), Path(out), parse_alphas(alphas), parse_towers(towers), rule, suite,
                     arch, Path(world_dir) if world_dir else None, int(batch_size), int(bootstrap),
                     parse_verify(verify))
    return _command(argv, COMMAND_KEYS["patch"], action, "selected", check)


def run_release(argv: list[str]) -> int:
    if wants_help(argv):
        return _help("release")
    from negft.release import parse_flag, release_command

    def check(args):
        if not args["ckpt"] and not args["push"]:
            raise ConfigError("missing required key(s): ckpt=... (or push=ORG/NAME to upload the release in out)")
        parse_flag("private", args["private"])
        parse_flag("dry_run", args["dry_run"])
    return _command(argv, COMMAND_KEYS["release"], release_command, "release", check)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        from negft.cli_help import main_help
        print(main_help(USAGE) if argv else USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "data":
        return run_data(rest)
    if command == "recipes":
        return run_recipes(rest)
    if command == "train":
        return run_train(rest)
    if command == "eval":
        return run_eval(rest)
    if command == "patch":
        return run_patch(rest)
    if command == "release":
        return run_release(rest)
    return _fail(f"unknown command '{command}'.\n{USAGE}")
