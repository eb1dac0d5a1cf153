"""Where a run's scalars go: W&B (log.wandb) gets TensorBoard's scalars, the ledger lines, the figures and the
recipe; a TensorBoard write that fails stops the run with negft's message."""
import errno
import json
import os
import struct
import sys
import threading
from pathlib import Path

import pytest

from tests.conftest import run_here
from tests.test_train import QUICK

# random init, one epoch of two steps, a scalar line every step; two probes, one of them with a figure; no
# patching sweep after training
RUN = ["recipe=demo", *QUICK, "model.world_pretrained=", "epochs=1", "train.steps_per_epoch=2", "train.log_every=1",
       "streams.negcap.batch_size=8", "streams.negmcq.batch_size=8", "eval.suite=mcq_neg,geometry", "patch.sweep=false"]


def _train(args, code=0, env=None):
    proc = run_here(["train.py", *RUN, *args], env=env)
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def tensorboard_scalars(run: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    events = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def wandb_records(path: Path):
    """The records of a run's ``.wandb`` file: the LevelDB log format (32 KiB blocks of chunks, each with a
    7-byte header: CRC, length, type) after a 7-byte file header, each record a protobuf ``Record``. wandb's
    Python package no longer ships a reader (its Go core writes the file)."""
    from wandb.proto import wandb_internal_pb2
    data, block, head = path.read_bytes(), 32768, 7
    assert data[:4] == b":W&B", data[:7]
    pos, chunks = head, b""
    while pos + head <= len(data):
        if block - pos % block < head:          # too little room left in the block for a header: padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + head])
        chunks += data[pos + head:pos + head + length]
        pos += head + length
        if kind in (1, 4):                      # FULL or LAST: the record is whole
            yield wandb_internal_pb2.Record.FromString(chunks)
            chunks = b""


def wandb_history(path: Path) -> dict[str, list[tuple[int, object]]]:
    """Each logged key's (step, value) in the order logged; values as wandb stored them (JSON)."""
    history = {}
    for r in wandb_records(path):
        if r.WhichOneof("record_type") == "history":
            for item in r.history.item:
                key = item.key or "/".join(item.nested_key)
                history.setdefault(key, []).append((r.history.step.num, json.loads(item.value_json)))
    return history


def test_wandb_logs_tensorboards_scalars_the_ledger_figures_and_recipe(cache, tmp_path):
    """An offline W&B run beside TensorBoard: the same tags with the same values at the same steps, read back
    from both files; the ledger as a table, the figures as images, the recipe as config; a resumed run goes on
    in the same W&B run."""
    import wandb
    run = tmp_path / "run"
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    _train([f"out={run}", f"world.cache={cache}", "log.wandb=true"], env=env)
    wandb.teardown()        # as the process's exit does: W&B's service has written the run's file whole
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    run_id = (run / "wandb_id").read_text()
    assert log.name == f"run-{run_id}.wandb"

    history, tensorboard = wandb_history(log), tensorboard_scalars(run)
    scalars = {k: v for k, v in history.items() if not k.startswith(("_", "ledger", "figures/"))}
    assert scalars.keys() == tensorboard.keys()
    assert {"train/loss", "train/lr", "eval/mcq_neg/world/acc"} <= tensorboard.keys()
    for tag, points in tensorboard.items():
        assert [s for s, _ in scalars[tag]] == [s for s, _ in points], tag
        assert [v for _, v in scalars[tag]] == pytest.approx([v for _, v in points], rel=1e-6), tag  # TB: float32

    ledger = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    assert history["ledger/nrows"] == [(line["step"], len(line["metrics"])) for line in ledger]
    (table,) = log.parent.glob(f"files/{history['ledger/path'][-1][1]}")
    rows = {row[1]: row for row in json.loads(table.read_text())["data"]}
    last = ledger[-1]
    assert rows == {k: [1, k, v, *last["ci95"][k], last["paired_p"].get(k)] for k, v in last["metrics"].items()}
    figures = sorted(p.stem for p in (run / "figures" / "epoch_1").glob("*.png"))
    assert figures and all(history[f"figures/{f}/_type"] == [(0, "image-file"), (2, "image-file")] for f in figures)
    (config,) = [r.run.config for r in wandb_records(log) if r.WhichOneof("record_type") == "run"]
    recipe = {u.key: json.loads(u.value_json) for u in config.update}
    assert (recipe["recipe"], recipe["epochs"], recipe["log"]["wandb"]) == ("demo", 1, True)

    assert _exit_codes(log) == [0]

    _train([f"out={run}", f"world.cache={cache}", "log.wandb=true", "resume=latest"], env=env)   # nothing left
    wandb.teardown()
    resumed = [p for p in (tmp_path / "wandb").glob("offline-run-*/run-*.wandb") if p != log]
    assert [p.name for p in resumed] == [log.name] and (run / "wandb_id").read_text() == run_id


def _exit_codes(log: Path) -> list[int]:
    return [r.exit.exit_code for r in wandb_records(log) if r.WhichOneof("record_type") == "exit"]


def test_a_stopped_run_ends_its_wandb_run_with_the_command_lines_exit_code(cache, tmp_path, monkeypatch):
    """A run stopped by SIGUSR1 (here: the loop raises it at once) exits 138, and W&B records 138, not a finished
    run; the next launch resumes the same W&B run."""
    import signal
    import wandb
    from negft.train import loop
    from negft.train.stop import Stopped

    def stopped(run, *_):
        raise Stopped(run.run_dir / "checkpoints" / "step_0", 0, signal.SIGUSR1)

    monkeypatch.setattr(loop, "run_epochs", stopped)
    env = {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}
    _train([f"out={tmp_path / 'run'}", f"world.cache={cache}", "log.wandb=true", "eval.suite=zeroshot"], code=138,
           env=env)
    wandb.teardown()
    (log,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert _exit_codes(log) == [138]


def test_log_wandb_without_the_package_exits_2_naming_the_extra(cache, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)         # not importable
    proc = _train([f"out={tmp_path / 'run'}", f"world.cache={cache}", "log.wandb=true"], code=2)
    assert "'log.wandb' = true needs the wandb package: pip install negft[wandb]" in proc.stderr
    assert not (tmp_path / "run").exists()


def test_a_failing_tensorboard_write_stops_the_run_with_the_path_and_the_command_to_continue(
        cache, tmp_path, monkeypatch):
    """The disk fills as TensorBoard's writer thread writes epoch 2's first scalars: the thread dies and its
    error comes back at the next scalar or flush. negft's message instead of the thread's traceback and the
    bare OSError: the directory, what is whole, the last checkpoint and the command to continue; exit 1."""
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter
    write, full = RecordWriter.write, []

    def filling(self, data):
        if full or Event.FromString(data).step > 2:     # epoch 2's steps are 3 and 4
            full.append(True)
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return write(self, data)
    monkeypatch.setattr(RecordWriter, "write", filling)
    monkeypatch.setattr(threading, "excepthook", threading.__excepthook__)   # a process's own, not pytest's
    run = tmp_path / "run"
    proc = _train([f"out={run}", f"world.cache={cache}", "epochs=2"], code=1)
    err = proc.stderr
    assert "Traceback" not in err and "Exception in thread" not in err, err
    assert (f"negft: error: cannot write TensorBoard's events in '{run / 'tensorboard'}': [Errno 28] No space left "
            f"on device. The checkpoints, ledger.jsonl and report.md are whole") in err
    assert f"The last complete checkpoint is {run / 'checkpoints' / 'epoch_1'}; once that is put right, " \
           f"continue with:\n  python train.py " in err
    command = err.rstrip().splitlines()[-1]
    assert f" out={run} " in command and command.endswith(" epochs=2 resume=latest")
    assert [json.loads(line)["epoch"] for line in (run / "ledger.jsonl").read_text().splitlines()] == [0, 1]


def test_wandb_runs_offline_without_an_api_key_and_the_users_wandb_mode_wins(tmp_path, monkeypatch):
    from negft.train.recorder import wandb_mode
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert wandb_mode() == "offline"                           # no ~/.netrc
    netrc = tmp_path / ".netrc"
    netrc.write_text("machine example.org login user password secret\n")
    netrc.chmod(0o600)
    assert wandb_mode() == "offline"                           # a login, for another host
    netrc.write_text("machine api.wandb.ai login user password secret\n")
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert wandb_mode() == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "key")
    assert wandb_mode() == "online"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert wandb_mode() is None                                # wandb.init reads WANDB_MODE itself
