"""``--help`` / ``-h`` of train.py, eval.py and every negft command: usage, the recipes, every key and where it is
documented, exit 0 — and every place it cites exists."""
import dataclasses
import importlib
import re
import runpy
import sys

import pytest

from negft import cli, cli_help
from negft.config import RECIPES, Config

from conftest import REPO


def _script(capsys, monkeypatch, script, *args) -> tuple[int, str]:
    """Run ``script`` (train.py, eval.py) as ``python script args`` does, in this process."""
    monkeypatch.setattr(sys, "argv", [script, *args])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(REPO / script), run_name="__main__")
    return done.value.code, capsys.readouterr().out


def _cited_sections(text: str) -> set[str]:
    return set(re.findall(r'README(?:\.md)? "([^"]+)"', text)) | set(re.findall(r'^  "([^"]+)"', text, re.M))


def _readme_headings() -> list[str]:
    return [line.lstrip("#").strip() for line in (REPO / "README.md").read_text().splitlines()
            if line.startswith("#")]


def _assert_sections_exist(text: str) -> None:
    headings = _readme_headings()
    cited = _cited_sections(text)
    assert cited
    for name in cited:
        assert any(h.startswith(name) for h in headings), f'README.md has no section "{name}"'


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_train_py_help_lists_the_recipes_and_where_every_key_is_documented(capsys, monkeypatch, flag):
    code, out = _script(capsys, monkeypatch, "train.py", flag)
    assert code == 0 and out.startswith("usage: python train.py")
    recipes = sorted(p.stem for p in RECIPES.glob("*.yaml"))
    assert recipes and all(name in out for name in recipes)
    # every field of Config is a top-level key or a block, each block with the file and class defining its keys
    top, blocks = cli_help.config_blocks()
    assert {b.split(".")[0] for b, _ in blocks} | set(top) == {f.name for f in dataclasses.fields(Config)}
    for block, where in blocks:
        path, name = where.split(" ")
        assert block in out and where in out
        assert (REPO / path).is_file(), where
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        owner = getattr(module, name.split(".")[0])
        assert "." not in name or any(f.name == name.split(".")[1] for f in dataclasses.fields(owner)), where
    _assert_sections_exist(out)


def test_eval_py_help_gives_every_key_its_default_and_meaning(capsys, monkeypatch):
    code, out = _script(capsys, monkeypatch, "eval.py", "--help")
    assert code == 0 and out.startswith("usage: python eval.py")
    for key, default in cli_help.COMMAND_KEYS["eval"].items():
        assert f"  {key}={'...' if default is ... else default}" in out
    assert "suite=" in out and "composition" in out
    _assert_sections_exist(out)


@pytest.mark.parametrize("command", ["data", "train", "eval", "patch", "release"])
def test_every_negft_command_answers_help_even_beside_a_bad_key(capsys, command):
    assert cli.main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage:")
    _assert_sections_exist(out)
    assert cli.main([command, "no_such_key=1", "-h"]) == 0
    assert capsys.readouterr().out == out


def test_negft_help_lists_the_commands_and_recipes(capsys):
    assert cli.main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(f"negft {c}" in out for c in ("data", "train", "eval", "patch", "release"))
    assert all(p.stem in out for p in RECIPES.glob("*.yaml"))
    _assert_sections_exist(out)


def test_every_key_a_command_takes_has_its_meaning():
    for command, (_, _, meanings, _) in cli_help.COMMANDS.items():
        assert list(meanings) == list(cli_help.COMMAND_KEYS[command]), command


def test_without_help_a_bad_word_is_still_refused(capsys):
    assert cli.run_train(["--bogus"]) == 2
    assert "not of the form key=value" in capsys.readouterr().err
