"""What every probe gets (an ``EvalContext``) and gives back (a ``ProbeResult``)."""
from __future__ import annotations

import csv
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from negft.models import encode_text_trimmed
from negft.probes.stats import bootstrap_ci


@dataclass
class Dataset:
    """A probe dataset: short name for metric keys, folder with its files, manifest for the error, and the
    probes it serves (its manifest's ``probes``; None: every probe, as the world's split does)."""
    name: str
    root: Path
    manifest: str = ""
    probes: tuple | None = None


@dataclass
class ProbeResult:
    metrics: dict = field(default_factory=dict)
    ci95: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)
    records: dict = field(default_factory=dict)   # metric prefix -> list of per-example dicts
    values: dict = field(default_factory=dict)    # metric -> per-example values (paired tests)

    def add(self, key: str, per_example, n_boot: int, seed: int = 0):
        """Record the mean of ``per_example`` under ``key`` with its bootstrap interval."""
        values = np.asarray(per_example, dtype=np.float64)
        self.values[key] = values
        self.metrics[key] = float(values.mean()) if values.size else float("nan")
        self.ci95[key] = list(bootstrap_ci(values, n_boot, seed))

    def add_rules(self, key: str, credits: tuple, n_boot: int):
        """``key`` from negft's per-example credits and ``key_official`` from the reference's, given as a pair."""
        tie_aware, official = credits
        self.add(key, tie_aware, n_boot)
        self.add(f"{key}_official", official, n_boot)

    def update(self, other: "ProbeResult"):
        for name in ("metrics", "ci95", "skipped", "records", "values"):
            getattr(self, name).update(getattr(other, name))


CROP = "#crop="       # an image key "<path>#crop=x0,y0,x1,y1": the image cropped to that box (ARO, SNARE)
FRAME = "#frame="     # an image key "<video path>#frame=i": the video's frame i, decoded by negft.probes.video


def crop_key(path: str, box) -> str:
    return f"{path}{CROP}" + ",".join(f"{v:g}" for v in box)


OPENERS: dict = {}     # a marker in an image key -> the function that opens such keys (FRAME: negft.probes.video)
SUFFIX_OPENERS: dict = {}  # a file suffix (lower case) -> the function that opens such files (.npy: probes.eqben)


def open_image(key: str) -> Image.Image:
    """The RGB image an image key names: a path, a path with a crop box (PIL's crop, as ARO crops), or a key with a
    marker in ``OPENERS`` (a video's frame, ``FRAME``) or a file with a suffix in ``SUFFIX_OPENERS`` (EqBen's
    ``.npy`` frames), opened by the module that registered it."""
    for marker, opener in OPENERS.items():
        if marker in key:
            return opener(key)
    path, _, box = key.partition(CROP)
    opener = SUFFIX_OPENERS.get(os.path.splitext(path)[1].lower())
    if opener is not None:
        image = opener(path)
        return image.crop(tuple(float(v) for v in box.split(","))) if box else image
    image = Image.open(path).convert("RGB")
    return image.crop(tuple(float(v) for v in box.split(","))) if box else image


class PixelCache(dict):
    """Preprocessed probe images (path -> tensor) kept across evaluations, up to ``budget`` bytes: decoding and
    resizing cost as much as the tiny world model's image tower; a large real probe set simply stops filling it."""

    def __init__(self, budget: int = 1 << 30):
        super().__init__()
        self.budget, self.bytes = budget, 0


class EvalContext:
    """The model under test, with per-evaluation caches of encoded images and texts."""

    def __init__(self, model, preprocess, tokenizer, device, batch_size: int = 256, n_boot: int = 1000,
                 datasets: list[Dataset] | None = None, progress: bool = False,
                 image_cache: dict | None = None, text_cache: dict | None = None, token_cache: dict | None = None,
                 pixel_cache: "PixelCache | None" = None):
        """``image_cache`` / ``text_cache`` may be shared between contexts whose tower is the same
        (a patching sweep that moves only the other tower); ``token_cache`` and ``pixel_cache`` between any
        contexts with the same tokenizer and transform (every evaluation of a run)."""
        self.model, self.preprocess, self.tokenizer = model, preprocess, tokenizer
        self.device, self.batch_size, self.n_boot = device, batch_size, n_boot
        self.datasets = datasets or []
        self.progress = progress
        self._images: dict[str, torch.Tensor] = {} if image_cache is None else image_cache
        self._pictures: dict[str, torch.Tensor] = {}        # encode_images: features by picture (``_picture``)
        self._texts: dict[str, torch.Tensor] = {} if text_cache is None else text_cache
        self._tokens: dict[str, torch.Tensor] = {} if token_cache is None else token_cache
        self._pixel_cache = PixelCache(0) if pixel_cache is None else pixel_cache

    @property
    def logit_scale(self) -> float:
        """The model's learned temperature (exp of ``logit_scale``, a tensor or number, as open_clip and Hugging
        Face keep it), CLIP's 100 for a model without one (a wrapper of another library's model)."""
        scale = getattr(self.model, "logit_scale", None)
        if scale is None:
            return 100.0
        return float(torch.as_tensor(scale).exp().reshape(-1)[0])

    @property
    def dtype(self) -> torch.dtype:
        """The dtype images are fed in: the model's first floating-point weights' (a wrapper may hold integer
        buffers first, or no torch weights at all: float32)."""
        params = self.model.parameters() if isinstance(self.model, torch.nn.Module) else iter(())
        return next((p.dtype for p in params if p.is_floating_point()), torch.float32)

    def _pixels(self, path: str) -> torch.Tensor:
        """The preprocessed image, kept in ``pixel_cache`` while it stays under its byte budget."""
        if path in self._pixel_cache:
            return self._pixel_cache[path]
        x = self.preprocess(open_image(path))
        if self._pixel_cache.bytes + x.numel() * x.element_size() <= self._pixel_cache.budget:
            self._pixel_cache[path] = x
            self._pixel_cache.bytes += x.numel() * x.element_size()
        return x

    @torch.no_grad()
    def encode_images(self, paths: list[str]) -> torch.Tensor:
        """L2-normalised image features (N, D), each path encoded once per context, and each picture once: a file
        with the bytes of one encoded before (a benchmark's copy of an image another benchmark also ships, a
        link) takes its features."""
        todo: dict[str, list[str]] = {}            # a picture (``_picture``) -> the paths of it to encode
        for p in dict.fromkeys(p for p in paths if p not in self._images):
            todo.setdefault(self._picture(p), []).append(p)
        new = [k for k in todo if k not in self._pictures]
        for i in range(0, len(new), self.batch_size):
            chunk = new[i:i + self.batch_size]
            x = torch.stack([self._pixels(todo[k][0]) for k in chunk])
            feats = F.normalize(self.model.encode_image(x.to(self.device, self.dtype)).float(), dim=-1).cpu()
            self._pictures.update(zip(chunk, feats))
        self._images.update((p, self._pictures[k]) for k, same in todo.items() for p in same)
        return torch.stack([self._images[p] for p in paths])

    @staticmethod
    def _picture(key: str) -> str:
        """What decides an image key's pixels: its file's bytes and its crop box; a key another module opens (a
        video's frame) or a file that cannot be read stands for itself (opening it raises the error)."""
        if any(marker in key for marker in OPENERS):
            return key
        path, _, box = key.partition(CROP)
        try:
            data = Path(path).read_bytes()
        except OSError:
            return key
        return hashlib.blake2b(data, digest_size=16).hexdigest() + CROP + box

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> torch.Tensor:
        """L2-normalised text features (N, D), each distinct text encoded once per context; texts are
        batched by length and each batch trimmed to its longest text (``encode_text_trimmed``)."""
        todo = list(dict.fromkeys(t for t in texts if t not in self._texts))
        if todo:
            new = [t for t in todo if t not in self._tokens]
            if new:
                self._tokens.update(zip(new, self.tokenizer(new)))
            all_tokens = torch.stack([self._tokens[t] for t in todo])
            order = torch.argsort(all_tokens.argmax(-1), stable=True).tolist()   # EOT position: the length
            todo = [todo[i] for i in order]
            all_tokens = all_tokens[order]
        for i in range(0, len(todo), self.batch_size):
            chunk = todo[i:i + self.batch_size]
            tokens = all_tokens[i:i + self.batch_size].to(self.device)
            feats = F.normalize(encode_text_trimmed(self.model, tokens).float(), dim=-1).cpu()
            self._texts.update(zip(chunk, feats))
        return torch.stack([self._texts[t] for t in texts])


_PARSED: dict[tuple, tuple] = {}


def parse_once(path, parse) -> tuple:
    """``tuple(parse(path))`` once per file version (path, inode, size, mtime) in this process: every evaluation
    of a run, and every α of a patching sweep, reads the same probe files. The rows are shared: treat them as
    read-only."""
    st = os.stat(path)
    key = (os.fspath(path), parse, st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _PARSED:
        for old in [k for k in _PARSED if k[:2] == key[:2]]:
            del _PARSED[old]
        _PARSED[key] = tuple(parse(path))
    return _PARSED[key]


def _csv_rows(path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_csv(path: Path) -> tuple[dict, ...]:
    """The rows of a probe CSV (read-only, shared between evaluations)."""
    return parse_once(path, _csv_rows)


def csv_texts(filename: str, texts_of_rows):
    """A probe's ``texts`` declaration (see ``negft.probes``) for a probe that reads the CSV ``filename``:
    ``texts_of_rows(rows)``, or none when the dataset has no such file."""
    def texts(dataset: Dataset) -> list[str]:
        path = dataset.root / filename
        return texts_of_rows(read_csv(path)) if path.exists() else []
    return texts


def resolve(root, path: str) -> str:
    """An image path from a probe file as the string the image cache is keyed by: absolute paths as they are,
    others under the dataset's ``root``."""
    return path if os.path.isabs(path) else os.path.join(root, path)


def missing(dataset: Dataset, path: Path) -> str:
    """The one wording of an absent input: the path looked for, and the manifest that says what belongs there."""
    from negft.data import manifests
    hint = f" (see {manifests.shown(dataset.manifest)})" if dataset.manifest else ""
    return f"data not found: {path}{hint}"


class DataNotFound(Exception):
    """A probe's whole input is absent: the registry (``negft.probes.register``) skips the probe for the
    dataset with this message. An input that only some of a probe's tasks read is skipped by the probe, per
    task, with the same wording (``missing``)."""

    def __init__(self, dataset: Dataset, path: Path, note: str = ""):
        super().__init__(missing(dataset, path) + note)


def require(dataset: Dataset, path: Path) -> Path:
    """``path``, or ``DataNotFound`` when it is absent."""
    if not Path(path).exists():
        raise DataNotFound(dataset, path)
    return path
