"""Atomic writes: every file and directory negft writes appears whole, or not at all.

A reader (``resume=latest``, a cached world, ``negft data check``, a user's ``cat``) must never take a
half-written file for a finished one, so everything is written under a hidden staging name beside its final
path (``.NAME.tmp``, or ``.NAME.<random>.tmp`` where two processes may write the same path at once) and
renamed into place when complete. A killed writer leaves only the hidden name behind, which every glob for
finished files (``epoch_*``, ``[!.]*``, ``*.tar``) skips.
"""
from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator


class WriteError(OSError):
    """A file or directory negft writes could not be written (disk full, a read-only file system, no permission);
    the message names the path, the error and what the failure left (what was at the path before is still there,
    whole), for the command line to print as it is, without a traceback."""


def write_failure(e: BaseException) -> bool:
    """Whether ``e`` reports a failed write: an ``OSError``, or how the two writers of checkpoint files report one
    without it: torch.save's zip writer (a ``RuntimeError`` from ``inline_container.cc``, "unexpected pos" or
    "file write failed", no errno) and safetensors (``SafetensorError``: "I/O error: ... (os error N)")."""
    if isinstance(e, OSError):
        return True
    text = str(e)
    return ((isinstance(e, RuntimeError) and "inline_container" in text)
            or (type(e).__name__ == "SafetensorError" and "I/O error" in text))


def write_error(path: str | Path, e: BaseException, kept: str) -> WriteError:
    """The ``WriteError`` for the failed write ``e`` of ``path``; ``kept``: what the failure left."""
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list) and e.args[0]:
        e = e.args[0][0][2]     # shutil.copytree gathers each file's failure in one Error: the first says why
    why = e if isinstance(e, (OSError, str)) else (f"{e} (the writer says no more: is the file system full or "
                                                   "read-only?)")
    return WriteError(f"cannot write '{path}': {why}; {kept}")


def kept_of(path: str | Path) -> str:
    """What a failed atomic write of ``path`` leaves: the old version where there was one."""
    return "its previous version is kept, whole" if Path(path).exists() else "nothing was left at that path"


@contextmanager
def failing_writes(path: str | Path, kept: str) -> Iterator[None]:
    """A failed write in the block (``write_failure``) ends as a ``WriteError`` naming ``path`` and ``kept``. A
    ``WriteError`` from inside (it names a narrower path) and a refusal to overwrite (``FileExistsError``: bad
    input, not a failing disk) go on as they are."""
    try:
        yield
    except (WriteError, FileExistsError):
        raise
    except Exception as e:
        if not write_failure(e):
            raise
        raise write_error(path, e, kept) from e


def staging_path(path: str | Path, suffix: str = "", shared: bool = False) -> Path:
    """The hidden name ``path`` is written under before it is renamed into place. ``shared``: the same name
    in every process (ranks that write into one checkpoint directory); otherwise a name of its own, so two
    writers of one path never write into each other's file. ``suffix`` keeps an extension that a writer
    reads its format from (``.png`` for matplotlib, ``.npz`` for numpy)."""
    path = Path(path)
    tag = "" if shared else f".{secrets.token_hex(4)}"
    return path.with_name(f".{path.name}{tag}.tmp{suffix}")


def remove(path: str | Path) -> None:
    """Remove a file or a directory tree; nothing if it is not there."""
    path = Path(path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def move_into_place(staged: str | Path, path: str | Path, overwrite: bool = True) -> None:
    """Rename the finished ``staged`` onto ``path``. A file replaces its old version in one rename; a directory
    that exists is first renamed aside and then removed, so ``path`` is at every moment the old whole or the new
    whole. ``overwrite=False``: refuse a ``path`` that exists (``FileExistsError``)."""
    staged, path = Path(staged), Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"'{path}' exists and is never overwritten")
    if path.is_dir() and not path.is_symlink():
        old = staging_path(path, ".old")
        os.replace(path, old)
        try:
            os.replace(staged, path)
        except OSError:
            os.replace(old, path)       # the old whole back in place
            raise
        remove(old)
    else:
        os.replace(staged, path)


@contextmanager
def atomic_path(path: str | Path, suffix: str = "", directory: bool = False, shared: bool = False,
                overwrite: bool = True, kept: str = "") -> Iterator[Path]:
    """A staging path to write ``path``'s content into; renamed onto ``path`` when the block ends without an
    error, removed when it raises. ``directory``: the staging path is created as an empty directory.
    ``shared``, ``suffix``: as in ``staging_path``; ``overwrite``: as in ``move_into_place``. A failed write, in
    the block or at the rename, raises ``WriteError`` naming ``path`` and ``kept``, what the failure left
    (``kept_of``: the old version, or nothing, where the caller knows no more)."""
    path = Path(path)
    staged = staging_path(path, suffix, shared)
    with failing_writes(path, kept or kept_of(path)):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            remove(staged)                  # a shared name left behind by a killed writer
            if directory:
                staged.mkdir()
            yield staged
            move_into_place(staged, path, overwrite)
        finally:
            remove(staged)                  # nothing left once moved


@contextmanager
def scratch_dir(parent: str | Path) -> Iterator[Path]:
    """A hidden directory of its own under ``parent`` to build several outputs in, removed when the block ends;
    the caller moves each finished output into place with ``move_into_place``."""
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    staged = staging_path(parent / "build")
    staged.mkdir()
    try:
        yield staged
    finally:
        remove(staged)              # what was not moved out is dropped


def atomic_write(path: str | Path, data: str | bytes | Callable[[Path], None], suffix: str = "",
                 kept: str = "") -> Path:
    """Write ``path`` whole: ``data`` is its text, its bytes, or a function that writes a file at the path it is
    given (``lambda p: fig.savefig(p)``; ``suffix`` then keeps the extension it reads its format from).
    Text and bytes are flushed to disk before the rename. A failing write raises ``WriteError`` (``atomic_path``,
    ``kept``); the old file stays as it was."""
    path = Path(path)
    with atomic_path(path, suffix, kept=kept) as staged:
        if callable(data):
            data(staged)
        else:
            with open(staged, "wb" if isinstance(data, bytes) else "w") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
    return path


def umask() -> int:
    """This process's file-creation mask, read without changing it where Linux says it (/proc/self/status)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def as_umask_allows(path: str | Path) -> Path:
    """Give a file the mode a plain ``open`` would have (0644 under the usual umask 022): safetensors writes its
    files 0600, so a run's checkpoint weights were unreadable to the colleagues who can read its other files."""
    os.chmod(path, 0o666 & ~umask())
    return Path(path)


def sha256_file(path: str | Path) -> str:
    """The hex SHA256 of a file's bytes (``sha256sum``'s)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
