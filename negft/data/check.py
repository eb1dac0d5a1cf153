"""``negft data check MANIFEST|all``: is each dataset where its manifest says, whole, and of its schema?

Run before a long job, and by ``train.py`` for the datasets its recipe reads (presence and the schema of
the first shard only), so a missing or half-copied dataset fails in seconds with the command that builds
it, not hours later inside a data loader.
"""
from __future__ import annotations

import csv
import json
import sys
import tarfile
from pathlib import Path

from negft.data import manifests, schema
from negft.data.shards import MANIFEST
from negft.io import sha256_file


def _first_sample(shard: str) -> tuple[dict | None, set[str]]:
    """(json of the first sample, its member extensions) of a tar shard."""
    members: dict[str, dict[str, tarfile.TarInfo]] = {}
    with tarfile.open(shard) as tf:
        for info in tf:
            key, _, ext = info.name.partition(".")
            if members and key not in members:
                break
            members.setdefault(key, {})[ext] = info
        if not members:
            return None, set()
        (key, exts), = members.items()
        meta = json.loads(tf.extractfile(exts["json"]).read()) if "json" in exts else None
    return meta, set(exts)


def _count(shard: str) -> int:
    with tarfile.open(shard) as tf:
        return sum(1 for info in tf if info.name.endswith(".json"))


def check_shards(man: dict, counts: bool = True, checksums: bool = False, first_only: bool = False) -> list[str]:
    """Problems with a training dataset's shards: missing files, unreadable shards, a schema field that no
    sample holds (by the ``manifest.json`` its converter wrote; else each shard's first sample must hold
    them all), sample counts or checksums that differ from that ``manifest.json``."""
    where = f"({manifests.shown(man['name'])})"
    urls = manifests.shard_urls(man)
    if manifests.is_remote(urls[0]):
        return []
    missing = [u for u in urls if not Path(u).is_file()]
    if len(missing) == len(urls):
        folder = urls[0] if urls[0].endswith("/") else f"{Path(urls[0]).parent}/"
        return [f"{man['name']}: no shards at {folder} ({man['shards']}) {where}; "
                f"build them with: {man.get('build', 'see the manifest')}"]
    problems = [f"{man['name']}: {len(missing)} of {len(urls)} shards missing, e.g. {missing[0]} {where}"] if missing else []
    present = [u for u in urls if u not in missing]
    fields = [f for f in man.get("schema") or [] if isinstance(f, str)]
    record = manifests.converted(Path(present[0]).parent)
    if record is not None:       # a converter's shards may mix samples (NegCap + NegMCQ merged): count fields
        lacking = [f for f in fields if not record.get("fields", {}).get(f)]
        if lacking:
            problems.append(f"{man['name']}: no sample holds {', '.join(lacking)} (the converter wrote "
                            f"{', '.join(record.get('fields', {})) or 'no fields'}) {where}")
        fields = []
    from tqdm import tqdm
    shards = present[:1] if first_only else tqdm(present, desc=f"check {man['name']}", unit="shard",
                                                  disable=len(present) < 20, file=sys.stderr)
    total, unreadable = 0, 0
    for shard in shards:
        try:
            meta, exts = _first_sample(shard)
            if counts and not first_only:
                total += _count(shard)
        except (OSError, tarfile.TarError, ValueError) as e:
            unreadable += 1
            problems.append(f"{man['name']}: {shard}: unreadable, truncated or not a tar ({e}) {where}")
            continue
        lacks = [f for f in fields if meta is None or f not in meta]
        if meta is None or lacks or not exts & set(schema.IMAGE_KEYS):
            problems.append(f"{man['name']}: {shard}: first sample " + (
                "has no json" if meta is None else f"lacks {', '.join(lacks)}" if lacks else "has no image")
                + f" (schema: {', '.join(fields)}) {where}")
    written = Path(present[0]).parent / MANIFEST
    if record is not None and not first_only:
        expected = record.get("counts", {}).get("samples")
        if counts and not missing and not unreadable and expected is not None and expected != total:
            problems.append(f"{man['name']}: {total} samples in the shards, {written} says {expected} "
                            f"(a truncated or partly copied shard?) {where}")
        if checksums:
            for shard in present:
                want = record.get("sha256", {}).get(Path(shard).name)
                if want and sha256_file(shard) != want:
                    problems.append(f"{man['name']}: {shard}: sha256 differs from {written} {where}")
    return problems


def check_files(man: dict) -> list[str]:
    """Problems with an evaluation dataset: missing files, CSVs without the manifest's columns."""
    where = f"({manifests.shown(man['name'])})"
    root = manifests.data_root() / man["root"]
    missing = [f for f in man.get("files", []) if not (root / f).exists()]
    if missing and len(missing) == len(man.get("files", [])):
        return [f"{man['name']}: not found at {root}/ (expected {', '.join(missing)}) {where}"]
    problems = [f"{man['name']}: {root / f} missing {where}" for f in missing]
    for name, columns in (man.get("schema") or {}).items():
        path = root / name
        if name.endswith(".csv") and path.exists() and isinstance(columns, list):
            with open(path, newline="") as f:
                header = next(csv.reader(f), [])
            lacks = [c for c in columns if c not in header]
            if lacks:
                problems.append(f"{man['name']}: {path} lacks column(s) {', '.join(lacks)}; it has "
                                f"{', '.join(header)} {where}")
    return problems


def check_collection(man: dict) -> list[str]:
    """Problems with a collection of CLIP_benchmark webdataset folders: none found, or a dataset that cannot be
    read (its shards or metadata missing)."""
    from negft.probes.clip_benchmark_wds import discover, load
    where = f"({manifests.shown(man['name'])})"
    root = manifests.data_root() / man["root"]
    found = discover(root, man["name"], man, set())
    if not found:
        return [f"{man['name']}: not found at {root}/ (expected <dataset>/{man.get('split') or 'test'}/nshards.txt "
                f"and its shards) {where}"]
    problems = []
    for dataset in found:
        why = load(dataset, str(man.get("split") or "test"))["why"]
        if why:
            problems.append(f"{man['name']}: {dataset.root.name}: {why} {where}")
    return problems


def check(name: str, counts: bool = True, checksums: bool = False, first_only: bool = False) -> list[str]:
    man = manifests.load(name)
    if "shards" in man:
        return check_shards(man, counts, checksums, first_only)
    if man.get("layout") == "clip_benchmark_wds":
        return check_collection(man)
    if "root" in man:
        return check_files(man)
    return []
