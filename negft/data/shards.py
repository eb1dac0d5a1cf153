"""Writing webdataset shards in the schema of ``schema.py``: the one writer every converter uses.

A converter reads a released file row by row, hands each good row to ``ShardWriter.add`` and each bad
one to ``ShardWriter.skip`` with a reason; ``close`` writes ``manifest.json`` (counts, skipped rows by
reason with examples, where the input layout was taken from) last, so a folder holding a
``manifest.json`` is complete. Shards are written under a staging name and renamed into place (``negft.io``); a
failed write raises ``WriteError`` naming the shard (or the manifest) and the finished shards it leaves.
"""
from __future__ import annotations

import io
import json
import re
import sys
import tarfile
import time
from collections import Counter
from contextlib import suppress
from pathlib import Path

from negft.io import atomic_write, failing_writes, kept_of, move_into_place, remove, sha256_file, staging_path

SHARD_PATTERN = "shard-{:06d}.tar"
IMAGE_EXTS = {".jpg": "jpg", ".jpeg": "jpg", ".png": "png"}     # file suffix -> member extension the loader decodes
MISSING_IMAGE = "missing image"                                # the skip reason every converter uses
NO_HARD_CAPTION = "no hard caption"                            # a hard-caption converter's row with none usable
MANIFEST = "manifest.json"
EXAMPLES_PER_REASON = 20          # skipped rows listed by id in manifest.json, per reason


def dumps(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def tar_add(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    """A USTAR member with mtime 0: shards are byte-reproducible, in exactly ``webdataset.TarWriter``'s layout."""
    ti = tarfile.TarInfo(name)
    ti.size, ti.mtime, ti.mode, ti.uname, ti.gname = len(data), 0, 0o444, "negft", "negft"
    tf.addfile(ti, io.BytesIO(data))


def read_samples(shards) -> dict[str, dict[str, bytes]]:
    """Every sample of ``shards`` (paths), read whole: key -> {extension: bytes}, in the order written. The
    reverse of ``ShardWriter`` for benchmarks and checks; training reads shards through webdataset
    (``negft.data.pipeline``)."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in shards:
        with tarfile.open(shard) as tf:
            for member in tf.getmembers():
                key, ext = member.name.split(".", 1)         # webdataset's rule: the key ends at the first dot
                samples.setdefault(key, {})[ext] = tf.extractfile(member).read()
    return samples


_UNSAFE = re.compile(r"[^A-Za-z0-9_\-]")


def sample_key(raw: str) -> str:
    """A webdataset key from any id: webdataset splits member names at the first dot, so dots (and
    slashes) may not appear in a key."""
    return _UNSAFE.sub("_", str(raw)) or "_"


def truthy(value) -> bool:
    """A converter's yes/no option as the command line gives it (``progress=false``) or as Python passes it."""
    return value if isinstance(value, bool) else str(value).strip().lower() in ("1", "true", "yes", "on")


def an_input(path, what: str, found=Path.is_file, hint: str = "") -> Path:
    """A converter's input as a Path, checked with ``found`` before ``out/`` is made: a missing one is a
    FileNotFoundError naming what it should be."""
    path = Path(path)
    if not found(path):
        raise FileNotFoundError(f"{what} {path} not found" + (f" ({hint})" if hint else ""))
    return path


class ShardWriter:
    """Samples (image bytes + json fields) into ``out/shard-NNNNNN.tar``, ``maxcount`` per shard.

    ``out`` must not already hold a converted dataset (its ``manifest.json``): conversions never
    overwrite. Keys are made unique; ``skip`` counts a bad row by reason.
    """

    def __init__(self, out: str | Path, fmt: str, layout_source: str, inputs: dict, maxcount: int = 1000,
                 progress: bool = True):
        self.out = Path(out)
        if (self.out / MANIFEST).exists():
            raise FileExistsError(f"{self.out} already holds a converted dataset ({MANIFEST}); "
                                  f"pass a new out=DIR or remove it")
        with failing_writes(self.out, kept_of(self.out)):
            self.out.mkdir(parents=True, exist_ok=True)
        self.fmt, self.layout_source, self.inputs, self.maxcount = fmt, layout_source, inputs, maxcount
        self.samples = 0
        self.shards: list[str] = []
        self.sha256: dict[str, str] = {}
        self.skipped: Counter = Counter()
        self.skipped_examples: dict[str, list[str]] = {}
        self.notes: dict = {}
        self.fields: Counter = Counter()
        self._tf = None
        self._staged = None         # the open shard's staging path (negft.io): renamed into place when sealed
        self._keys: set[str] = set()
        self._t0 = time.perf_counter()
        self._bar = None
        if progress:
            from tqdm import tqdm
            self._bar = tqdm(desc=f"convert {fmt}", unit="img", smoothing=0.1, file=sys.stderr)

    def _kept(self) -> str:
        """What a failed write leaves: the shards sealed before it, and no manifest (so no complete folder)."""
        return (f"the {len(self.sha256)} shard(s) finished before it stay in '{self.out}' without {MANIFEST}, so "
                "nothing takes the folder for a converted dataset; the same command converts it again")

    def _open(self):
        name = SHARD_PATTERN.format(len(self.shards))
        with failing_writes(self.out / name, self._kept()):
            self._staged = staging_path(self.out / name)
            self._tf = tarfile.open(self._staged, "w", format=tarfile.USTAR_FORMAT)
        self.shards.append(name)

    def _seal(self):
        if self._tf is not None:
            with failing_writes(self.out / self.shards[-1], self._kept()):
                self._tf.close()
                self.sha256[self.shards[-1]] = sha256_file(self._staged)     # read back from the page cache
                move_into_place(self._staged, self.out / self.shards[-1])
            self._tf = None

    def add(self, key: str, image: bytes, ext: str, meta: dict, extra: dict[str, bytes] | None = None) -> str:
        """Write one sample; returns the key it was stored under (``key`` made safe and unique)."""
        key = base = sample_key(key)
        n = 1
        while key in self._keys:
            key, n = f"{base}_{n}", n + 1
        self._keys.add(key)
        if self._tf is None or self.samples % self.maxcount == 0 and self.samples:
            self._seal()
            self._open()
        with failing_writes(self.out / self.shards[-1], self._kept()):
            tar_add(self._tf, f"{key}.{ext}", image)
            tar_add(self._tf, f"{key}.json", dumps(meta))
            for suffix, data in (extra or {}).items():
                tar_add(self._tf, f"{key}.{suffix}", data)
        self.samples += 1
        self.fields.update(meta.keys())
        if self._bar is not None:
            self._bar.update(1)
        return key

    def skip(self, reason: str, row: str) -> None:
        """Count a row that could not be converted; ``row`` identifies it for the user (line, id)."""
        self.skipped[reason] += 1
        examples = self.skipped_examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(str(row))

    def close(self, command: str = "") -> dict:
        """Seal the last shard and write ``manifest.json``; returns it."""
        self._seal()
        if self._bar is not None:
            self._bar.close()
        elapsed = time.perf_counter() - self._t0
        manifest = {
            "format": self.fmt,
            "layout_source": self.layout_source,
            "inputs": self.inputs,
            "command": command or " ".join(["negft", *sys.argv[1:]]),
            "shards": self.shards,
            "pattern": f"shard-{{000000..{len(self.shards) - 1:06d}}}.tar" if self.shards else "",
            "counts": {"samples": self.samples, "shards": len(self.shards)},
            "fields": dict(sorted(self.fields.items())),
            "skipped": dict(sorted(self.skipped.items())),
            "skipped_examples": self.skipped_examples,
            "sha256": self.sha256,
            **self.notes,
            "seconds": round(elapsed, 3),
            "images_per_second": round(self.samples / elapsed, 1) if elapsed > 0 else None,
        }
        atomic_write(self.out / MANIFEST, json.dumps(manifest, indent=1, ensure_ascii=False), kept=self._kept())
        return manifest

    def __enter__(self):
        return self

    def __exit__(self, exc_type, *_):
        if exc_type is not None and self._tf is not None:      # leave no half shard behind
            with suppress(OSError):     # a full disk refuses the tar's end blocks too; the file goes all the same
                self._tf.close()
            remove(self._staged)
            self.shards.pop()
            self._tf = None
            if self._bar is not None:
                self._bar.close()
