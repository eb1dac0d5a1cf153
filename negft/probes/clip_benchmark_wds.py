"""CLIP_benchmark's webdataset layout: the zero-shot classification and retrieval suite (the datasets DataComp
evaluates) as LAION-AI/CLIP_benchmark hosts it, one folder per dataset, read for the ``zeroshot`` probe.

Layout (LAION-AI/CLIP_benchmark @ 48de38c, ``clip_benchmark/datasets/builder.py`` ``build_wds_dataset``, and
``webdataset_builder.py``, which writes it; the Hugging Face repositories ``clip-benchmark/wds_<name>``)::

    <dataset>/classnames.txt                          one class name per line (line i = class i), stripped
    <dataset>/zeroshot_classification_templates.txt   one template per line, ``{c}`` = the class name, stripped
    <dataset>/dataset_type.txt                        optional: ``retrieval`` | ``multilabel``; else classification
    <dataset>/<split>/nshards.txt                     the number of shards
    <dataset>/<split>/0.tar ... <n-1>.tar             webdataset shards

A sample is the tar members sharing a key (the name up to the first dot of the file name, webdataset's
``base_plus_ext``; extensions lower-cased); its image is the first of ``webp``, ``png``, ``jpg``, ``jpeg`` it has
(webdataset's ``to_tuple`` with that list), converted to RGB; a classification sample's label is ``cls`` (an
int, webdataset's ``int(data)``); a retrieval sample's captions are ``txt`` split into lines (``str.splitlines``: an
empty ``txt`` is an image with no caption, an empty line an empty caption, both kept as CLIP_benchmark keeps them).
Members webdataset passes over are passed over here too (not regular files, ``__...__`` names, names without a dot).

Where CLIP_benchmark stops with an exception (a sample without an image or label, a label that is no int, a
duplicate extension within a sample), this reader skips the sample and counts it; a missing shard, missing class
names or templates, or a template with a field other than ``{c}`` skips the dataset, naming the file. A
``multilabel`` dataset (mean average precision over ``npy`` labels) is not read: skipped, said so.

A data root holds such folders under one directory (``negft/data_manifests/clip_benchmark_wds.yaml``: its
``root`` and ``split``), each named as CLIP_benchmark's repositories name them, ``wds_<name>`` (``wds_cars``,
``wds_vtab-cifar10``, ``wds_flickr30k``), or by its plain name; the metric keys use the name without ``wds_``,
lower-cased, every character other than a-z, 0-9 and ``_`` made ``_`` (``vtab_cifar10``).
"""
from __future__ import annotations

import io
import os
import re
import string
import tarfile
from collections import Counter
from pathlib import Path

from PIL import Image

from negft.probes.base import OPENERS, Dataset, missing

LAYOUT = "clip_benchmark_wds"
MANIFEST = "clip_benchmark_wds"
ABSENT = "clip_benchmark_wds"                   # the name of ``absent``'s stand-in dataset
CLASSNAMES = "classnames.txt"
TEMPLATES = "zeroshot_classification_templates.txt"
TYPE_FILE = "dataset_type.txt"
NSHARDS = "nshards.txt"
IMAGE_KEYS = ("webp", "png", "jpg", "jpeg")     # build_wds_dataset's to_tuple order
MEMBER = "#wds="                                # an image key "<shard>#wds=<offset>:<size>": bytes of a tar member
_KEY = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")   # webdataset's base_plus_ext
_META = re.compile(r"__[^/]*__($|/)")               # webdataset's skip_meta


def open_member(key: str) -> Image.Image:
    """The RGB image stored in a shard at the offset and size the key names."""
    path, _, where = key.partition(MEMBER)
    offset, size = (int(v) for v in where.split(":"))
    with open(path, "rb") as f:
        f.seek(offset)
        data = f.read(size)
    image = Image.open(io.BytesIO(data))
    image.load()
    return image.convert("RGB")


OPENERS[MEMBER] = open_member


def dataset_name(folder: str) -> str:
    """The metric-key name of a dataset folder: ``wds_vtab-cifar10`` -> ``vtab_cifar10``."""
    name = folder[4:] if folder.startswith("wds_") else folder
    return re.sub(r"[^a-z0-9_]", "_", name.lower())


def discover(root: Path, manifest: str, man: dict, taken: set) -> list[Dataset]:
    """One ``Dataset`` per folder under ``root`` with ``<split>/nshards.txt``, in name order; a name another dataset
    already has (``taken``) gets ``wds_`` in front."""
    split = str(man.get("split") or "test")
    if not root.is_dir():
        return []
    found = []
    for entry in sorted(os.scandir(root), key=lambda e: e.name):
        if entry.is_dir() and (Path(entry.path) / split / NSHARDS).is_file():
            name = dataset_name(entry.name)
            if name in taken:
                name = "wds_" + name
            taken.add(name)
            found.append(Dataset(name, Path(entry.path), manifest, tuple(man.get("probes") or ("zeroshot",))))
    return found


def absent(root: Path, manifest: str, man: dict) -> Dataset:
    """The stand-in of a collection with no dataset folder under ``root``: its probes skip it, naming the path."""
    return Dataset(ABSENT, Path(root), manifest, tuple(man.get("probes") or ("zeroshot",)))


def _lines(path: Path) -> list[str]:
    """CLIP_benchmark's ``[line.strip() for line in read_txt(f).splitlines()]``: every line, empty ones kept."""
    return [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]


def _bad_template(template: str) -> bool:
    """Whether ``template.format(c=...)`` would read anything but ``{c}`` (an index, an attribute, another name)."""
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError:
        return True
    return any(f != "c" for f in fields)


def _members(shard: Path) -> list[tuple[str, str, int, int]]:
    """(key, extension, offset, size) of the regular members webdataset reads, in tar order."""
    out = []
    with tarfile.open(shard) as tf:
        for m in tf:
            if not m.isreg() or (("/" not in m.name) and m.name.startswith("__") and m.name.endswith("__")) \
                    or _META.match(m.name):
                continue
            match = _KEY.match(m.name)
            if match:
                out.append((match.group(1), match.group(2).lower(), m.offset_data, m.size))
    return out


def _read_bytes(shard: Path, offset: int, size: int) -> bytes:
    with open(shard, "rb") as f:
        f.seek(offset)
        return f.read(size)


def _samples(shard: Path) -> tuple[list[dict], Counter]:
    """The shard's samples ({extension: (offset, size)}, grouped as webdataset groups consecutive members) and
    the members that broke a sample (a duplicate extension), by reason."""
    samples, bad = [], set()
    current: dict | None = None
    for key, ext, offset, size in _members(shard):
        if current is None or current["__key__"] != key:
            current = {"__key__": key}
            samples.append(current)
        if ext in current:
            bad.add(len(samples) - 1)
        current[ext] = (offset, size)
    skipped = Counter({"a file name twice in one sample (webdataset raises)": len(bad)} if bad else {})
    return [s for i, s in enumerate(samples) if i not in bad], skipped


_CACHE: dict[str, tuple] = {}


def load(dataset: Dataset, split: str = "test") -> dict:
    """{why, kind (classification | retrieval), classes, prompts, images (image keys), labels (ints, may lie outside
    the classes) or captions (a list per image), skipped (reason -> count), total}; parsed once per version of the
    dataset's files."""
    root = Path(dataset.root)
    files = [root / CLASSNAMES, root / TEMPLATES, root / TYPE_FILE, root / split / NSHARDS]
    stamp = tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) if f.exists() else (str(f),) for f in files)
    out = {"why": "", "kind": "classification", "classes": None, "prompts": [], "images": [], "labels": [],
           "captions": [], "skipped": Counter(), "total": 0, "where": root / split}
    nshards_file = root / split / NSHARDS
    if not nshards_file.is_file():
        out["why"] = missing(dataset, root / "<dataset>" / split / NSHARDS if dataset.name == ABSENT else nshards_file)
        return out
    try:
        nshards = int(nshards_file.read_text(encoding="utf-8"))
    except ValueError:
        out["why"] = (f"{nshards_file}: {nshards_file.read_text(encoding='utf-8')[:40]!r} is not a number of shards "
                      "(write the count of <split>/N.tar files in it)")
        return out
    shards = [root / split / f"{i}.tar" for i in range(nshards)]
    absent = [str(s) for s in shards if not s.is_file()]
    if absent:
        out["why"] = (f"{len(absent)} of {nshards} shards named by {nshards_file} not found: "
                      f"{', '.join(absent[:3])}{' ...' if len(absent) > 3 else ''}")
        return out
    stamp += tuple((str(s), s.stat().st_mtime_ns, s.stat().st_size) for s in shards)
    key = str(root) + "|" + split
    if key in _CACHE and _CACHE[key][0] == stamp:
        return _CACHE[key][1]
    kind = (root / TYPE_FILE).read_text(encoding="utf-8").strip().lower() if (root / TYPE_FILE).exists() else ""
    if kind == "multilabel":
        out["why"] = (f"{root / TYPE_FILE} says multilabel: CLIP_benchmark scores it by mean average precision over "
                      "npy labels, which negft does not read")
        return out
    out["kind"] = "retrieval" if kind == "retrieval" else "classification"
    if out["kind"] == "classification" and not _metadata(out, root):
        return out
    for shard in shards:
        samples, broken = _samples(shard)
        out["skipped"].update(broken)
        out["total"] += len(samples) + sum(broken.values())
        for s in samples:
            _take(out, shard, s)
    _CACHE[key] = (stamp, out)
    return out


def _metadata(out: dict, root: Path) -> bool:
    """Class names and prompts (``template.format(c=name)``, class by class), or False with ``why`` set."""
    for f in (CLASSNAMES, TEMPLATES):
        if not (root / f).is_file():
            out["why"] = f"data not found: {root / f} (CLIP_benchmark's classification datasets ship it)"
            return False
    classes, templates = _lines(root / CLASSNAMES), _lines(root / TEMPLATES)
    bad = [t for t in templates if _bad_template(t)]
    if bad or not templates or not classes:
        out["why"] = (f"{root / TEMPLATES}: a template may hold no field but {{c}} (bad: {bad[:3]})" if bad else
                      f"{root / (TEMPLATES if not templates else CLASSNAMES)} is empty")
        return False
    out["classes"] = classes
    out["prompts"] = [t.format(c=c) for c in classes for t in templates]
    return True


def _take(out: dict, shard: Path, sample: dict) -> None:
    """Add one sample's image and label (or captions), or count why it is skipped."""
    image = next((sample[k] for k in IMAGE_KEYS if k in sample), None)
    field = "txt" if out["kind"] == "retrieval" else "cls"
    if image is None:
        out["skipped"][f"no {'/'.join(IMAGE_KEYS)} image (CLIP_benchmark raises)"] += 1
        return
    if field not in sample:
        out["skipped"][f"no {field} (CLIP_benchmark raises)"] += 1
        return
    raw = _read_bytes(shard, *sample[field])
    if field == "cls":
        try:
            label = int(raw)
        except ValueError:
            out["skipped"]["cls is not an integer (CLIP_benchmark raises)"] += 1
            return
        out["labels"].append(label)
    else:
        try:
            out["captions"].append(raw.decode("utf-8").splitlines())
        except UnicodeDecodeError:
            out["skipped"]["txt is not UTF-8 (CLIP_benchmark raises)"] += 1
            return
    out["images"].append(f"{shard}{MEMBER}{image[0]}:{image[1]}")


def texts(dataset: Dataset, split: str = "test") -> list[str]:
    """The texts the probe encodes: the prompts of a classification dataset, the captions of a retrieval one."""
    data = load(dataset, split)
    return data["prompts"] if data["kind"] == "classification" else [c for cs in data["captions"] for c in cs]
