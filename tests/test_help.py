"""``--help`` / ``-h`` of train.py, eval.py and every negft command: usage, the recipes, every key and where it is
documented, exit 0 — and every place it cites exists. Both are made from each command's one dataclass of keys, which
also refuses an unknown key with the nearest ones (exit 2)."""
import dataclasses
import importlib
import re
import runpy
import sys

import pytest

from negft.commands import cli, compare, data, eval as eval_command, patch, release, table, train
from negft.config import RECIPES, Config
from negft.fields import doc

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
    top, blocks = train.config_blocks()
    assert {b.split(".")[0] for b, _ in blocks} | set(top) == {f.name for f in dataclasses.fields(Config)}
    for block, where in blocks:
        path, name = where.split(" ")
        assert block in out and where in out
        assert (REPO / path).is_file(), where
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        owner = getattr(module, name.split(".")[0])
        assert "." not in name or any(f.name == name.split(".")[1] for f in dataclasses.fields(owner)), where
    _assert_sections_exist(out)


def test_train_py_help_lists_every_key_with_its_default_and_allowed_values(capsys, monkeypatch):
    """Each key a recipe can set (the leaves of Config, a stream's keys once as streams.NAME.*) is a line of
    --help, as key=DEFAULT, with its choices or range where its field declares them."""
    from negft.commands.keys import shown
    from negft.config import StreamCfg
    from negft.fields import items
    code, out = _script(capsys, monkeypatch, "train.py", "--help")
    entries = [" ".join(e.split()) for e in re.split(r"\n(?=  \S)", out)]      # a key's line and its wrapped ones
    keys = [(k, f) for k, f, _ in items(Config()) if k not in ("streams", "on_world")]
    keys += [(k, f) for k, f, _ in items(StreamCfg(), "streams.NAME.")]
    for k, f in keys:
        [entry] = [e for e in entries if e.startswith(f"{k}=")]
        if "choices" in f.metadata:
            assert "one of " + ", ".join(shown(c) for c in f.metadata["choices"]) in entry, k
        lo, hi = f.metadata.get("range", (None, None))
        if lo is not None:
            assert (f"in [{lo}, {hi}]" if hi is not None else f">= {lo}") in entry, k


def test_eval_py_help_gives_every_key_its_default_and_meaning(capsys, monkeypatch):
    code, out = _script(capsys, monkeypatch, "eval.py", "--help")
    assert code == 0 and out.startswith("usage: python eval.py")
    for f in dataclasses.fields(eval_command.EvalKeys):
        default = "..." if f.default is dataclasses.MISSING else {None: "", True: "true", False: "false"}.get(
            f.default, f.default) if not isinstance(f.default, (int, float)) or isinstance(f.default, bool) else f.default
        assert f"  {f.name}={default}" in out and doc(f).split()[0] in out
    assert "suite=" in out and "composition" in out
    _assert_sections_exist(out)


@pytest.mark.parametrize("command", ["data", "train", "eval", "patch", "release", "recipes", "table", "compare"])
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
    assert all(f"negft {c}" in out for c in cli.COMMANDS)
    assert all(p.stem in out for p in RECIPES.glob("*.yaml"))
    _assert_sections_exist(out)


KEYS = [eval_command.EvalKeys, patch.PatchKeys, release.ReleaseKeys, data.WorldKeys, data.CheckKeys, table.TableKeys,
        compare.CompareKeys]


@pytest.mark.parametrize("keys", KEYS, ids=lambda k: k.__name__)
def test_every_key_a_command_takes_has_its_one_line_doc(keys):
    for f in dataclasses.fields(keys):
        assert doc(f) and "\n" not in doc(f), f"{keys.__name__}.{f.name}"


@pytest.mark.parametrize("argv, near", [
    (["train", "optim.lrr=1"], "optim.lr"),
    (["eval", "out=o", "ckp=x"], "ckpt"),
    (["patch", "base=a", "out=o", "finetune=b"], "finetuned"),
    (["release", "ckpt=a", "out=o", "licence=mit"], "license"),
    (["data", "world", "out=o", "sed=1"], "seed"),
    (["data", "check", "all", "checksum=true"], "checksums"),
    (["data", "convert", "coco", "a", "b", "c", "o", "maxcnt=5"], "maxcount"),
    (["data", "convert", "negbench-negcap", "a", "b", "o", "caption_kye=x"], "caption_key"),
    (["data", "negate", "a", "b", "o", "sed=1"], "seed"),
    (["data", "relcomp", "a", "b", "o", "max_per_img=2"], "max_per_image"),
])
def test_an_unknown_key_exits_2_naming_the_nearest_keys(capsys, argv, near):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"unknown key '{argv[-1].split('=')[0]}'. Did you mean: " in err and near in err.split("Did you mean:")[1]


def test_recipes_takes_no_keys(capsys):
    assert cli.main(["recipes", "name=demo"]) == 2
    assert "unknown key 'name': this command takes no keys" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["eval", "ckpt=a", "out=o", "batch_size=0"], ["batch_size", ">= 1"]),
    (["eval", "ckpt=a", "out=o", "format=csv"], ["format", "clip_benchmark"]),
    (["eval", "ckpt=a", "out=o", "verify=maybe"], ["verify", "true, false"]),
    (["eval", "out=o"], ["no model to evaluate", "ckpt=", "model=ARCH pretrained=TAG"]),
    (["eval", "ckpt=a", "pretrained=openai", "out=o"], ["ckpt= and pretrained= both name the weights"]),
    (["eval", "pretrained=openai", "out=o"], ["pretrained=openai needs model=ARCH"]),
    (["eval", "ckpt=hf-hub:org/name", "model=ViT-B-32", "out=o"], ["carries its own architecture", "drop model="]),
    (["patch", "base=a", "finetuned=b", "out=o", "max_drift=-1"], ["max_drift", ">= 0"]),
    (["patch", "base=a", "finetuned=b", "out=o", "towers=x"], ["towers", "v, t, vt"]),
    (["release", "out=o"], ["ckpt=...", "push=ORG/NAME"]),
    (["data", "world", "out=o", "size=huge"], ["size", "tiny, demo, full"]),
    (["data", "world", "out=o", "seed=x"], ["seed", "an integer"]),
])
def test_a_bad_value_exits_2_naming_the_key(capsys, argv, words):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert all(w in err for w in words), err


def test_without_help_a_bad_word_is_still_refused(capsys):
    assert train.main(["--bogus"]) == 2
    assert "not of the form key=value" in capsys.readouterr().err


def test_keys_parse_types_positional_words_and_refusals():
    """negft.commands.keys.parse: values of their field's type ("" is None where a key may be unset), bare words
    fill the required keys in order where a command takes them, and each misuse is named."""
    from dataclasses import dataclass
    from typing import Optional

    from negft.commands.keys import key, parse
    from negft.config import ConfigError

    @dataclass(kw_only=True)
    class Keys:
        src: str = key(doc="input")
        out: str = key(doc="output")
        n: int = key(3, "count")
        rate: Optional[float] = key(None, "rate")
        on: bool = key(True, "switch")

    got = parse(Keys, ["a", "out=b", "n=4", "rate=", "on=false"], positional=True)
    assert (got.src, got.out, got.n, got.rate, got.on) == ("a", "b", 4, None, False)
    assert parse(Keys, ["src=a", "out=b", "rate=0.5"]).rate == 0.5
    for words, positional, message in [(["a", "b", "c"], True, "too many positional arguments: c"),
                                       (["a", "src=b", "out=c"], True, "'src' given twice"),
                                       (["src=a"], False, "missing required key(s): out=..."),
                                       (["a", "out=b"], False, "not of the form key=value"),
                                       (["src=a", "out=b", "n=x"], False, "bad value 'x' for 'n': expected an integer")]:
        with pytest.raises(ConfigError) as e:
            parse(Keys, words, positional=positional)
        assert message in str(e.value)


def test_a_command_freezes_what_is_left_at_exit_once_and_help_does_not(monkeypatch, capsys):
    """Each command registers ``gc.freeze`` to run at exit (the interpreter's last full collection then skips the
    imports' objects), once however many commands the process runs; ``--help`` registers nothing."""
    import atexit
    import gc
    from negft.commands import keys
    registered = []
    monkeypatch.setattr(atexit, "register", registered.append)
    keys.skip_the_last_collection.cache_clear()
    try:
        assert train.main(["--help"]) == 0 and eval_command.main(["-h"]) == 0 and registered == []
        assert cli.main(["recipes"]) == 0 and train.main(["recipe=nope"]) == 2
        assert registered == [gc.freeze]
    finally:
        keys.skip_the_last_collection.cache_clear()
