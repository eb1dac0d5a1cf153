"""Every failure a message (README "When things go wrong"): a truncated checkpoint, an ``out=`` that cannot be written,
a patching sweep that could not choose, a closed pipe: each ends with its exit code and one line, no traceback, before
any work. (Ctrl-C: tests/test_resume.py, ``test_ctrl_c_stops_at_the_step_end_as_sigterm_does``.)"""
import errno
import io
import os
import sys

import pytest
import torch

from negft import models, outdir

from tests.conftest import run_here


def _one_line(proc, code=2) -> str:
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("negft: error: "), proc.stderr
    return lines[0]


def _cut(path, to=0.5):
    """``path`` cut to a fraction of its bytes, as a copy interrupted or a full disk leaves it."""
    data = path.read_bytes()
    path.write_bytes(data[:int(len(data) * to)])


@pytest.fixture(scope="module")
def checkpoints(bundle, tmp_path_factory):
    """(a whole checkpoint directory, one whose weights are cut short, a cut .safetensors file, a cut .pt file)."""
    root = tmp_path_factory.mktemp("ckpts")
    whole = models.save(bundle.model, root / "whole", bundle.model_cfg, bundle.preprocess_cfg,
                        extra={"arch": "negft-tiny"})
    cut = models.save(bundle.model, root / "cut", bundle.model_cfg, bundle.preprocess_cfg, extra={"arch": "negft-tiny"})
    _cut(cut / models.WEIGHTS_FILE)
    st = root / "weights.safetensors"
    st.write_bytes((whole / models.WEIGHTS_FILE).read_bytes())
    _cut(st)
    pt = root / "weights.pt"
    torch.save(bundle.model.state_dict(), pt)
    _cut(pt)
    return whole, cut, st, pt


def test_eval_of_a_truncated_checkpoint_names_it(checkpoints, tmp_path):
    _, cut, st, pt = checkpoints
    for args, named, why in (
            ([f"ckpt={cut}"], cut / models.WEIGHTS_FILE, "incomplete metadata, file not fully covered"),
            ([f"ckpt={st}", "model=negft-tiny"], st, "incomplete metadata, file not fully covered"),
            ([f"ckpt={pt}", "model=negft-tiny"], pt, "failed finding central directory")):
        line = _one_line(run_here(["eval.py", *args, "data=world", f"out={tmp_path / 'eval'}"]))
        assert line.startswith(f"negft: error: '{named}' is truncated or corrupt, not a whole weights file ("), line
        assert why in line and line.endswith("copy or write it again, or pass another checkpoint")
        assert not (tmp_path / "eval").exists()


def test_patch_of_a_truncated_checkpoint_names_it(checkpoints, tmp_path):
    whole, cut, _, _ = checkpoints
    line = _one_line(run_here(["-m", "negft", "patch", f"base={whole}", f"finetuned={cut}",
                               f"out={tmp_path / 'patch'}"]))
    assert f"'{cut / models.WEIGHTS_FILE}' is truncated or corrupt" in line
    assert not (tmp_path / "patch").exists()


def test_training_from_a_truncated_world_base_names_it(checkpoints, cache, tmp_path):
    """model.world_pretrained= a cut weights file: exit 2 naming it, and the run's out is not left behind."""
    _, _, st, _ = checkpoints
    out = tmp_path / "run"
    line = _one_line(run_here(["train.py", "recipe=demo", "data=world", "world.size=tiny", f"world.cache={cache}",
                               f"model.world_pretrained={st}", "smoke=true", f"out={out}"]))
    assert f"'{st}' is truncated or corrupt" in line
    assert not out.exists()


def test_an_out_under_a_file_is_refused_before_any_work(tmp_path):
    """eval, patch and train: the model is not loaded (it does not exist), nothing is written."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = afile / "sub"
    want = f"negft: error: out '{out}' cannot be written ('{afile}' is a file, not a folder); choose another out="
    for args in (["eval.py", f"ckpt={tmp_path / 'absent'}"],
                 ["-m", "negft", "patch", f"base={tmp_path / 'a'}", f"finetuned={tmp_path / 'b'}"],
                 ["train.py", "recipe=demo"]):
        assert _one_line(run_here([*args, f"out={out}"])) == want
    assert afile.read_text() == "x"


def test_an_out_on_a_read_only_file_system_is_refused_before_any_work(tmp_path, monkeypatch):
    """The first write under out fails with EROFS (a read-only mount, which the tests cannot make): said at once."""
    real_open = os.open

    def read_only(path, flags, *a):
        if str(path).startswith(str(tmp_path)) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *a)
    monkeypatch.setattr(outdir.os, "open", read_only)
    out = tmp_path / "ro" / "eval"
    line = _one_line(run_here(["eval.py", f"ckpt={tmp_path / 'absent'}", f"out={out}"]))
    assert line == (f"negft: error: out '{out}' cannot be written ('{tmp_path}': a read-only file system); "
                    "choose another out=")


def test_a_sweep_that_could_not_choose_is_refused_before_training(tmp_path):
    """recipe=demo sweeps after training, choosing by its patch.targets: with eval.suite=none no metric could match."""
    out = tmp_path / "run"
    line = _one_line(run_here(["train.py", "recipe=demo", "eval.suite=none", f"out={out}"]))
    assert line == ("negft: error: patch.sweep=true: no metric of suite=none matches the targets mcq_neg/*/acc, "
                    "mcq_neg/*/acc_negation, retrieval_neg/*/r5 (its probes: none), so no α could be chosen. Pass patch.sweep=false (smoke=true turns it off too), or "
                    "an eval.suite that measures patch.targets")
    assert not out.exists()
    line = _one_line(run_here(["-m", "negft", "patch", f"base={tmp_path / 'a'}", f"finetuned={tmp_path / 'b'}",
                               "suite=zeroshot", f"out={tmp_path / 'patch'}"]))
    assert "no metric of suite=zeroshot matches the targets mcq_neg/*/acc (its probes: zeroshot)" in line


class _ClosedPipe(io.StringIO):
    """A stdout whose reader has gone (``... --help | head`` once head has its lines)."""

    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))

    def fileno(self):
        raise io.UnsupportedOperation("no file descriptor")


@pytest.mark.parametrize("entry", ["train", "eval", "negft"])
def test_help_into_a_closed_pipe_exits_141_without_a_traceback(entry, monkeypatch, capsys):
    from negft.commands import cli, eval as eval_command, train as train_command
    main = {"train": train_command.main, "eval": eval_command.main, "negft": lambda a: cli.main(["patch", *a])}[entry]
    monkeypatch.setattr(sys, "stdout", _ClosedPipe())
    assert main(["--help"]) == 141
    assert capsys.readouterr().err == ""
