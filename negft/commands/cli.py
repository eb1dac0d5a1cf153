"""The ``negft`` console script: ``negft COMMAND ...`` runs the command module of that name (``COMMANDS``), whose
``main`` parses its keys (one dataclass), runs it and returns the exit status. Bad keys or values exit 2 before
anything is written; ``--help`` / ``-h`` prints the command's usage, keys and where they are documented, exit 0.
The other words of the command line are not read then, so ``--help`` answers even beside a bad key."""
from __future__ import annotations

import importlib
import sys

from negft.commands.keys import fail, quiet_on_closed_pipe, recipes_line, skip_the_last_collection, wrap

COMMANDS = ("data", "recipes", "train", "eval", "patch", "release", "table", "compare")     # each a module of negft.commands

USAGE = """usage:
  negft data world out=DIR [seed=N] [size=tiny|demo|full] [workers=N]   build the embedded world
  negft data convert FORMAT ... out=DIR                                  released files -> shards (negft data help)
  negft data negate | relcomp | check ...                                NegCap/NegMCQ, RelComp, presence checks
  negft recipes                                                          the recipes, each with what it is
  negft recipes cp NAME DEST.yaml                                        copy one out to edit; recipe=DEST.yaml
  negft train [recipe=NAME] [key=value ...]                              same as python train.py
  negft eval ckpt=DIR|FILE|hf-hub:ORG/NAME|local-dir:DIR [suite=...] [base=CKPT|TAG|hf-hub:ORG/NAME|recorded]
             [format=clip_benchmark] [verify=false] out=DIR              same as python eval.py
  negft eval model=ARCH pretrained=TAG [suite=...] out=DIR               any open_clip tag (ViT-B-32 openai)
  negft patch base=CKPT|TAG|hf-hub:ORG/NAME|recorded finetuned=CKPT out=DIR [alphas=0:1:0.1] [towers=v,t,vt]
              [suite=default] [targets=M,M] [drift=M,M] [max_drift=0.03] [verify=false]
                                                                         sweep α, select on val, report test
  negft release ckpt=DIR out=DIR [license=ID] [push=ORG/NAME [private=true] [dry_run=true]]
                                                                         safetensors + config + README.md card +
                                                                         SHA256SUMS; push: upload it to the Hub
  negft table RESULTS.json [RESULTS.json ...] [out=DIR] [names=A,B] [rule=official|negft] [ci=true]
                                                                         the table papers print, one row per model
  negft compare A/results.json B/results.json [out=DIR]                  A, B, B − A and a paired test per metric
  negft COMMAND --help                                                   its keys and where they are documented
"""


def main_help() -> str:
    """``negft --help``: the commands, the recipes, where to read more."""
    return "\n".join([USAGE.rstrip(), "", recipes_line(), "",
                      wrap("negft COMMAND --help, python train.py --help, python eval.py --help: the command's keys, "
                           "their defaults and where each is documented (training keys: negft/config.py and "
                           "README.md \"Commands\").", 0)])


def command(name: str):
    """The module of command ``name`` (imported when run: a command's imports are its own)."""
    return importlib.import_module(f"negft.commands.{name}")


@quiet_on_closed_pipe
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(main_help() if argv else USAGE)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        return fail(f"unknown command '{argv[0]}'.\n{USAGE}")
    skip_the_last_collection()
    return command(argv[0]).main(argv[1:])
