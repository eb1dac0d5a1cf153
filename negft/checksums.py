"""A release's ``SHA256SUMS``: hashing, checking, and refusing a checkpoint whose files fail it. Below both the
commands that load a checkpoint (eval, patch) and the release that writes the sums."""
from __future__ import annotations

from pathlib import Path

from negft.config import ConfigError
from negft.io import sha256_file as sha256

SUMS = "SHA256SUMS"


def verify(directory: str | Path, only: str | None = None) -> list[str]:
    """Files whose content no longer matches ``SHA256SUMS`` (missing ones, and lines that name no file of the
    directory, included); [] when intact. ``only``: check that one file's line alone."""
    directory = Path(directory)
    bad = []
    for n, line in enumerate((directory / SUMS).read_text(errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or len(parts[0]) != 64:
            bad.append(f"{SUMS} line {n} (not 'SHA256  NAME')")
            continue
        digest, name = parts[0].lower(), parts[1].lstrip("*")
        if only is not None and name != only:
            continue
        path = directory / name
        if path.resolve().parent != directory.resolve() or not path.is_file() or sha256(path) != digest:
            bad.append(name)
    return bad


def check_release(key: str, path: str | Path, check: bool = True) -> None:
    """Refuse (``ConfigError``) a checkpoint passed as ``key`` whose files fail the ``SHA256SUMS`` beside them: a
    release directory, or one file of one. Nothing to check where there is no ``SHA256SUMS`` (a run's
    checkpoint, a tag), or with ``check`` false (``verify=false``)."""
    path = Path(path)
    if not check or not path.exists():
        return
    folder, only = (path, None) if path.is_dir() else (path.parent, path.name)
    if not (folder / SUMS).is_file():
        return
    bad = verify(folder, only)
    if bad:
        raise ConfigError(f"{key}: {', '.join(bad)} in '{folder}' fail(s) its {SUMS} (changed or damaged since it "
                          f"was released). Fetch the release again and compare with `sha256sum -c {SUMS}` in "
                          f"its folder, or pass verify=false to use it anyway")
