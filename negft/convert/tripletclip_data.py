"""TripletCLIP's training data (TripletData's high-quality subset) → relcomp shards for ``recipe=tripletclip``.

    negft data convert tripletclip-data FOLDER out=DIR [maxcount=1000] [progress=true]

Released layout (tripletclip/TripletCLIP @ abbf81c: ``src/openclip/src/data.py`` ``TripletClipData``, which
``src/openclip/src/main.py`` trains on; ``src/openclip/README.md``, ``scripts/sample_train.sh``). The data is on
Hugging Face (the README's "Data" link: the TripletCLIP organisation), not in the repository, so the layout is the
loader's: ``FOLDER`` (``--data_dir``) holds webdataset tars ``shard-<n>.tar`` (the loader opens
``shard-{0..750}.tar``); each sample is four members sharing a key (webdataset's rule: the member name up to the
first dot of its file name), decoded by extension:

    <key>.image        the image (bytes PIL opens)            -> the sample's image
    <key>.caption      its caption (UTF-8 text)               -> T
    <key>.neg_image    the image generated from the hard caption -> I⁻
    <key>.neg_caption  the hard caption (UTF-8 text)          -> T⁻

``tripletclip_loss`` is NegCLIP's loss on (I, T, T⁻) plus NegCLIP's on (I⁻, T⁻, T). ``--negtype`` (default
``llm``) is passed to ``get_dataloader`` and never read: every run reads these four members.

One sample per usable released sample, in shard order, keyed by the released key, both images' bytes unchanged
(the negative image as ``neg.jpg`` / ``neg.png``), as ``losses.TripletCLIP`` reads them:

    caption      T (whitespace collapsed, as CLIP's tokenizer does)
    relcomp      {caption: T, negatives: [{text: T⁻, kind: "negative"}], negative_image: "generated",
                 negative_image_caption: T⁻ (I⁻ was generated from it), negative_image_negatives: [T] (the true
                 caption is I⁻'s hard caption in the second term)}
    tripletclip  {shard, key}: where it was read

Skipped and counted in ``manifest.json``, by reason: a sample without its image or negative image, an image that
is corrupt or not jpg/png (each for either image), a caption or hard caption missing, empty or not UTF-8 (the
loader drops a sample whose member does not decode or is missing, ``wds.ignore_and_continue``), and a shard that
cannot be read (once per shard; the samples read before the damage are kept).

``negft.world.formats.tripletclip_data.write`` writes a small example of these shards from the world, bad samples
planted.
"""
from __future__ import annotations

import re
import tarfile
from pathlib import Path

from negft.convert.coco import clean_caption
from negft.convert.negbench import CORRUPT_IMAGE, UNSUPPORTED_IMAGE, BadRow, image_format
from negft.data.schema import CAPTION, RELCOMP
from negft.data.shards import MISSING_IMAGE, ShardWriter, truthy

LAYOUT_SOURCE = ("tripletclip/TripletCLIP @ abbf81c: src/openclip/src/data.py (TripletClipData: wds.WebDataset("
                 "data_dir/shard-{0..750}.tar, handler=ignore_and_continue).decode(.image, .neg_image: PIL; "
                 ".caption, .neg_caption: UTF-8).to_tuple(image, caption, neg_image, neg_caption, __key__)), "
                 "src/openclip/src/main.py and train.py (batches image, neg_image, caption, neg_caption), "
                 "src/openclip/src/loss.py (tripletclip_loss), src/openclip/src/parse_args.py (--negtype, unread)")
SHARD = re.compile(r"shard-(\d+)\.tar")        # the loader's shard names
MEMBER = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")     # webdataset's key.extension split
IMAGE, CAPTION_MEMBER, NEG_IMAGE, NEG_CAPTION = "image", "caption", "neg_image", "neg_caption"
NEGATIVE = "negative"           # the kind of the hard caption
GENERATED = "generated"         # the kind of the negative image

# skip reasons (manifest.json's "skipped"), besides negbench's CORRUPT_IMAGE / UNSUPPORTED_IMAGE for the image
MISSING_NEG_IMAGE = "missing negative image"
NEG_IMAGE_REASONS = {CORRUPT_IMAGE: "corrupt negative image", UNSUPPORTED_IMAGE: "negative image not jpg/png"}
NO_CAPTION = "caption missing, empty or not UTF-8"
NO_NEG_CAPTION = "hard caption missing, empty or not UTF-8"
UNREADABLE_SHARD = "unreadable shard"


def shard_paths(folder: Path) -> list[Path]:
    """The folder's ``shard-<n>.tar`` files by n; FileNotFoundError when it has none."""
    found = sorted((int(m.group(1)), p) for p in folder.iterdir() if (m := SHARD.fullmatch(p.name)))
    if not found:
        raise FileNotFoundError(f"{folder} holds no shard-<n>.tar (TripletCLIP's loader reads "
                                f"<data_dir>/shard-{{0..750}}.tar)")
    return [p for _, p in found]


def read_shard(path: Path, writer: ShardWriter):
    """(key, {extension: bytes}) of a tar's samples, grouped as webdataset groups them: consecutive members with
    the same key; a shard that cannot be read (from where it breaks) is one counted skip."""
    key, sample = None, {}
    try:
        with tarfile.open(path) as tf:
            for member in tf:
                parts = MEMBER.match(member.name) if member.isfile() else None
                if parts is None:
                    continue
                if parts.group(1) != key and sample:
                    yield key, sample
                    sample = {}
                key = parts.group(1)
                sample[parts.group(2).lower()] = tf.extractfile(member).read()
    except (tarfile.TarError, OSError, EOFError) as e:
        writer.skip(UNREADABLE_SHARD, f"{path.name} ({type(e).__name__}: {e})")
    if sample:
        yield key, sample


def _text(data: bytes | None) -> str:
    """A text member as the loader decodes it (UTF-8), whitespace collapsed; "" when it cannot be used."""
    try:
        return clean_caption(data.decode("utf-8")) if data is not None else ""
    except UnicodeDecodeError:
        return ""


def _image(data: bytes | None, missing: str, reasons: dict | None = None) -> str:
    """The member extension (jpg/png) of an image member; BadRow with the reason it cannot be used."""
    if data is None:
        raise BadRow(missing)
    try:
        return image_format(data)
    except BadRow as e:
        raise BadRow((reasons or {}).get(e.args[0], e.args[0])) from None


def record(caption: str, hard: str, shard: str, key: str) -> dict:
    """The sample's json: T, T⁻ and I⁻'s captions as TripletCLIP's loss reads them."""
    return {
        CAPTION: caption,
        RELCOMP: {"caption": caption, "negatives": [{"text": hard, "kind": NEGATIVE}], "negative_image": GENERATED,
                  "negative_image_caption": hard, "negative_image_negatives": [caption]},
        "tripletclip": {"shard": shard, "key": key},
    }


def _sample(sample: dict) -> tuple[str, str, str, str]:
    """(caption, hard caption, image extension, negative image extension); BadRow with the first reason it fails."""
    caption, hard = _text(sample.get(CAPTION_MEMBER)), _text(sample.get(NEG_CAPTION))
    ext = _image(sample.get(IMAGE), MISSING_IMAGE)
    neg_ext = _image(sample.get(NEG_IMAGE), MISSING_NEG_IMAGE, NEG_IMAGE_REASONS)
    if not caption:
        raise BadRow(NO_CAPTION)
    if not hard:
        raise BadRow(NO_NEG_CAPTION)
    return caption, hard, ext, neg_ext


def convert(folder, out, maxcount="1000", progress="true") -> dict:
    """TripletCLIP's webdataset shards (``folder``: its ``shard-<n>.tar`` files, the loader's ``--data_dir``) →
    ``out/shard-*.tar`` + ``manifest.json``. See the module docstring."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"TripletCLIP data folder {folder} not found")
    paths = shard_paths(folder)
    with ShardWriter(out, "tripletclip-data", LAYOUT_SOURCE, {"folder": str(folder)}, maxcount=int(maxcount),
                     progress=truthy(progress)) as writer:
        for path in paths:
            for key, sample in read_shard(path, writer):
                try:
                    caption, hard, ext, neg_ext = _sample(sample)
                except BadRow as e:
                    writer.skip(e.args[0], f"{path.name}:{key}")
                    continue
                writer.add(key, sample[IMAGE], ext, record(caption, hard, path.name, key),
                           {f"neg.{neg_ext}": sample[NEG_IMAGE]})
        writer.notes["released_shards"] = len(paths)
        manifest = writer.close()
    return {**manifest, "out": str(out)}
