"""World images as CLIP_benchmark's webdataset suite: a small example of the layout the ``zeroshot`` probe reads
(``negft/probes/clip_benchmark_wds.py``), written on demand for tests and the parity run with ``clip_benchmark
eval`` (not a format of the world build: not in ``FORMATS``).

Three dataset folders, as ``clip_benchmark/webdataset_builder.py`` writes them (keys ``s%07d``, ``nshards.txt``
after the shards, one template per line, captions joined by line breaks):

- ``wds_world_shapes``: the world's zero-shot images (one object), class = its shape; PNG; one shard.
- ``wds_world_colors``: the same kind of images, class = the object's colour; lossless WebP (CLIP_benchmark's
  default); two shards; with ``odd``, one sample whose label names no class (CLIP_benchmark counts it a miss).
- ``wds_world_captions`` (``dataset_type.txt``: ``retrieval``): probe images with the world's held-out affirmative
  captions; JPEG; with ``odd``, one image with an empty ``txt`` (no caption) and one caption list with an empty
  line (an empty caption), both of which CLIP_benchmark scores.

With ``broken``, ``wds_world_colors``' last shard also holds the samples CLIP_benchmark stops on (no image, a
label that is no int, an image with no label): a reader must skip and count them.
"""
from __future__ import annotations

import io
import tarfile
from pathlib import Path

from PIL import Image

from negft.world.formats.zeroshot_folder import PROMPTS, class_names
from negft.world.generator import held_out_combos, probe_sample, zeroshot_sample
from negft.world.render import COLORS

COLOR_TEMPLATES = ("a photo of a {c} shape.", "a {c} object.", "something {c}.")
SPLIT = "test"


def _encode(png: bytes, fmt: str) -> bytes:
    if fmt == "png":
        return png
    buf = io.BytesIO()
    image = Image.open(io.BytesIO(png)).convert("RGB")
    image.save(buf, format="WEBP", lossless=True) if fmt == "webp" else image.save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def _shard(path: Path, samples: list[tuple[str, dict[str, bytes]]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))


def _dataset(folder: Path, shards: list[list], classes=None, templates=None, kind: str = "") -> None:
    for i, samples in enumerate(shards):
        _shard(folder / SPLIT / f"{i}.tar", samples)
    (folder / SPLIT / "nshards.txt").write_text(f"{len(shards)}\n")
    if classes is not None:
        (folder / "classnames.txt").write_text("".join(f"{c}\n" for c in classes))
        (folder / "zeroshot_classification_templates.txt").write_text("".join(f"{t}\n" for t in templates))
    if kind:
        (folder / "dataset_type.txt").write_text(kind + "\n")


def write_clip_benchmark_example(out_dir, seed: int = 0, n: int = 24, odd: bool = True,
                                 broken: bool = False, world_split: str = "test") -> dict:
    """The three dataset folders under ``out_dir`` (``n`` images per classification set, ``n // 2`` for retrieval,
    drawn from the world's ``world_split`` probe images); returns {folder name: {labels or captions, classes}} as
    written (the labels of scored samples, in order)."""
    out = Path(out_dir)
    held = {tuple(c) for c in held_out_combos(seed)}
    shapes, colors, labels_s, labels_c = [], [], [], []
    color_names = list(COLORS)
    for i in range(n):
        png, rec = zeroshot_sample(world_split, seed, i, held)
        key = f"s{i:07d}"
        shapes.append((key, {"png": png, "cls": str(rec["label"]).encode()}))
        labels_s.append(rec["label"])
        label = color_names.index(rec["scene"]["objects"][0]["color"])
        colors.append((key, {"webp": _encode(png, "webp"), "cls": str(label).encode()}))
        labels_c.append(label)
    if odd:                                  # a label past the last class name
        colors[-1] = (colors[-1][0], {**colors[-1][1], "cls": str(len(color_names)).encode()})
        labels_c[-1] = len(color_names)
    half = len(colors) // 2
    color_shards = [colors[:half], colors[half:]]
    if broken:
        webp = colors[0][1]["webp"]
        color_shards[-1] += [("s9000000", {"cls": b"1"}), ("s9000001", {"webp": webp, "cls": b"red"}),
                             ("s9000002", {"webp": webp})]
    _dataset(out / "wds_world_shapes", [shapes], class_names(), PROMPTS)
    _dataset(out / "wds_world_colors", color_shards, color_names, COLOR_TEMPLATES)
    captions, rows = [], []
    for i in range(n // 2):
        png, rec = probe_sample(world_split, seed, 1000 + i, held, size="tiny")   # past Probe-B/C's images: no extras
        texts = list(rec["retrieval"])
        if odd and i == 1:
            texts = []
        elif odd and i == 2:
            texts = [texts[0], "", *texts[1:]]
        captions.append(texts)
        rows.append((f"s{i:07d}", {"jpg": _encode(png, "jpg"), "txt": "\n".join(texts).encode()}))
    _dataset(out / "wds_world_captions", [rows], kind="retrieval")
    return {"wds_world_shapes": {"labels": labels_s, "classes": class_names()},
            "wds_world_colors": {"labels": labels_c, "classes": color_names},
            "wds_world_captions": {"captions": captions}}
