"""``negft/data_manifests/*.yaml``: what each real dataset is, where it lives under ``$NEGFT_DATA``, how to build it.

A training dataset's manifest names its ``shards`` (a brace pattern under the data root, or an absolute /
``pipe:`` URL), ``samples`` (the epoch length's source) and ``schema`` (the json fields every sample
holds); an evaluation dataset's names a ``root`` folder and its ``files`` with their CSV columns.
Both also say which released files they come from, the command that builds them, the paper and the
license. They are package data, so an installed negft reads them as a checkout does. ``$NEGFT_DATA`` is read
when asked for, so a test or a user can set it after import.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import braceexpand
import yaml

MANIFESTS = Path(__file__).resolve().parent.parent / "data_manifests"   # the one place the manifests' folder is named
REMOTE = ("pipe:", "s3:", "http:", "https:", "gs:")


def data_root() -> Path:
    """``$NEGFT_DATA`` (default ``./data``), read at each call."""
    return Path(os.environ.get("NEGFT_DATA", "data")).expanduser()


def names() -> list[str]:
    return sorted(p.stem for p in MANIFESTS.glob("*.yaml"))


def path(name: str) -> Path:
    """The manifest file of dataset ``name``."""
    return MANIFESTS / f"{name}.yaml"


def shown(name: str) -> str:
    """How a message names manifest ``name``: ``negft/data_manifests/<name>.yaml``, in the repository and in an
    installed package alike."""
    return f"{MANIFESTS.parent.name}/{MANIFESTS.name}/{name}.yaml"


def load(name: str) -> dict:
    file = path(name)
    if not file.exists():
        raise FileNotFoundError(f"data manifest '{file}' not found; valid: {', '.join(names())}")
    return {"name": name, **(yaml.safe_load(file.read_text()) or {})}


def shard_urls(manifest: dict) -> list[str]:
    """The manifest's shards: a brace pattern expanded, or (a pattern ending in ``/``) the shards listed in
    that folder's ``manifest.json`` as its converter wrote them (every ``*.tar`` in it without one).
    Relative paths are taken under the data root; a folder with no shards gives ``[folder]``."""
    pattern = manifest["shards"]
    if not pattern.startswith(REMOTE) and not Path(pattern).is_absolute():
        pattern = str(data_root() / pattern) + ("/" if pattern.endswith("/") else "")
    if not pattern.endswith("/"):
        return list(braceexpand.braceexpand(pattern))
    folder = Path(pattern)
    written = converted(folder)
    shards = written["shards"] if written else sorted(p.name for p in folder.glob("*.tar"))
    return [str(folder / s) for s in shards] or [str(folder) + "/"]


def converted(folder: Path) -> dict | None:
    """The ``manifest.json`` a converter wrote into ``folder`` (counts, skipped rows, checksums), if any."""
    path = Path(folder) / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else None


def sample_count(manifest: dict, field: str | None = None) -> int | None:
    """Samples of a training dataset that hold ``field`` (all samples without one): the converter's exact
    count where it wrote one (shards may mix NegCap-only and NegMCQ-only samples), else the manifest's
    ``samples``."""
    urls = shard_urls(manifest)
    written = None if is_remote(urls[0]) else converted(Path(urls[0]).parent if urls[0].endswith(".tar")
                                                          else Path(urls[0]))
    if not written:
        return manifest.get("samples")
    return written["fields"].get(field, 0) if field else written["counts"]["samples"]


def is_remote(url: str) -> bool:
    return url.startswith(REMOTE)
