"""Each converter's keys (``negft.commands.convert_keys``) are its function's parameters, in order, with the same
defaults; ``negft data convert X --help`` lists them, and a bad value is refused by its type before anything is
read. And no ``--help`` of a command imports torch (it answers at once)."""
import dataclasses
import inspect
import json
import subprocess
import sys

import pytest

from negft.commands import cli, data
from negft.commands.convert_keys import CONVERTERS
from negft.commands.keys import required
from negft.fields import doc

from conftest import REPO


@pytest.mark.parametrize("name", list(CONVERTERS))
def test_a_converters_keys_are_its_parameters_with_their_defaults(name):
    params = list(inspect.signature(data._converter(name)).parameters.values())
    fields = dataclasses.fields(data.converter_keys(name))
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields):
        assert doc(f), f.name
        if p.default is inspect.Parameter.empty:
            assert required(f), f.name
        elif f.default is None:                 # an empty string there: the function's own choice
            assert p.default == "", f.name
        else:                                   # the function's string default, read as the key's type
            assert str(p.default).lower() == str(f.default).lower() or float(p.default) == f.default, f.name


def test_convert_help_lists_the_converters_keys(capsys):
    assert cli.main(["data", "convert", "coco", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: negft data convert coco CAPTIONS INSTANCES IMAGES OUT")
    for line in ("  captions=...", "  maxcount=1000", "  progress=true"):
        assert line in out
    assert cli.main(["data", "negatives", "-h"]) == 0
    assert "one of negclip, fscclip, ceclip" in capsys.readouterr().out


def test_a_bad_value_is_refused_by_its_type_before_anything_is_read(tmp_path, capsys):
    assert cli.main(["data", "convert", "coco", "c.json", "i.json", "img", f"out={tmp_path}/o", "maxcount=x"]) == 2
    assert "bad value 'x' for 'maxcount': expected an integer" in capsys.readouterr().err
    assert cli.main(["data", "negatives", "bogus", "s", f"out={tmp_path}/o"]) == 2
    assert "negclip" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_converter_gets_the_keys_typed_and_only_those_given(monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(data, "_converter", lambda name: lambda **kw: seen.update(kw) or {"out": kw["out"]})
    assert cli.main(["data", "convert", "coco", "c.json", "", "img", "out=o", "progress=false"]) == 0
    assert seen == {"captions": "c.json", "instances": "", "images": "img", "out": "o", "progress": False}
    assert json.loads(capsys.readouterr().out) == {"out": "o"}


HELPS = [["train"], ["eval"], ["patch"], ["release"], ["data"], ["table"], ["compare"], ["recipes"],
         ["data", "world"], ["data", "check"], *[["data", *name.split()] for name in CONVERTERS], []]


@pytest.mark.parametrize("words", HELPS, ids=lambda w: " ".join(w) or "negft")
def test_help_imports_no_torch(words):
    """Run in a fresh interpreter: whether torch was imported on the way to the help text."""
    code = ("import sys, contextlib, io\nfrom negft.commands.cli import main\n"
            f"with contextlib.redirect_stdout(io.StringIO()) as out:\n    rc = main({words + ['--help']!r})\n"
            "print(rc, 'torch' in sys.modules, 'open_clip' in sys.modules, len(out.getvalue()) > 100)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                         env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert run.stdout.split() == ["0", "False", "False", "True"], run.stderr


def test_negfts_usage_is_read_off_the_commands_keys():
    text = cli.usage()
    assert "negft patch base=... finetuned=... out=... [alphas=0:1:0.1] [towers=v,t,vt]" in text
    assert "negft eval [ckpt=...] out=..." in text and "negft compare A B [out=...]" in text
    assert "max_drift" not in text          # declared once, in negft.config.PatchCfg; --help shows it


def test_help_reads_the_suites_the_probes_declare():
    from negft import probes
    from negft.commands.keys import probe_suites
    assert probe_suites() == (probes.SUITES, probes.DEFAULT_SUITE)


def test_the_loss_keys_help_shows_are_the_registrys():
    """train.py --help reads the loss keys from a snapshot (their settings live beside the losses, which import
    torch); a term added, removed or re-documented without `python -m negft.commands.train --loss-keys` fails here."""
    from negft.commands import train
    assert train.loss_keys() == train.live_loss_keys(), "run: python -m negft.commands.train --loss-keys"
    text = train.help_()
    assert "loss.mcq.similarity=cosine" in text and "loss.*" in text and "negft/losses/registry.py LossCfg" in text
