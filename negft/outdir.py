"""Output folders: nothing a command wrote before is lost, and an ``out=`` that cannot be written is said before any
work. Every refusal here is a ``ConfigError`` (the commands exit 2 with it, nothing written).

- ``check_writable``: an ``out`` under a file, on a read-only file system or without permission, found by trying a
  write where ``out`` would go (seconds, not an evaluation's hours, before the first failing write).
- ``refuse_results``: an ``out`` that holds an earlier result of the same command is replaced only with
  ``overwrite=true``.
- ``hold_run_dir``: a training run's lock on its ``out`` (``filelock``, the kernel drops it when its holder dies);
  a second run into it is refused, naming the holder.
- ``check_run_dir``: a run's ``out`` holds one run, resumed or replaced, never overwritten silently.
"""
from __future__ import annotations

import dataclasses
import errno
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import yaml

from negft.config import RUN_KEYS_IGNORED, Config, ConfigError
from negft.fields import leaves

OVERWRITE = "overwrite=true"
# what a training run writes into its out (README "A run directory", and the patching sweep's and release's folders
# of patch.sweep, W&B's offline folder): overwrite=true removes these and nothing else
RUN_ENTRIES = ("config.yaml", "ledger.jsonl", "tensorboard", "checkpoints", "report.md", "figures", "examples",
               "patch", "release", "wandb", "wandb_id")
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


def check_run_dir(cfg: Config, command=lambda word: word) -> None:
    """Refuse (``ConfigError``) what would mix two runs in one ``out``, overwrite one, or resume nothing:
    ``resume=latest`` where ``out`` holds no run; a new run (no ``resume=``) where ``out`` holds anything, unless
    ``overwrite=true`` (then a run's files only); ``resume=auto`` where ``out`` holds a run of another recipe or
    settings (its ``config.yaml``) or files that are no run. ``command(word)``: the command line with ``word`` added
    (``resume=latest``, ``overwrite=true``), which the messages name."""
    out = Path(cfg.out)
    recorded = out / "config.yaml"
    if cfg.overwrite and cfg.resume is not None:
        raise ConfigError(f"overwrite=true starts a new run and resume={cfg.resume} continues one: pass one of them")
    if cfg.resume == "latest" and not recorded.exists() and not (out / "checkpoints").is_dir():
        raise ConfigError(f"resume=latest: out '{out}' holds no run to resume (no config.yaml or checkpoints/). "
                          "Check out=, or pass resume=auto (or leave resume out) to start a new run there")
    there = visible(out)
    if cfg.overwrite:
        others = [n for n in there if n not in RUN_ENTRIES]
        if others:
            raise ConfigError(f"overwrite=true replaces a run, and out '{out}' holds files no run writes "
                              f"({', '.join(others[:5])}{' ...' if len(others) > 5 else ''}): choose another out=")
        return
    if there and (cfg.resume is None or (cfg.resume == "auto" and not recorded.exists())):
        held = "a run" if recorded.exists() else "files"
        shown = ", ".join(there[:5]) + (" ..." if len(there) > 5 else "")
        how = (f"continue that run with `{command('resume=latest')}`, or replace it with `{command(OVERWRITE)}`"
               if recorded.exists() else f"choose another out=, or replace them with `{command(OVERWRITE)}`"
               if set(there) <= set(RUN_ENTRIES) else "choose another out=")
        raise ConfigError(f"out '{out}' already holds {held} ({shown}) and is never overwritten silently; {how}")
    if cfg.resume not in (None, "auto") or not recorded.exists():
        return
    try:
        old = yaml.safe_load(recorded.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ConfigError(f"out '{out}' holds a run whose config.yaml cannot be read ({e}); choose a new out=, "
                          "or pass resume=latest to continue it") from None
    new = dataclasses.asdict(cfg)
    if old.get("recipe") != new["recipe"]:
        raise ConfigError(f"out '{out}' holds a run of recipe '{old.get('recipe')}' (its config.yaml), not "
                          f"'{new['recipe']}'. Choose a new out=, or pass resume=latest to continue that run")
    a, b = leaves(old), leaves(new)
    # a key the old file lacks is one an older negft did not write (streams and on_world are the recipe's own)
    changed = [k for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)
               and (k in a or k.startswith(("streams.", "on_world.")))
               and not any(k == i or k.startswith(i + ".") for i in RUN_KEYS_IGNORED)]
    if changed:
        shown = ", ".join(f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in changed[:5])
        more = f" and {len(changed) - 5} more" if len(changed) > 5 else ""
        raise ConfigError(f"out '{out}' holds a run of recipe '{new['recipe']}' with other settings ({shown}{more}). "
                          "Choose a new out=, pass resume=latest to continue that run with these settings, or "
                          "overwrite=true to replace it")
