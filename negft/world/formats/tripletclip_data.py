"""World RelComp images as TripletCLIP's training shards: a small example of the released files the converter
``negft.convert.tripletclip_data`` reads (its docstring gives the layout and where it was taken from), written on
demand for tests (not a format of the world build: not in ``FORMATS``).

    <out>/tripletdata/shard-<n>.tar    webdataset tars, ``per_shard`` samples each, each sample four members:
                                       <key>.image (JPEG), <key>.caption, <key>.neg_image (PNG), <key>.neg_caption

A sample is a world RelComp image with its caption; the hard caption is the caption of the RelComp record's
negative image and the negative image is that image, rendered from its scene (as TripletCLIP generates I⁻ from
T⁻). Keys are nine-digit numbers, the members in the order the loader's ``to_tuple`` names them.

``bad`` plants, one sample each (``PLANTED``): sample 1 without its image, 2 without its negative image, 3 a
caption of spaces, 4 a hard caption that is not UTF-8, 5 an image that is not one (cut JPEG bytes), 6 a GIF negative
image; and one more shard, its second sample cut in the middle (the first is kept, the shard counted unreadable).
"""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

from PIL import Image

from negft.convert.negbench import CORRUPT_IMAGE, UNSUPPORTED_IMAGE
from negft.convert.tripletclip_data import CAPTION_MEMBER, IMAGE, MISSING_NEG_IMAGE, NEG_CAPTION, NEG_IMAGE, \
    NEG_IMAGE_REASONS, NO_CAPTION, NO_NEG_CAPTION, UNREADABLE_SHARD
from negft.data.schema import RELCOMP
from negft.data.shards import MISSING_IMAGE
from negft.world import generator as world

FOLDER = "tripletdata"
PLANTED = {1: MISSING_IMAGE, 2: MISSING_NEG_IMAGE, 3: NO_CAPTION, 4: NO_NEG_CAPTION, 5: CORRUPT_IMAGE,
           6: NEG_IMAGE_REASONS[UNSUPPORTED_IMAGE]}


def _encoded(png: bytes, fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.open(io.BytesIO(png)).convert("RGB").save(buf, format=fmt)
    return buf.getvalue()


def triplets(n: int, seed: int) -> list[tuple[str, dict]]:
    """(key, {member: bytes}) of ``n`` world RelComp images that have a negative image, all good."""
    out, i = [], 0
    while len(out) < n:
        png, rec, negative = world.train_sample("relcomp", seed, i, held_out=set())
        if negative is not None:
            relcomp = rec[RELCOMP]
            out.append((f"{i:09d}", {IMAGE: _encoded(png, "JPEG"), CAPTION_MEMBER: relcomp["caption"].encode(),
                                     NEG_IMAGE: negative, NEG_CAPTION: relcomp["negative_image_caption"].encode()}))
        i += 1
    return out


def _plant(samples: list[tuple[str, dict]]) -> None:
    """``PLANTED``'s faults, in place."""
    del samples[1][1][IMAGE]
    del samples[2][1][NEG_IMAGE]
    samples[3][1][CAPTION_MEMBER] = b"   "
    samples[4][1][NEG_CAPTION] = b"\xff\xfe not text"
    samples[5][1][IMAGE] = samples[5][1][IMAGE][:40]
    samples[6][1][NEG_IMAGE] = _encoded(samples[6][1][NEG_IMAGE], "GIF")


def write_tar(path: Path, samples: list[tuple[str, dict]]) -> None:
    """A webdataset tar: each sample's members as ``<key>.<member>``, one sample after another."""
    with tarfile.open(path, "w") as tf:
        for key, members in samples:
            for member, data in members.items():
                info = tarfile.TarInfo(f"{key}.{member}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def _cut(path: Path, samples: list[tuple[str, dict]]) -> None:
    """``samples`` (two) as a tar cut inside the second sample's first member."""
    write_tar(path, samples)
    first = sum(512 + -(-len(d) // 512) * 512 for d in samples[0][1].values())
    path.write_bytes(path.read_bytes()[:first + 512 + 100])


def write(out_dir, n: int, seed: int = 0, per_shard: int = 4, bad: bool = True) -> dict:
    """``n`` samples (n >= 7 with ``bad``) as ``<out_dir>/tripletdata/shard-<n>.tar``; returns the folder, the
    samples as written (``written``: key -> members, the cut shard's included; ``shard_of``: key -> its tar), the
    keys the converter should keep (``kept``, in order) and its skips by reason (``skipped``)."""
    folder = Path(out_dir) / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    samples = triplets(n + (2 if bad else 0), seed)
    samples, tail = samples[:n], samples[n:]
    if bad:
        _plant(samples)
    shards = [samples[k:k + per_shard] for k in range(0, n, per_shard)]
    for s, group in enumerate(shards):
        write_tar(folder / f"shard-{s}.tar", group)
    skipped = {}
    for reason in (PLANTED.values() if bad else ()):
        skipped[reason] = skipped.get(reason, 0) + 1
    kept = [key for k, (key, _) in enumerate(samples) if not bad or k not in PLANTED]
    if bad:
        _cut(folder / f"shard-{len(shards)}.tar", tail)
        skipped[UNREADABLE_SHARD] = 1
        kept.append(tail[0][0])
    shard_of = {key: f"shard-{s}.tar" for s, group in enumerate([*shards, tail[:1]]) for key, _ in group}
    return {"folder": str(folder), "written": dict(samples + tail[:1]), "shard_of": shard_of, "kept": kept,
            "skipped": skipped, "shards": len(shards) + bad}
