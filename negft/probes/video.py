"""Videos as NegBench scores them (MSR-VTT retrieval and MCQ): 4 uniformly sampled frames, each encoded by the
image tower and L2-normalised, averaged, and the average normalised again before the cosine.

How NegBench reads a video (m1k2zoo/negbench ``benchmarks/src/training/video_utils/``): ``video_dataset.py``
``BaseCsvVideoDataset`` opens the file named in the CSV (``filepath`` for retrieval, ``image_path`` for MCQ) with
decord (``video_reader.py`` ``DecordVideoReader``, one thread). decord counts a video's frames as the packets of
its video stream and numbers them in presentation (pts) order (dmlc/decord ``src/video/video_reader.cc``
``IndexKeyframes``, ``GetFrameCount``); ``frame_sampler.py`` ``UniformFrameSampler(max_frames=4)`` picks the
rounded middle of 4 equal intervals of [0, n − 1] (``uniform_indices``); ``get_batch`` returns those frames as
RGB24 arrays. ``open_clip/factory.py`` ``adjust_preprocessing_for_video`` turns them into model input with tensor
transforms (``ConvertImageDtype``, bicubic ``Resize`` with antialiasing, ``CenterCrop``, ``Normalize`` with
OpenAI's mean and std whatever the model); ``model.py`` ``VideoCLIP.encode_video`` normalises each frame's
features and averages them; the MCQ and retrieval code normalise that average. A path the reader cannot use is
not skipped there: an image path goes to an ``AccImageVideoReader`` that the release does not define (a
``NameError``); a file FFmpeg cannot open (garbage, a truncated .mp4) makes decord 0.6.0 raise a ``RuntimeError``
that the reader does not catch; only a ``DECORDError`` is caught, logged, and the video scored as black 256×256
frames.

Here, the source a CSV path stands for (first match wins; a relative path is read under the dataset's root):

1. a folder: the frames extracted into it;
2. an image path (torchvision's image extensions, as ``VideoReader.from_path`` tells them): a one-frame video;
3. a video file that FFmpeg opens and finds frames in: read as released, with PyAV. One demuxing pass counts the
   video stream's packets (kept per file version, nothing decoded), the sampler picks its indices, and one
   sequential decode from the start stops at the last picked frame (frames matched to indices by pts, as decord
   matches them; seeking by frame in FFmpeg is slow). Each picked frame is the image key
   ``<video path>#frame=<i>`` (``base.FRAME``): the image cache encodes it once per evaluation context, and the
   picked frames of a video are decoded together, once (kept for the last few videos opened). On H.264 files
   with B-frames and MPEG-4 Part 2 files of 1 to 450 frames, every frame decoded here equals decord 0.6.0's;
4. frames extracted beforehand (``ffmpeg -i video7010.mp4 video7010/%05d.jpg``): the image files in
   ``videos/video7010/`` for ``videos/video7010.mp4`` (beside the video, named by its stem), or in
   ``<root>/<frames_dir>/video7010/`` when the manifest's ``video: {frames_dir: ...}`` names a folder. Used when
   the video is absent or cannot be decoded. Frames are ordered by name (numbers compared as numbers); a folder of
   more than 4 gives the 4 that ``UniformFrameSampler`` picks among them (the same frames as the video's only when
   every frame was extracted), a folder of 4 or fewer is taken whole (the frames already sampled);
5. otherwise the row is skipped and counted by reason: the video file not found (nor frames extracted from it),
   not decodable by FFmpeg, or without video frames (no video stream, or one without packets).

A relative path cell: NegBench's loader opens it relative to the working directory; here it is read under the
dataset's root, and a row skipped for a file not found says so.

Decoded frames become PIL images and go through the model's own ``preprocess``, as images do. Against NegBench's
tensor transforms this differs in the resize (PIL's bicubic on 8-bit pixels, torch's antialiased bicubic on
floats) and, for a model not normalised with OpenAI's mean and std, in the normalisation. decord turns a video
with a rotation tag upright; frames here are taken as stored. Frames re-read from JPEG files differ from decoded
ones by the JPEG round trip.
"""
from __future__ import annotations

import os
import re
from collections import Counter, OrderedDict
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

from negft.probes.base import FRAME, OPENERS, Dataset, EvalContext, parse_once, resolve
from negft.probes.released import section

N_FRAMES = 4
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")   # torchvision's
KEEP_DECODED = 8          # videos whose picked frames stay decoded: a video's frame keys are encoded one after another


class VideoError(OSError):
    """A video frame that cannot be decoded: an ``OSError``, as a bad image file raises (``encode_rows``)."""


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


def where_relative(root) -> str:
    """What a 'not found' reason adds for a path read under the dataset's root."""
    return f" (relative paths are read under {root}, not the working directory as NegBench's loader reads them)"


# --- a video file, read as released ---------------------------------------------------------------------------

def _index(path: str) -> tuple:
    """(why the video cannot be read or "", its frame count, its frames' pts in presentation order or None when a
    packet has none): decord's count and numbering, from one demuxing pass that decodes nothing."""
    import av
    try:
        with av.open(path) as container:
            if not container.streams.video:
                return "video file has no video frames", 0, None
            stream = container.streams.best("video")
            pts = [p.pts for p in container.demux(stream) if p.size]      # demux ends with an empty flush packet
    except (av.error.FFmpegError, OSError):
        return "video file not decodable by FFmpeg", 0, None
    if not pts:
        return "video file has no video frames", 0, None
    return "", len(pts), (None if None in pts else tuple(sorted(pts)))


def video_index(path: str) -> tuple:
    """``_index`` once per file version in this process (every evaluation lists the same videos)."""
    return parse_once(path, _index)


_SAMPLED: dict[str, tuple[int, ...]] = {}      # video path -> the frames picked from it: decoded together
_DECODED: OrderedDict = OrderedDict()          # (path, size, mtime) -> {index: RGB24 array}, the last videos opened


def _video_frames(path: str, max_frames: int) -> list[str] | str:
    """The frame keys the sampler picks from the video at ``path``, or why it cannot be read."""
    why, n, _ = video_index(path)
    if why:
        return why
    picked = uniform_indices(n, max_frames)
    _SAMPLED[path] = tuple(sorted(set(picked)))
    return [f"{path}{FRAME}{i}" for i in picked]


def decode(path: str, wanted) -> dict:
    """{index: RGB24 array (H, W, 3)} of the frames ``wanted`` (indices as decord numbers them): one sequential
    decode from the start that stops at the last of them."""
    import av
    why, n, order = video_index(path)
    if why:
        raise VideoError(f"{path}: {why}")
    wanted = set(wanted)
    position = None if order is None else {t: i for i, t in enumerate(order)}
    out = {}
    try:
        with av.open(path) as container:
            stream = container.streams.best("video")
            stream.thread_type = "AUTO"                 # frame threads: the same frames, sooner
            for k, frame in enumerate(container.decode(stream)):
                i = k if position is None or frame.pts is None else position.get(frame.pts)
                if i in wanted:
                    out[i] = frame.to_ndarray(format="rgb24")
                    if len(out) == len(wanted):
                        break
    except av.error.FFmpegError as e:
        raise VideoError(f"{path}: {e}") from e
    if wanted - out.keys():
        raise VideoError(f"{path}: frame(s) {sorted(wanted - out.keys())} of {n} not decoded")
    return out


def open_frame(key: str) -> Image.Image:
    """The RGB image a frame key (``<video path>#frame=<i>``) names; the video's picked frames are decoded
    together on the first of them asked for."""
    path, _, index = key.rpartition(FRAME)
    i = int(index)
    st = os.stat(path)
    version = (path, st.st_size, st.st_mtime_ns)
    frames_of = _DECODED.get(version)
    if frames_of is None or i not in frames_of:
        frames_of = decode(path, set(_SAMPLED.get(path, ())) | {i})
        _DECODED[version] = frames_of
        while len(_DECODED) > KEEP_DECODED:
            _DECODED.popitem(last=False)
    _DECODED.move_to_end(version)
    return Image.fromarray(frames_of[i])


OPENERS[FRAME] = open_frame


# --- frames extracted beforehand --------------------------------------------------------------------------------

def _frames_folder(p: Path, video: dict, root: Path) -> Path:
    if video.get("frames_dir"):
        return Path(root) / video["frames_dir"] / p.stem
    return p.with_suffix("")


def _extracted(folder: Path, max_frames: int) -> list[str] | None:
    """The frame files of ``folder`` to encode (all of 4 or fewer; else the sampler's pick), None when none."""
    if not folder.is_dir():
        return None
    found = sorted((e.name for e in os.scandir(folder) if e.is_file()
                    and os.path.splitext(e.name)[1].lower() in IMAGE_EXTENSIONS), key=_natural)
    if not found:
        return None
    picked = found if len(found) <= max_frames else [found[i] for i in uniform_indices(len(found), max_frames)]
    return [str(folder / f) for f in picked]


def frames(path: str, video: dict, root: Path, relative: bool = False) -> list[str] | str:
    """The image keys standing for the video at ``path`` (resolved; ``relative``: the CSV's cell was), or why
    the row cannot be scored: the sources in the module docstring's order."""
    p = Path(path)
    max_frames = int(video.get("frames") or N_FRAMES)
    if p.is_dir():
        return _extracted(p, max_frames) or "no frames found for the video"
    if p.suffix.lower() in IMAGE_EXTENSIONS:
        return [path]                      # its presence is checked when it is encoded, as an image's is
    read = _video_frames(path, max_frames) if p.is_file() else None
    if isinstance(read, list):
        return read
    extracted = _extracted(_frames_folder(p, video, root), max_frames)
    if extracted:
        return extracted
    return read or "video file not found, nor frames extracted from it" + (where_relative(root) if relative else "")


# --- rows of a probe file ---------------------------------------------------------------------------------------

def encode(ctx: EvalContext, items: list[list[str]]) -> torch.Tensor:
    """(N, D) features of ``items`` (each a list of frame keys): the normalised mean of the frames' normalised
    features. Each frame is encoded once per context (the image cache)."""
    flat = [f for frame_list in items for f in frame_list]
    feats = ctx.encode_images(flat)
    sizes = [len(frame_list) for frame_list in items]
    return F.normalize(torch.stack([chunk.mean(0) for chunk in feats.split(sizes)]), dim=-1)


def locate(dataset: Dataset, paths: list[str]) -> list[list[str] | str]:
    """Per CSV path: the image keys to encode (the image, or a video's frames), or why the row cannot be scored.
    An image's presence is checked when it is encoded (``encode_rows``), a video's here."""
    video = spec(dataset)
    out: list[list[str] | str] = []
    for raw in paths:
        if not isinstance(raw, str) or not raw.strip():
            out.append("no image path")
        elif video is None:
            out.append([resolve(dataset.root, raw)])
        else:
            out.append(frames(resolve(dataset.root, raw), video, dataset.root, relative=not os.path.isabs(raw)))
    return out


def encode_visual(ctx: EvalContext, dataset: Dataset, items: list[list[str]]) -> torch.Tensor:
    """Image features of an image dataset's rows, or the frame-averaged features of a video dataset's."""
    if spec(dataset) is None:
        return ctx.encode_images([item[0] for item in items])
    return encode(ctx, items)


def _under(path: str, root) -> bool:
    return os.path.abspath(path).startswith(os.path.join(os.path.abspath(root), ""))


def _unreadable(key: str, root=None) -> str | None:
    """Why the image key cannot be opened, or None. ``root``: the dataset's, under which relative cells are read."""
    if FRAME in key:
        video = key.rpartition(FRAME)[0]
        if not os.path.isfile(video):
            return "video file not found"
        try:
            open_frame(key)
        except OSError:
            return "video frames not decodable by FFmpeg"
        return None
    if not os.path.isfile(key):
        return "image file not found" + (where_relative(root) if root is not None and _under(key, root) else "")
    try:
        with Image.open(key) as im:
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
    except OSError:            # FileNotFoundError, PIL's UnidentifiedImageError, a truncated file, VideoError
        pass
    keep, skipped = [], Counter()
    for item in items:
        why = next((w for w in (_unreadable(key, dataset.root) for key in item) if w), None)
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
