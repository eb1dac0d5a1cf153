"""Videos as NegBench scores them (MSR-VTT retrieval and MCQ): 4 uniformly sampled frames, each encoded by the
image tower and L2-normalised, averaged, and the average normalised again before the cosine.

How NegBench reads a video (m1k2zoo/negbench ``benchmarks/src/training/video_utils/``): ``video_dataset.py``
``BaseCsvVideoDataset`` decodes the file named in the CSV (``filepath`` for retrieval, ``image_path`` for MCQ)
with decord (``video_reader.py``; an image path is read as a one-frame video), takes the frames that
``frame_sampler.py`` ``UniformFrameSampler(max_frames=4)`` picks (the middle of 4 equal intervals of
[0, n − 1]); ``model.py`` ``VideoCLIP.encode_video`` normalises each frame's features and averages them; the
MCQ and retrieval code normalise that average. It does not read pre-extracted frames.

Here a video is read from frames extracted beforehand as image files (decoding is left to the user's tool:
``ffmpeg -i video7010.mp4 video7010/%05d.jpg``). For a CSV path ``videos/video7010.mp4`` the frames are the
image files in ``videos/video7010/`` (beside the video, named by its stem), or in ``<frames_dir>/video7010/``
when the manifest's ``video: {frames_dir: ...}`` names a folder; a path that is itself a folder is that folder;
a path to an image is a one-frame video (as NegBench reads it). Frames are ordered by name (numbers in names
compared as numbers); a folder of more than 4 frames (all frames, or frames at a fixed rate) gives the 4 that
``UniformFrameSampler`` picks among them; a folder of 4 or fewer is taken whole (the frames already sampled).
Frames decoded by decord and frames re-read from JPEG files differ by the JPEG round trip.
"""
from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from negft.probes.base import Dataset, EvalContext
from negft.probes.released import section

N_FRAMES = 4
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")   # torchvision's


def spec(dataset: Dataset) -> dict | None:
    """The manifest's ``video`` section ({frames: 4, frames_dir: ""}), or None for an image dataset."""
    value = section(dataset, "video")
    if value is None:
        return None
    return {"frames": N_FRAMES, "frames_dir": "", **(value if isinstance(value, dict) else {})}


def uniform_indices(n: int, max_frames: int = N_FRAMES) -> list[int]:
    """NegBench's ``UniformFrameSampler`` over frames 0..n−1: the rounded middle of each of ``max_frames``
    equal intervals (computed in torch as the reference computes it: int linspace, round half to even)."""
    num = min(max_frames, n)
    ticks = torch.linspace(start=0, end=n - 1, steps=num + 1, dtype=torch.int)
    return [int(torch.round((a + b) / 2).to(torch.int)) for a, b in zip(ticks[:-1], ticks[1:])]


def _natural(name: str) -> list:
    return [int(s) if s.isdigit() else s for s in re.split(r"(\d+)", name.lower())]


def frames(path: str, video: dict, root: Path) -> list[str] | None:
    """The frame files standing for the video at ``path`` (resolved), or None when there are none."""
    p = Path(path)
    if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS:
        return [path]
    if p.is_dir():
        folder = p
    elif video.get("frames_dir"):
        folder = Path(root) / video["frames_dir"] / p.stem
    else:
        folder = p.with_suffix("")
    if not folder.is_dir():
        return None
    found = sorted((e.name for e in os.scandir(folder) if e.is_file()
                    and os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS), key=_natural)
    if not found:
        return None
    n = int(video.get("frames") or N_FRAMES)
    picked = found if len(found) <= n else [found[i] for i in uniform_indices(len(found), n)]
    return [str(folder / f) for f in picked]


def encode(ctx: EvalContext, items: list[list[str]]) -> torch.Tensor:
    """(N, D) features of ``items`` (each a list of frame paths): the normalised mean of the frames' normalised
    features. Each frame is encoded once per context (the image cache)."""
    flat = [f for frame_list in items for f in frame_list]
    feats = ctx.encode_images(flat)
    sizes = [len(frame_list) for frame_list in items]
    return F.normalize(torch.stack([chunk.mean(0) for chunk in feats.split(sizes)]), dim=-1)


def locate(dataset: Dataset, paths: list[str]) -> list[list[str] | str]:
    """Per CSV path: the files to encode (the image, or a video's frames), or why the row cannot be scored. An
    image's presence is checked when it is encoded (``encode_rows``), a video's frames here."""
    from negft.probes.base import resolve
    video = spec(dataset)
    out: list[list[str] | str] = []
    for raw in paths:
        if not isinstance(raw, str) or not raw.strip():
            out.append("no image path")
        elif video is None:
            out.append([resolve(dataset.root, raw)])
        else:
            found = frames(resolve(dataset.root, raw), video, dataset.root)
            out.append(found if found else "no frames found for the video")
    return out


def encode_visual(ctx: EvalContext, dataset: Dataset, items: list[list[str]]) -> torch.Tensor:
    """Image features of an image dataset's rows, or the frame-averaged features of a video dataset's."""
    if spec(dataset) is None:
        return ctx.encode_images([item[0] for item in items])
    return encode(ctx, items)


def _unreadable(path: str) -> str | None:
    if not os.path.isfile(path):
        return "image file not found"
    try:
        from PIL import Image
        with Image.open(path) as im:
            im.verify()
    except Exception:          # noqa: BLE001 (PIL raises many kinds for a bad file)
        return "image file unreadable"
    return None


def encode_rows(ctx: EvalContext, dataset: Dataset,
                items: list[list[str]]) -> tuple[torch.Tensor | None, list[bool], Counter]:
    """``encode_visual`` of the rows whose files can all be read: (features of the kept rows, None when none is;
    which rows are kept; reason -> rows left out). Files are checked only when encoding fails, so a set whose
    files are all there costs no extra reads."""
    try:
        return encode_visual(ctx, dataset, items), [True] * len(items), Counter()
    except OSError:            # FileNotFoundError, PIL's UnidentifiedImageError, a truncated file
        pass
    keep, skipped = [], Counter()
    for item in items:
        why = next((w for w in map(_unreadable, item) if w), None)
        keep.append(why is None)
        if why:
            skipped[why] += 1
    kept = [i for i, k in zip(items, keep) if k]
    return (encode_visual(ctx, dataset, kept) if kept else None), keep, skipped


def scorable(ctx: EvalContext, dataset: Dataset, data: dict, result, prefix: str, what: str):
    """(image features, rows) of a loaded NegBench file (``data``: path, why, rows, skipped, total) whose
    visuals could be read, with every left-out row reported; None (and ``result.skipped[prefix]``) when there
    is nothing to score. ``what`` names a row in that message ("question", "row")."""
    from negft.probes.released import report_skips
    if data["why"]:
        result.skipped[prefix] = data["why"]
        return None
    images, keep, unreadable = encode_rows(ctx, dataset, [r["visual"] for r in data["rows"]])
    data["skipped"].update(unreadable)
    report_skips(result, prefix, data["path"], data["skipped"], data["total"])
    rows = [r for r, k in zip(data["rows"], keep) if k]
    if not rows:
        result.skipped[prefix] = f"no {what} to score in {data['path']}"
        return None
    return images, rows
