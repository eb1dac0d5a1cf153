"""A run stopped mid-epoch (SIGKILL, SIGTERM, killed inside a checkpoint write, a failing write) resumes from its
last complete checkpoint and ends where it would have (README "When things go wrong")."""
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from negft.config import ConfigError, load_config
from negft.models import CONFIG_FILE, WEIGHTS_FILE
from negft.train.loop import checkpoint_state, latest_checkpoint, resume_point
from tests.conftest import REPO, Forked, run_here

# random init (no base to build), small batches: 2 epochs of 6 steps, a checkpoint every 2 steps; the cheapest probe
# (a resumed run's metrics are compared with the uninterrupted run's, which any probe shows)
RUN = ["recipe=demo", "data=world", "world.size=tiny", "eval.bootstrap=50", "train.workers=0", "epochs=2",
       "model.world_pretrained=", "train.steps_per_epoch=6", "train.checkpoint_every=2",
       "streams.negcap.batch_size=8", "streams.negmcq.batch_size=8", "eval.suite=zeroshot"]
def _train(out, cache, *extra, patch=None, **popen):
    return _launch([*RUN, f"out={out}", f"world.cache={cache}", *extra], patch, **popen)


def _launch(args, patch=None, **popen):
    """``python train.py ARGS`` in a process of its own (``Forked``), with ``patch`` (Python source: the fault) run
    in it first."""
    return Forked(args, fault=textwrap.dedent(patch or ""), **popen)


def _here(args, code=0) -> tuple[str, str]:
    """(stdout, stderr) of ``python train.py ARGS`` run in this process (``run_here``): the runs that need no
    process of their own (no signal, no fault that takes the process down), which must exit ``code``."""
    proc = run_here(["train.py", *args])
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc.stdout, proc.stderr


def _finish(proc, code=0) -> tuple[str, str]:
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == code, out[-2000:] + err[-3000:]
    return out, err


def _wait_for(proc, path: Path) -> None:
    deadline = time.time() + 600
    while not path.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.02)
    assert path.exists(), f"the run ended before {path} was written"


def _printed_command(err: str, after: str, resume: bool = True) -> list[str]:
    """The command the run said continues it (the line after ``after``), to run as printed."""
    command = shlex.split(err.split(after + "\n", 1)[1].splitlines()[0])
    assert command[:2] == ["python", "train.py"] and (command[-1] == "resume=latest") == resume, command
    return command


def _ledger(run) -> list[dict]:
    return [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def uninterrupted(cache, tmp_path_factory):
    """The run as it goes with no fault: what every resumed run must end as."""
    run = tmp_path_factory.mktemp("uninterrupted") / "run"
    _here([*RUN, f"out={run}", f"world.cache={cache}"])
    return run


def _ends_as_uninterrupted(run, full) -> None:
    """Each epoch evaluated once, no step checkpoint or staging directory left, and the uninterrupted run's final
    weights (to 1e-6: same data order, optimizer and scheduler state) and metrics."""
    ledger = _ledger(run)
    assert [entry["epoch"] for entry in ledger] == [0, 1, 2]
    left = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert left == ["epoch_1", "epoch_2"], f"step checkpoints outlive their epoch, or staging is left: {left}"
    a = load_file(str(full / "checkpoints" / "epoch_2" / WEIGHTS_FILE))
    b = load_file(str(run / "checkpoints" / "epoch_2" / WEIGHTS_FILE))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)
    for k, v in _ledger(full)[-1]["metrics"].items():
        assert ledger[-1]["metrics"][k] == pytest.approx(v, abs=1e-6), k


def test_sigkill_mid_epoch_then_resume_latest_matches_uninterrupted(uninterrupted, cache, tmp_path):
    killed = tmp_path / "killed"
    proc = _train(killed, cache)
    target = killed / "checkpoints" / "step_8"          # mid-epoch 2 (steps 7..12)
    _wait_for(proc, target)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not (killed / "checkpoints" / "epoch_2").exists()
    assert latest_checkpoint(killed) == target

    out, _ = _here([*RUN, f"out={killed}", f"world.cache={cache}", "resume=latest"])
    assert "resumed from" in out and "at step 8" in out
    _ends_as_uninterrupted(killed, uninterrupted)


def test_one_command_with_resume_auto_through_sigterm_and_sigusr1_ends_as_uninterrupted(uninterrupted, cache,
                                                                                        tmp_path):
    """What a requeued Slurm job does: the same command line (resume=auto) run three times. The first launch starts
    the run and gets SIGTERM, what a scheduler sends every process of the job before its SIGKILL (here: the run's
    process group, its loader worker too): it finishes the step, writes a checkpoint and exits 143 with that
    command to continue, and SIGTERM's handler is the default again. The second resumes and gets SIGUSR1 (Slurm's
    --signal, to the process group too): exit 138. The printed command, run a third time, ends as the
    uninterrupted run."""
    run = tmp_path / "run"
    args = [*RUN, f"out={run}", f"world.cache={cache}", "train.workers=1", "resume=auto"]
    first = _launch(args, start_new_session=True)
    _wait_for(first, run / "checkpoints" / "step_2")
    os.killpg(first.pid, signal.SIGTERM)
    out, err = _finish(first, 143)
    assert "Traceback" not in err
    ckpt = latest_checkpoint(run)
    state = checkpoint_state(ckpt)
    assert ckpt.name == f"step_{state['step']}" and state["step"] >= 2 and state["epoch_step"] < 6, ckpt
    assert f"negft: stopped by SIGTERM after step {state['step']}; its checkpoint is {ckpt}." in err
    assert [entry["epoch"] for entry in _ledger(run)] == [0]
    assert "SIGTERM handler after the run: default" in out
    assert err.split("Continue with:\n", 1)[1].splitlines()[0].strip() == shlex.join(["python", "train.py", *args])

    second = _launch(args, start_new_session=True)
    _wait_for(second, run / "checkpoints" / "step_8")           # mid-epoch 2
    os.killpg(second.pid, signal.SIGUSR1)
    out, err = _finish(second, 128 + signal.SIGUSR1)
    assert "Traceback" not in err
    assert f"resumed from {ckpt} at step {state['step']}" in out
    ckpt = latest_checkpoint(run)
    step = checkpoint_state(ckpt)["step"]
    assert f"negft: stopped by SIGUSR1 after step {step}; its checkpoint is {ckpt}." in err

    command = _printed_command(err, "Continue with:", resume=False)
    assert command[-1] == "resume=auto"
    resumed = run_here(["train.py", *command[2:]])
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    assert f"resumed from {ckpt} at step {step}" in resumed.stdout
    assert resumed.sigterm_handler is signal.SIG_DFL
    _ends_as_uninterrupted(run, uninterrupted)


def test_ctrl_c_stops_at_the_step_end_as_sigterm_does(cache, tmp_path):
    """Ctrl-C in a terminal: SIGINT to the run's process group, its loader worker too, which ignores it (no worker's
    traceback, no "DataLoader worker killed"). The run finishes its step, writes a checkpoint and exits 130 with the
    command that continues it, as SIGTERM does."""
    run = tmp_path / "run"
    args = [*RUN, f"out={run}", f"world.cache={cache}", "train.workers=1"]
    proc = _launch(args, start_new_session=True)
    _wait_for(proc, run / "checkpoints" / "step_2")
    os.killpg(proc.pid, signal.SIGINT)
    out, err = _finish(proc, 128 + signal.SIGINT)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    ckpt = latest_checkpoint(run)
    assert f"negft: stopped by SIGINT after step {checkpoint_state(ckpt)['step']}; its checkpoint is {ckpt}." in err
    assert _printed_command(err, "Continue with:") == ["python", "train.py", *args, "resume=latest"]


TINY_BASE = """
data: world
epochs: 1
model: {world_pretrained: ""}
streams:
  corpus: {task: contrastive, field: caption, world_split: pretrain, batch_size: 16}
loss: {name: clip}
train: {workers: 0, steps_per_epoch: 6, checkpoint_every: 2}
eval: {split: val, suite: zeroshot}
"""


def test_sigterm_while_the_world_base_trains_and_the_same_command_resumes_it(cache, tmp_path):
    """A world base model (``model.world_pretrained`` a recipe) is trained before the run's own directory exists:
    stopped there, the run says to repeat its command (no resume=, which would find no run in ``out``), and
    that command resumes the base's training from its checkpoint."""
    recipe = tmp_path / "tinybase.yaml"
    recipe.write_text(TINY_BASE)
    run = tmp_path / "run"
    args = ["recipe=demo", "data=world", "world.size=tiny", "eval.bootstrap=50", "train.workers=0", "epochs=1",
            f"model.world_pretrained={recipe}", "train.steps_per_epoch=2", "patch.sweep=false", f"out={run}",
            f"world.cache={cache}", "eval.suite=zeroshot", "streams.negcap.batch_size=16", "streams.negmcq.batch_size=16"]
    proc = _launch(args)
    deadline = time.time() + 600
    while not list(cache.glob("base/tinybase-*/run/checkpoints/step_2")) and proc.poll() is None \
            and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = _finish(proc, 143)
    [base_run] = cache.glob("base/tinybase-*/run")
    ckpt = latest_checkpoint(base_run)
    step = checkpoint_state(ckpt)["step"]
    assert f"after step {step}; its checkpoint is {ckpt}. Continue with:" in err and not run.exists()

    out, _ = _here(_printed_command(err, "Continue with:", resume=False)[2:])
    assert f"resumed from {ckpt} at step {step}" in out
    assert (base_run.parent / "model" / WEIGHTS_FILE).exists() and (run / "checkpoints" / "epoch_1").is_dir()


def test_sigkill_inside_a_checkpoint_write_resumes_from_the_one_before(uninterrupted, cache, tmp_path):
    """Killed after DeepSpeed wrote step_10's state and before its weights and config: the half-written staging
    directory is ignored, the run resumes from step_8, and the ledger holds each epoch once."""
    run = tmp_path / "run"
    proc = _train(run, cache, patch="""
        from negft import models
        write = models.write_local_dir
        def dying(model, out, *args, **kwargs):
            if Path(out).name == ".step_10.tmp":
                os.kill(os.getpid(), signal.SIGKILL)
            return write(model, out, *args, **kwargs)
        models.write_local_dir = dying
    """)
    _finish(proc, -signal.SIGKILL)
    staged = run / "checkpoints" / ".step_10.tmp"
    assert (staged / "state").is_dir() and not (staged / CONFIG_FILE).exists()
    assert latest_checkpoint(run) == run / "checkpoints" / "step_8"
    assert [entry["epoch"] for entry in _ledger(run)] == [0, 1]

    out, _ = _here([*RUN, f"out={run}", f"world.cache={cache}", "resume=latest"])
    assert "at step 8" in out
    _ends_as_uninterrupted(run, uninterrupted)


FULL_DISK_AFTER_STEP_2 = """
    import resource
    from negft.train import loop
    save = loop.save_checkpoint
    def then_full(*args, **kwargs):     # from here on no file may grow past 4 MiB, as on a full disk
        path = save(*args, **kwargs)
        if path.name == "step_2":
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            resource.setrlimit(resource.RLIMIT_FSIZE, (4 << 20, resource.RLIM_INFINITY))
        return path
    loop.save_checkpoint = then_full
"""
def ledger_fsync_enospc(monkeypatch) -> None:
    """The disk fills while the second ledger line is written (a fault that leaves the process standing, so the
    run runs in this one)."""
    import errno
    fsync, ledger_writes = os.fsync, [0]

    def failing(fd):
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(".ledger.jsonl"):
            ledger_writes[0] += 1
            if ledger_writes[0] == 2:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fsync(fd)
    monkeypatch.setattr(os, "fsync", failing)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the ledger's file by /proc/self/fd")
@pytest.mark.parametrize("fault, failed, kept", [
    (FULL_DISK_AFTER_STEP_2, "cannot write checkpoint '{run}/checkpoints/step_4'", "step_2"),
    (ledger_fsync_enospc, "cannot write '{run}/ledger.jsonl': [Errno 28] No space left on device", "epoch_1"),
], ids=["checkpoint", "ledger"])
def test_a_failing_write_stops_the_run_naming_the_path_and_keeps_what_was_written(
        fault, failed, kept, uninterrupted, cache, tmp_path, monkeypatch):
    """A checkpoint that cannot be written whole (files capped at 4 MiB: torch.save fails inside DeepSpeed), or
    a ledger line whose fsync reports a full disk: exit 1 with the path, the error, the last complete checkpoint
    and the command to continue; the complete checkpoints, the ledger and report.md are as they were, and no
    staging file is left. Once the fault is gone, resume=latest ends as the uninterrupted run. The file-size
    limit is the process's: that run has a process of its own."""
    run = tmp_path / "run"
    if callable(fault):
        with monkeypatch.context() as faulty:
            fault(faulty)
            _, err = _here([*RUN, f"out={run}", f"world.cache={cache}"], code=1)
    else:
        _, err = _finish(_train(run, cache, patch=fault), 1)
    assert "Traceback" not in err
    assert f"negft: error: {failed.format(run=run)}" in err
    assert f"The last complete checkpoint is {run / 'checkpoints' / kept}" in err
    assert latest_checkpoint(run) == run / "checkpoints" / kept
    load_file(str(run / "checkpoints" / kept / WEIGHTS_FILE))
    assert [entry["epoch"] for entry in _ledger(run)] == [0]
    report = (run / "report.md").read_text()
    assert "epoch 0" in report and "epoch 1" not in report
    hidden = [p for p in run.rglob(".*") if p.name.endswith(".tmp") or ".tmp." in p.name]
    assert not hidden, hidden

    step = checkpoint_state(run / "checkpoints" / kept)["step"]
    out, _ = _here(_printed_command(err, "continue with:")[2:])
    assert f"resumed from {run / 'checkpoints' / kept} at step {step}" in out
    _ends_as_uninterrupted(run, uninterrupted)


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ranks(args, n=2) -> list[Forked]:
    """``n`` ranks of train.py started as a per-machine agent (torchrun, a cluster's) starts them: RANK,
    WORLD_SIZE and MASTER_* in their environment. Not the DeepSpeed launcher, which ends every rank itself as
    soon as one fails, so that the others' own way out is what is tested."""
    port = str(_free_port())
    return [Forked(args, env={"RANK": str(r), "LOCAL_RANK": str(r), "WORLD_SIZE": str(n), "LOCAL_SIZE": str(n),
                              "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
            for r in range(n)]


def _deepspeed(command: list[str]) -> subprocess.Popen:
    """A printed ``deepspeed --num_gpus N train.py ...`` command, run by the DeepSpeed launcher on a free port."""
    assert command[:2] == ["deepspeed", "--num_gpus"], command
    launcher = Path(sys.executable).with_name("deepspeed")
    return subprocess.Popen([str(launcher), "--master_port", str(_free_port()), *command[1:]], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lose_rank_1(run, cache, fault) -> str:
    """Two ranks with train.dist_timeout_s=20; rank 1 gets ``fault`` once step_2 is written. Rank 0 must leave
    by itself: well before DeepSpeed's 600 s, it exits 1 with a negft message. Returns its stderr."""
    ranks = _ranks([*RUN, f"out={run}", f"world.cache={cache}", "train.dist_timeout_s=20"])
    try:
        _wait_for(ranks[0], run / "checkpoints" / "step_2")
        ranks[1].send_signal(fault)
        _, err = ranks[0].communicate(timeout=300)
    finally:
        for proc in ranks:
            proc.kill()
            proc.communicate()
    assert ranks[0].returncode == 1, err[-3000:]
    assert "negft: error: rank 0 lost the other ranks in a collective" in err and "train.dist_timeout_s=20" in err
    assert f"The last complete checkpoint is {run / 'checkpoints' / 'step_2'}" in err
    assert latest_checkpoint(run) == run / "checkpoints" / "step_2"
    return err


def test_a_killed_rank_stops_the_other_with_a_message(cache, tmp_path):
    """Rank 1 killed (its sockets close): rank 0's next collective fails, and it says so."""
    _lose_rank_1(tmp_path / "run", cache, signal.SIGKILL)


def test_sigterm_to_one_rank_stops_both_at_the_same_step(cache, tmp_path):
    """Ranks may get SIGTERM at different times (here only rank 1 gets it): they agree at each step's end, stop
    after the same step, write one checkpoint together and exit 143; rank 0 prints the launcher command."""
    run = tmp_path / "run"
    ranks = _ranks([*RUN, f"out={run}", f"world.cache={cache}"])
    try:
        _wait_for(ranks[0], run / "checkpoints" / "step_2")
        ranks[1].send_signal(signal.SIGTERM)
        errs = [proc.communicate(timeout=300)[1] for proc in ranks]
    finally:
        for proc in ranks:
            proc.kill()
            proc.communicate()
    assert [proc.returncode for proc in ranks] == [143, 143], errs[0][-2000:] + errs[1][-2000:]
    ckpt = latest_checkpoint(run)
    state = checkpoint_state(ckpt)
    assert ckpt.name == f"step_{state['step']}" and state["world_size"] == 2
    assert f"negft: stopped by SIGTERM after step {state['step']}; its checkpoint is {ckpt}." in errs[0]
    assert "Continue with:\n  deepspeed --num_gpus 2 train.py " in errs[0] and "stopped by SIGTERM" not in errs[1]


@pytest.mark.slow
def test_a_hung_rank_stops_the_other_after_the_timeout_and_two_ranks_resume(cache, tmp_path):
    """Rank 1 stopped (SIGSTOP: a hung rank, or a dead machine whose sockets never close): rank 0 waits
    train.dist_timeout_s in its collective, then exits 1 naming the last checkpoint and the command; run as
    printed (the DeepSpeed launcher, two ranks), it resumes from step_2 and ends with the weights of an
    uninterrupted two-rank run."""
    full, run = tmp_path / "full", tmp_path / "run"
    ranks = _ranks([*RUN, f"out={full}", f"world.cache={cache}"])
    for proc in ranks:
        _finish(proc)
    err = _lose_rank_1(run, cache, signal.SIGSTOP)
    assert "Timed out" in err

    command = shlex.split(err.split("continue with:\n", 1)[1].splitlines()[0])
    assert command[-1] == "resume=latest"
    out, _ = _finish(_deepspeed(command))
    assert f"resumed from {run / 'checkpoints' / 'step_2'} at step 2" in out and "2 rank(s)" in out
    _ends_as_uninterrupted(run, full)


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


def test_a_directory_that_cannot_be_renamed_into_place_leaves_the_old_one(tmp_path, monkeypatch):
    """move_into_place over an existing directory renames the old one aside first; if the new one then cannot be
    renamed (a read-only file system), the old one goes back and the error is raised."""
    import errno
    from negft import io
    old, new = tmp_path / "epoch_1", tmp_path / ".epoch_1.tmp"
    for d, text in ((old, "old"), (new, "new")):
        d.mkdir()
        (d / "f").write_text(text)
    replace = os.replace

    def read_only(src, dst):
        if Path(src) == new:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dst))
        return replace(src, dst)
    monkeypatch.setattr(io.os, "replace", read_only)
    with pytest.raises(OSError, match="Read-only"):
        io.move_into_place(new, old)
    assert (old / "f").read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == [".epoch_1.tmp",
                                                                                               "epoch_1"]
