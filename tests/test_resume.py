"""A run killed mid-epoch resumes from its last complete checkpoint and ends where it would have."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from negft.config import ConfigError, load_config
from negft.models import CONFIG_FILE
from negft.train.loop import latest_checkpoint, resume_point
from tests.conftest import REPO

# random init (no base to build), small batches: 2 epochs of 6 steps, a checkpoint every 2 steps
RUN = ["recipe=demo", "data=world", "world.size=tiny", "eval.bootstrap=50", "train.workers=0", "epochs=2",
       "model.world_pretrained=", "train.steps_per_epoch=6", "train.checkpoint_every=2",
       "streams.negcap.batch_size=16", "streams.negmcq.batch_size=16"]


def _train(out, cache, *extra):
    return subprocess.Popen([sys.executable, "train.py", *RUN, f"out={out}", f"world.cache={cache}", *extra],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _weights(run):
    return load_file(str(run / "checkpoints" / "epoch_2" / "open_clip_model.safetensors"))


def test_sigkill_mid_epoch_then_resume_latest_matches_uninterrupted(cache, tmp_path):
    full, killed = tmp_path / "full", tmp_path / "killed"
    proc = _train(full, cache)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]

    proc = _train(killed, cache)
    target = killed / "checkpoints" / "step_8"          # mid-epoch 2 (steps 7..12)
    deadline = time.time() + 600
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "checkpoints" / "epoch_2").exists()
    assert latest_checkpoint(killed) == target

    proc = _train(killed, cache, "resume=latest")
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]
    assert "resumed from" in out and "at step 8" in out
    ledger = [json.loads(line) for line in (killed / "ledger.jsonl").read_text().splitlines()]
    assert [entry["epoch"] for entry in ledger] == [0, 1, 2]
    assert not list((killed / "checkpoints").glob("step_*")), "step checkpoints outlive their epoch"

    a, b = _weights(full), _weights(killed)
    assert a.keys() == b.keys()
    for k in a:   # stated tolerance: equal to 1e-6 (same data order, optimizer and scheduler state)
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    full_last = [json.loads(line) for line in (full / "ledger.jsonl").read_text().splitlines()][-1]
    for k, v in full_last["metrics"].items():
        assert ledger[-1]["metrics"][k] == pytest.approx(v, abs=1e-6), k


def test_resume_on_another_rank_count_is_refused_with_the_way_out(tmp_path):
    ckpt = tmp_path / "run" / "checkpoints" / "step_4"
    (ckpt / "state").mkdir(parents=True)
    (ckpt / CONFIG_FILE).write_text(json.dumps({"model_cfg": {}, "negft": {
        "epoch": 1, "epoch_step": 4, "step": 4, "steps_per_epoch": 6, "world_size": 2}}))
    cfg = load_config(["recipe=demo", "data=world", f"out={tmp_path / 'run'}", "resume=latest"])
    with pytest.raises(ConfigError, match=r"2 rank\(s\), this run has 1.*local-dir:"):
        resume_point(cfg, tmp_path / "run", world_size=1)
    # a half-written checkpoint (still .NAME.tmp) is never the latest
    (tmp_path / "run" / "checkpoints" / ".step_6.tmp" / "state").mkdir(parents=True)
    assert latest_checkpoint(tmp_path / "run") == ckpt
