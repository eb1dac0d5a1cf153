"""``negft recipes``: list the recipes, each with what it is; ``negft recipes cp NAME DEST.yaml``: copy one out to
edit. It takes no keys (``RecipesKeys``), only those words."""
from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from negft.commands.keys import fail, outcome, parse, sections, wants_help, wrap
from negft.config import RECIPES, ConfigError, recipe_names


def synopses() -> list[tuple[str, str]]:
    return [("negft recipes", "the recipes, each with what it is"),
            ("negft recipes cp NAME DEST.yaml", "copy one out to edit; recipe=DEST.yaml")]


USAGE = "usage: " + "\n       ".join(use for use, _ in synopses())


@dataclass(kw_only=True)
class RecipesKeys:
    """``negft recipes`` has no keys: ``cp NAME DEST.yaml`` are words."""


def recipe_summary(name: str, width: int = 200) -> str:
    """The first sentence of the comment block recipe ``name`` opens with (each recipe says there what it is),
    shortened to ``width`` characters."""
    lines = []
    for line in (RECIPES / f"{name}.yaml").read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    first = re.split(r"(?<=\.)\s+(?=[A-Z])", " ".join(lines))[0]     # "eq. 2" does not end a sentence
    return textwrap.shorten(first, width, placeholder=" …")


def listing() -> str:
    """``negft recipes``: every recipe with what it is, where they live, and how to copy one out."""
    names = recipe_names()
    if not names:
        return f"no recipes found in {RECIPES}"
    width = max(map(len, names)) + 4
    rows = [wrap(f"  {name.ljust(width - 2)}{recipe_summary(name)}", width) for name in names]
    return "\n".join([f"recipes in {RECIPES} (recipe=NAME; README \"Recipes\"):", *rows, "",
                      wrap("negft recipes cp NAME DEST.yaml copies one out to edit; negft train recipe=DEST.yaml "
                           "trains the copy.", 0)])


def help_() -> str:
    """``negft recipes --help``."""
    return "\n".join([USAGE, "", wrap("List the recipes that recipe=NAME takes, each with the first sentence of its "
                                      "comments; cp copies one to a new file (never over an existing one) that "
                                      "recipe=DEST.yaml reads.", 0),
                      "README.md sections:", *sections((("Recipes", "each recipe, its streams and objective"),))])


def main(argv: list[str]) -> int:
    """``negft recipes [cp NAME DEST.yaml]``: 0 when listed or copied, 2 for bad words, 1 for a failed write."""
    if wants_help(argv):
        print(help_())
        return 0
    try:
        parse(RecipesKeys, [w for w in argv if "=" in w])
    except ConfigError as e:
        return fail(f"{e}\n{USAGE}")
    if not argv:
        print(listing())
        return 0
    if argv[0] != "cp" or len(argv) != 3:
        return fail(f"bad arguments '{' '.join(argv)}'.\n{USAGE}")
    return outcome(lambda: copy_recipe(argv[1], Path(argv[2])),
                   lambda dest: f"[negft] copied recipe {argv[1]} to {dest}; edit it, then: negft train recipe={dest}")


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
