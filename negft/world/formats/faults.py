"""A world whose training samples are corrupted on purpose (tests/test_faults_data.py, experiments/corrupt_demo.py).

``corrupted_world`` lays out a world cache beside the original: every split and the cached base models are links
to the original's, except the fine-tuning split, whose shards are rewritten with one sample in ``1 / fraction``
broken in one of the ways a real download breaks (cycled in order): an image cut short, a json that does not
parse, an MCQ answer out of range, an image member missing. ``train.py ... world.cache=<returned cache>`` then
trains on it from the same base model as a run on the original.
"""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

from negft.data.shards import tar_add

KINDS = ("image_undecodable", "json_undecodable", "mcq_answer_out_of_range", "image_missing")


def _break(kind: str, members: dict[str, bytes]) -> dict[str, bytes]:
    if kind == "image_undecodable":
        return {**members, "png": members["png"][:len(members["png"]) // 3]}
    if kind == "json_undecodable":
        return {**members, "json": members["json"][:len(members["json"]) // 2]}
    if kind == "mcq_answer_out_of_range":
        meta = json.loads(members["json"])
        meta["mcq"]["answer"] = len(meta["mcq"]["options"])
        return {**members, "json": json.dumps(meta).encode()}
    if kind == "image_missing":
        return {k: v for k, v in members.items() if k != "png"}
    raise ValueError(kind)


def corrupted_world(world: Path, cache: Path, fraction: float = 0.01, split: str = "finetune") -> dict[str, int]:
    """Write ``cache/<world's name>``: ``world`` with ``fraction`` of ``split``'s samples broken; returns the
    number broken per kind. ``cache/base`` links to the base models cached beside ``world``."""
    world, cache = Path(world), Path(cache)
    root = cache / world.name
    root.mkdir(parents=True)
    if (world.parent / "base").is_dir():
        (cache / "base").symlink_to((world.parent / "base").resolve())
    for entry in world.iterdir():
        if entry.name != split:
            (root / entry.name).symlink_to(entry.resolve())
    (root / split).mkdir()
    every, seen, broken = max(1, round(1 / fraction)), 0, {k: 0 for k in KINDS}
    for shard in sorted((world / split).glob("*.tar")):
        samples: dict[str, dict[str, bytes]] = {}
        with tarfile.open(shard) as tf:
            for m in tf:
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tf.extractfile(m).read()
        with tarfile.open(root / split / shard.name, "w", format=tarfile.USTAR_FORMAT) as out:
            for key, members in samples.items():
                if seen % every == every // 2:
                    kind = KINDS[sum(broken.values()) % len(KINDS)]
                    members = _break(kind, members)
                    broken[kind] += 1
                seen += 1
                for ext, data in members.items():
                    tar_add(out, f"{key}.{ext}", data)
    return broken
