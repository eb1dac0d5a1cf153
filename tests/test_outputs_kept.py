"""Nothing a command wrote is lost (README "A run directory"): an ``out=`` holding an evaluation, a sweep, a release or
a run is refused (exit 2, one line naming ``overwrite=true`` and the way on) and left as it was; a run's ``out`` is
locked while it trains; ``overwrite=true`` replaces. Also the smoke run (``smoke=true``) and the mode of the files a
checkpoint holds."""
import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from negft import models
from negft.config import load_config, to_yaml

from tests.conftest import REPO, run_here


def _tree(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``root``."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _one_line(proc, code=2) -> str:
    """The command's message: exit ``code``, one line on stderr, no traceback."""
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("negft: error: "), proc.stderr
    return lines[0]


def test_eval_into_an_out_holding_results_is_refused_before_any_work(tmp_path):
    """An earlier evaluation's results.json stays byte for byte; the message names overwrite=true and a new out=.
    The checkpoint is not even looked at (it does not exist)."""
    out = tmp_path / "eval"
    (out / "examples").mkdir(parents=True)
    (out / "results.json").write_text('{"metrics": {"a/b/c": 1.0}}\n')
    before = _tree(out)
    line = _one_line(run_here(["eval.py", f"ckpt={tmp_path / 'absent'}", f"out={out}"]))
    assert line == (f"negft: error: out '{out}' already holds the results of an evaluation (results.json, examples): "
                    "choose a new out=, or pass overwrite=true to replace it")
    assert _tree(out) == before


def test_patch_into_an_out_holding_a_sweep_is_refused_before_any_work(tmp_path):
    out = tmp_path / "patch"
    out.mkdir()
    (out / "selected.json").write_text("{}\n")
    line = _one_line(run_here(["-m", "negft", "patch", f"base={tmp_path / 'a'}", f"finetuned={tmp_path / 'b'}",
                               f"out={out}"]))
    assert "already holds a patching sweep (selected.json)" in line and "overwrite=true" in line
    assert (out / "selected.json").read_text() == "{}\n"


def test_release_names_overwrite_and_replaces_only_a_release(bundle, tmp_path):
    """A release into an existing out is refused naming overwrite=true; with it, a release is replaced whole and a
    folder that is not a release is still refused."""
    ckpt, rel, other = tmp_path / "ckpt", tmp_path / "release", tmp_path / "other"
    models.save(bundle.model, ckpt, bundle.model_cfg, bundle.preprocess_cfg, extra={"arch": "negft-tiny"})
    assert run_here(["-m", "negft", "release", f"ckpt={ckpt}", f"out={rel}"]).returncode == 0
    (rel / "note.txt").write_text("mine")
    line = _one_line(run_here(["-m", "negft", "release", f"ckpt={ckpt}", f"out={rel}"]))
    assert "a release is never overwritten silently" in line and "overwrite=true" in line
    assert (rel / "note.txt").exists()
    assert run_here(["-m", "negft", "release", f"ckpt={ckpt}", f"out={rel}", "overwrite=true"]).returncode == 0
    assert not (rel / "note.txt").exists() and (rel / "SHA256SUMS").is_file()
    other.mkdir()
    (other / "thesis.tex").write_text("x")
    line = _one_line(run_here(["-m", "negft", "release", f"ckpt={ckpt}", f"out={other}", "overwrite=true"]))
    assert "is not a release" in line and (other / "thesis.tex").read_text() == "x"


def _a_run_in(out: Path) -> dict[str, str]:
    out.mkdir(parents=True)
    (out / "config.yaml").write_text(to_yaml(load_config(["recipe=negcap", "data=world", f"out={out}"])))
    (out / "ledger.jsonl").write_text('{"epoch": 0}\n')
    return _tree(out)


def test_a_new_run_into_an_out_holding_one_is_refused_naming_both_commands(tmp_path):
    """Without resume=, the same command again is refused, not restarted over the old run: the one line names the
    command that continues it and the one that replaces it."""
    out = tmp_path / "run"
    before = _a_run_in(out)
    args = ["recipe=negcap", "data=world", f"out={out}", "epochs=3"]
    line = _one_line(run_here(["train.py", *args]))
    assert line == (f"negft: error: out '{out}' already holds a run (config.yaml, ledger.jsonl) and is never "
                    f"overwritten silently; continue that run with `python train.py {' '.join(args)} resume=latest`, "
                    f"or replace it with `python train.py {' '.join(args)} overwrite=true`")
    assert _tree(out) == before
    # overwrite=true with resume=, or over files no run writes: refused too
    line = _one_line(run_here(["train.py", *args, "overwrite=true", "resume=latest"]))
    assert "pass one of them" in line
    (out / "thesis.tex").write_text("x")
    line = _one_line(run_here(["train.py", *args, "overwrite=true"]))
    assert "holds files no run writes (thesis.tex)" in line


HOLD = """
import sys, time
from negft.outdir import hold_run_dir
with hold_run_dir(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def test_a_second_run_into_a_held_out_is_refused_naming_the_holder(tmp_path):
    """Another process holds out's lock (a run training there): a run into it is refused with the holder's pid and
    host, resume= or not; once the holder is gone the lock goes with it."""
    out = tmp_path / "run"
    _a_run_in(out)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], cwd=REPO, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        for extra in ([], ["resume=latest"]):
            line = _one_line(run_here(["train.py", "recipe=negcap", "data=world", f"out={out}", *extra]))
            assert line.startswith(f"negft: error: out '{out}' is in use by another training run: pid {holder.pid} "
                                   f"on {socket.gethostname()} since "), line
            assert line.endswith("Wait for it to end, or choose another out=")
    finally:
        holder.kill()
        holder.wait()
    from negft.outdir import hold_run_dir
    with hold_run_dir(out):         # the kernel dropped the dead holder's lock
        pass


def test_a_refused_run_leaves_no_folder_behind(tmp_path):
    """The lock is taken on a folder made for it: a run refused after it (no run to resume) leaves nothing."""
    out = tmp_path / "new"
    line = _one_line(run_here(["train.py", "recipe=demo", f"out={out}", "resume=latest"]))
    assert "holds no run to resume" in line and not out.exists()


def test_checkpoint_files_follow_the_umask(bundle, tmp_path):
    """safetensors writes 0600; a checkpoint's weights are written as the process's umask says, as its other files
    are: 0644 under 022, 0640 under 027."""
    for mask, mode in ((0o022, 0o644), (0o027, 0o640)):
        old = os.umask(mask)
        try:
            out = models.save(bundle.model, tmp_path / f"ckpt-{mask:o}", bundle.model_cfg, bundle.preprocess_cfg)
        finally:
            os.umask(old)
        assert {p.name: p.stat().st_mode & 0o777 for p in out.iterdir()} == {
            models.WEIGHTS_FILE: mode, models.CONFIG_FILE: mode}


# the recipes a smoke run is tested on (a few seconds each): demo (contrastive + mcq streams, negft's terms) and
# negclip (an itm stream: hard images and captions); every recipe was run with smoke=true by hand, 8 to 19
# CPU-seconds each (README "Commands")
SMOKE_RECIPES = ("demo", "negclip")


@pytest.mark.parametrize("recipe", SMOKE_RECIPES)
def test_smoke_trains_two_steps_without_evaluating(recipe, cache, world_pretrain, tmp_path):
    """smoke=true: two steps at small batches, the ledger's lines with no metrics, no sweep, a loadable checkpoint
    whose files are 0644 (the process's umask: 022 here). The same command again is refused; with overwrite=true it
    replaces the run."""
    out = tmp_path / "run"
    args = ["train.py", f"recipe={recipe}", "data=world", "world.size=tiny", f"world.cache={cache}", world_pretrain,
            "smoke=true", f"out={out}"]
    old = os.umask(0o022)
    try:
        proc = run_here(args)
    finally:
        os.umask(old)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    assert [(e["epoch"], e["step"], e["metrics"]) for e in ledger] == [(0, 0, {}), (1, 2, {})]
    assert not (out / "patch").exists() and not (out / "release").exists()
    ckpt = out / "checkpoints" / "epoch_1"
    assert {p.stat().st_mode & 0o777 for p in ckpt.rglob("*") if p.is_file()} == {0o644}
    if recipe != "demo":
        return
    assert "overwrite=true" in _one_line(run_here(args))
    with open(out / "ledger.jsonl", "a") as f:      # what the old run left: gone once it is replaced
        f.write('{"epoch": 9}\n')
    (out / "checkpoints" / "epoch_9").mkdir()
    proc = run_here([*args, "overwrite=true"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert [json.loads(line)["epoch"] for line in (out / "ledger.jsonl").read_text().splitlines()] == [0, 1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["epoch_1"]
