"""Two jobs, one cache: jobs started together on a cold cache build the world once and train the base once; a
lock whose holder died is taken over at once."""
import contextlib
import io
import signal
import subprocess
import sys
import time

from negft.cache_lock import cache_lock
from tests.conftest import REPO, Forked

HOLD = """
import sys, time
sys.path.insert(0, {repo!r})
from negft.cache_lock import cache_lock
with cache_lock({entry!r}, "the test entry"):
    print("held", flush=True)
    time.sleep(float(sys.argv[1]))
"""


def _holder(entry, seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", HOLD.format(repo=str(REPO), entry=str(entry)), str(seconds)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_waiting_job_names_the_holder_then_takes_the_lock(tmp_path):
    holder = _holder(tmp_path / "entry", 2.0)
    printed = io.StringIO()
    t0 = time.monotonic()
    with contextlib.redirect_stdout(printed), cache_lock(tmp_path / "entry", "the test entry", poll_s=0.2):
        waited = time.monotonic() - t0           # we hold it only once the holder has let go, 2 s in
    holder.wait()
    out = printed.getvalue()
    assert f"waiting for the test entry: pid {holder.pid} on " in out and "(-c 2.0) is building it" in out, out
    assert waited > 1.0 and not (tmp_path / ".entry.owner.json").exists()


def test_a_killed_holders_lock_does_not_block(tmp_path):
    holder = _holder(tmp_path / "entry", 600)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert (tmp_path / ".entry.owner.json").exists()          # it died without cleaning up
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), cache_lock(tmp_path / "entry", "the test entry", poll_s=0.2):
        pass
    assert printed.getvalue() == ""                            # taken at once: the kernel dropped the dead lock


def test_two_runs_started_together_on_a_cold_cache_build_the_world_and_train_the_base_once(tmp_path,
                                                                                            world_pretrain):
    cache = tmp_path / "cache"
    args = ["recipe=demo", "data=world", "world.size=tiny", f"world.cache={cache}", world_pretrain, "epochs=1",
            "train.steps_per_epoch=1", "train.workers=0", "eval.suite=zeroshot", "eval.bootstrap=10",
            "patch.sweep=false", "streams.negcap.batch_size=16", "streams.negmcq.batch_size=16"]
    procs = [Forked([*args, f"out={tmp_path / run}"]) for run in ("a", "b")]        # two processes at once
    outs = ["".join(p.communicate(timeout=600)) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs[0][-2000:] + outs[1][-2000:]
    both = "".join(outs)
    assert both.count("base model not cached: training") == 1, both[-4000:]
    assert both.count("base model cached:") == 1
    assert sum("world tiny seed=0:" in o for o in outs) == 1                # one world build's progress bar
    assert sum("world tiny seed=0 (pretrain):" in o for o in outs) == 1     # and one of its pretraining split
    [base] = [p for p in (cache / "base").iterdir() if p.is_dir()]
    assert len(list((base / "run" / "checkpoints").iterdir())) == 1      # one training run, one epoch
    for run in ("a", "b"):
        assert (tmp_path / run / "checkpoints" / "epoch_1").is_dir()
