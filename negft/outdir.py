"""Output folders: nothing a command wrote before is lost, and an ``out=`` that cannot be written is said before any
work. Every refusal here is a ``ConfigError`` (the commands exit 2 with it, nothing written).

- ``check_writable``: an ``out`` under a file, on a read-only file system or without permission, found by trying a
  write where ``out`` would go (seconds, not an evaluation's hours, before the first failing write).
- ``refuse_results``: an ``out`` that holds an earlier result of the same command is replaced only with
  ``overwrite=true``.
- ``hold_run_dir``: a training run's lock on its ``out`` (``filelock``, the kernel drops it when its holder dies);
  a second run into it is refused, naming the holder.
"""
from __future__ import annotations

import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from negft.config import ConfigError

OVERWRITE = "overwrite=true"
# what a training run writes into its out (README "A run directory", and the patching sweep's and release's folders
# of patch.sweep, W&B's offline folder): overwrite=true removes these and nothing else
RUN_ENTRIES = ("config.yaml", "ledger.jsonl", "tensorboard", "checkpoints", "report.md", "figures", "examples",
               "patch", "release", "wandb")
LOCK, OWNER = ".negft-run.lock", ".negft-run.owner.json"      # hidden: a run directory's globs skip them


def unwritable(out: str | Path) -> str | None:
    """Why ``out`` cannot be written (None: it can): the first of its folders that exists is tried with a hidden
    file made and removed at once."""
    out = Path(out)
    here = out
    while not here.exists() and here != here.parent:
        here = here.parent
    if here.exists() and not here.is_dir():
        return f"'{here}' is a file, not a folder"
    probe = here / f".negft-write-test-{os.getpid()}.tmp"
    try:
        os.close(os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600))
        os.unlink(probe)
    except OSError as e:
        why = {errno.EROFS: "a read-only file system", errno.EACCES: "no permission to write",
               errno.EPERM: "no permission to write", errno.ENOSPC: "no space left"}.get(e.errno, e.strerror or str(e))
        return f"'{here}': {why}"
    return None


def check_writable(out: str | Path, key: str = "out") -> None:
    """Refuse an ``out`` that cannot be written (``unwritable``), before any work."""
    why = unwritable(out)
    if why:
        raise ConfigError(f"{key} '{out}' cannot be written ({why}); choose another {key}=")


def visible(out: str | Path) -> list[str]:
    """The names in ``out`` a user sees (hidden ones are locks and staging), sorted; [] if it is not there."""
    out = Path(out)
    return sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.is_dir() else []


def refuse_results(out: str | Path, names: tuple[str, ...], what: str, overwrite: bool) -> None:
    """Refuse an ``out`` holding any of ``names`` (an earlier ``what``) unless ``overwrite``."""
    found = [n for n in names if (Path(out) / n).exists()]
    if found and not overwrite:
        raise ConfigError(f"out '{out}' already holds {what} ({', '.join(found)}): choose a new out=, or pass "
                          f"{OVERWRITE} to replace it")


def remove_entries(out: str | Path, names) -> None:
    """Remove ``names`` from ``out`` (an earlier result that ``overwrite=true`` replaces)."""
    from negft.io import remove
    for name in names:
        remove(Path(out) / name)


def _owner(out: Path) -> str:
    import json
    try:
        o = json.loads((out / OWNER).read_text())
        return f"pid {o['pid']} on {o['host']} since {o['since']} ({o['command']})"
    except (OSError, ValueError, KeyError):
        return "another process (it has not said who yet)"


@contextmanager
def hold_run_dir(out: str | Path, rank: int = 0) -> Iterator[None]:
    """Hold ``out``'s lock while a training run writes it (rank 0 of a run; the other ranks write what rank 0
    says). Taken by another process: ``ConfigError`` naming it. The lock file this made goes when the block ends,
    and so does a folder this made that the run left empty (a run refused after the lock)."""
    if rank != 0:
        yield
        return
    import json
    import socket
    import sys
    import time
    from filelock import FileLock, Timeout
    out = Path(out)
    made = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    created = not (out / LOCK).exists()
    lock = FileLock(str(out / LOCK))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise ConfigError(f"out '{out}' is in use by another training run: {_owner(out)}. Wait for it to end, or "
                          "choose another out=") from None
    try:
        (out / OWNER).write_text(json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300]}))
        yield
    finally:
        (out / OWNER).unlink(missing_ok=True)
        if created:
            (out / LOCK).unlink(missing_ok=True)        # a refused command leaves out as it found it
        lock.release()
        if made and not any(out.iterdir()):
            out.rmdir()
