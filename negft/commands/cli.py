"""The ``negft`` console script: ``negft COMMAND ...`` runs the command module of that name (``COMMANDS``), whose
``main`` parses its keys (one dataclass), runs it and returns the exit status. Bad keys or values exit 2 before
anything is written; ``--help`` / ``-h`` prints the command's usage, keys and where they are documented, exit 0.
The other words of the command line are not read then, so ``--help`` answers even beside a bad key."""
from __future__ import annotations

import importlib
import sys

from negft.commands.keys import (fail, quiet_on_closed_pipe, recipes_line, skip_the_last_collection, synopsis_rows,
                                 wrap)

COMMANDS = ("data", "recipes", "train", "eval", "patch", "release", "table", "compare")     # each a module of negft.commands



def usage() -> str:
    """``negft``'s usage: each command as its keys' dataclass spells it (its module's ``synopses``)."""
    rows = [row for name in COMMANDS for row in command(name).synopses()]
    rows.append(("negft COMMAND --help", "its keys, their defaults and where they are documented"))
    return "\n".join(["usage:", *synopsis_rows(rows)])


def main_help() -> str:
    """``negft --help``: the commands, the recipes, where to read more."""
    return "\n".join([usage(), "", recipes_line(), "",
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
        print(main_help() if argv else usage())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        return fail(f"unknown command '{argv[0]}'.\n{usage()}")
    skip_the_last_collection()
    return command(argv[0]).main(argv[1:])
