"""``negft data hard-images``: each sample's nearest-neighbour hard-negative image, as NegCLIP builds them, for any
captioned shards.

    negft data hard-images SHARDS out=DIR [model=ViT-B-32] [pretrained=openai] [k=3] [batch=64] [device=cpu]
                           [seed=0]

NegCLIP (Yuksekgonul et al., ICLR 2023, "strong alternative images") gives each COCO image its K = 3 nearest
neighbour images in the same file: its released files (mertyg/vision-language-models-are-bows @ 81fdd20
``temp_data/``; ``valid_neg_clip.tsv`` read whole: 4,839 rows of 4,839 val2014 images) hold in ``neg_image`` three
row numbers of the same file, distinct, never the row itself. Its loader (vinid/open_clip @ e680f8e
``src/training/data.py`` ``CsvDataset``) draws one of the three for each sample each epoch, with that row's caption
and one of its hard captions (the authors, mertyg/vision-language-models-are-bows issue #19: "only one hard negative
image for each example is sampled at runtime"). Neither repository holds the code that found the neighbours, nor
names the model that embedded the images or the order of the three; the default here is the model NegCLIP
fine-tunes (ViT-B-32, openai).

This step finds them for SHARDS (a folder of ``shard-*.tar``, or a brace pattern of tar files: one split; run it
once per split, so neighbours stay within it):

1. every sample's image is embedded with the open_clip model ``model`` / ``pretrained`` (``negft.models.build``:
   a tag, a file, ``local-dir:``, ``hf-hub:``; ``pretrained=`` a random init drawn from ``seed``), through the
   model's own eval preprocess, features L2-normalised, float32 on the CPU;
2. each image's ``k`` nearest others by cosine, exactly (``nearest``: the features times their transpose, a block of
   rows at a time), nearest first, equal cosines in sample order; neither the sample itself nor another sample
   with byte-identical image is its neighbour;
3. one of the ``k`` is drawn for the sample with ``seed`` (NegCLIP draws one per step; a shard sample holds one
   hard image) and written as ``neg.<ext>``, its bytes copied unchanged.

Each sample keeps its members and fields (an old ``neg.*`` is replaced) and gains:

    relcomp      where the sample has a relcomp record: its caption and hard captions kept, its ``negative_*``
                 fields (those describing the hard image it had) replaced by negative_image ``nearest``,
                 negative_image_caption (the drawn neighbour's caption) and negative_image_negatives (the
                 neighbour's relcomp hard captions, [] where it has none). A sample without a record gets none:
                 the relcomp stream refuses a record without 1 to 4 hard captions (``pipeline._text``) and counts
                 it toward ``train.max_skipped``, so an invented ``{caption, negatives: []}`` would stop a negclip
                 run. NegCLIP needs a hard caption per sample: give the shards relcomp records first.
    hard_images  {neighbours: [{key, caption, cosine}] nearest first, drawn: the position of neg.*'s}

A sample's caption is its relcomp record's caption where it has one (the text a relcomp stream trains), else its
``caption``. Skipped and counted in manifest.json: a sample without a readable json, without an image member,
without a caption, whose image does not decode, or with no other image to be its neighbour. Skipped samples are
no one's neighbour. The manifest records the model, ``k`` and ``seed``.

Memory: the features, N × D float32 (COCO's 118k images × 512: 242 MB), one block of ``BLOCK`` × N cosines with
a mask (about 6 bytes each: 180 MB at 118k), each sample's key, captions and member offsets, and one batch of
pixels; images are read back from the shards by offset, never held. The cosines are computed on the CPU
(``device`` runs the model): N² × D multiply-adds, minutes at COCO's size. The same shards, model and keys give
byte-identical output on one machine (another ``batch`` or machine may round features differently, and so order
two neighbours within rounding of each other otherwise).
"""
from __future__ import annotations

import hashlib
import io
import json
import random
import tarfile
from pathlib import Path

import torch
import torch.nn.functional as F
from PIL import Image

from negft.data import schema
from negft.data.shards import SHARD_PATTERN, ShardWriter, truthy

LAYOUT_SOURCE = ("negft shards (negft/data/schema.py); NegCLIP's hard images: mertyg/vision-language-models-are-bows "
                 "@ 81fdd20 temp_data/valid_neg_clip.tsv (neg_image: 3 other rows of the same file), vinid/open_clip "
                 "@ e680f8e src/training/data.py (CsvDataset: one neg_image row drawn per sample per epoch)")
NEGATIVE_IMAGE = "nearest"          # relcomp.negative_image: the kind of hard image this step writes
FIELD = "hard_images"               # the sample's neighbours and which one is neg.*
BLOCK = 256                         # rows of cosines computed at a time

# skip reasons (manifest.json's "skipped")
BAD_JSON = "json missing or not an object"
NO_IMAGE = "no image member"
UNDECODABLE = "undecodable image"
NO_CAPTION = "no caption"
NO_NEIGHBOUR = "no other image"


def shard_paths(shards) -> list[Path]:
    """SHARDS as files: a folder's ``shard-*.tar`` in order, or a brace pattern's files."""
    import braceexpand
    folder = Path(shards)
    paths = sorted(folder.glob(SHARD_PATTERN.replace("{:06d}", "*"))) if folder.is_dir() else \
        [Path(p) for p in braceexpand.braceexpand(str(shards))]
    missing = [str(p) for p in paths if not p.is_file()]
    if not paths or missing:
        raise FileNotFoundError(f"no shards at {shards}" + (f" (missing: {', '.join(missing[:3])})" if missing else ""))
    return paths


def read_members(path: Path):
    """The samples of one shard in order: (key, {extension: (offset, size)}), webdataset's rule for the key."""
    key, members = None, {}
    with tarfile.open(path) as tf:
        for m in tf:
            if not m.isfile():
                continue
            k, ext = m.name.split(".", 1) if "." in m.name else (m.name, "")
            if k != key and key is not None:
                yield key, members
                members = {}
            key = k
            members[ext] = (m.offset_data, m.size)
    if key is not None:
        yield key, members


def read_at(path: Path, place: tuple[int, int]) -> bytes:
    offset, size = place
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(size)


def caption_of(meta: dict) -> str:
    """The text a neighbour brings with it: its relcomp caption where it has one, else its caption."""
    record = meta.get(schema.RELCOMP)
    text = record.get("caption") if isinstance(record, dict) else None
    text = text if isinstance(text, str) and text.strip() else meta.get(schema.CAPTION)
    return text if isinstance(text, str) and text.strip() else ""


def hard_captions(meta: dict) -> list[str]:
    """The sample's relcomp hard captions (what NegCLIP draws for its hard image): [] where it has none."""
    record = meta.get(schema.RELCOMP)
    negatives = record.get("negatives") if isinstance(record, dict) else None
    return [n["text"] for n in negatives or () if isinstance(n, dict) and isinstance(n.get("text"), str) and n["text"]]


def image_ext(members: dict) -> str | None:
    return next((e for e in schema.IMAGE_KEYS if e in members), None)


def load_model(model: str, pretrained: str, seed: int):
    """``negft.models.build``'s bundle; ``pretrained=`` builds a random init, the same one for a seed (the global
    random state is left as it was)."""
    from negft import models
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return models.build(model, pretrained)


def scan(paths: list[Path], writer: ShardWriter):
    """The usable samples in order, each with its image bytes (shard, key, members, ext, caption, hard captions, data);
    the others skipped by reason (an image that does not decode is skipped by ``embed``)."""
    for path in paths:
        for key, members in read_members(path):
            where = f"{path.name}#{key}"
            try:
                meta = json.loads(read_at(path, members["json"])) if "json" in members else None
            except ValueError:
                meta = None
            if not isinstance(meta, dict):
                writer.skip(BAD_JSON, where)
                continue
            ext = image_ext(members)
            if ext is None:
                writer.skip(NO_IMAGE, where)
                continue
            caption = caption_of(meta)
            if not caption:
                writer.skip(NO_CAPTION, where)
                continue
            yield {"shard": path, "key": key, "members": members, "ext": ext, "caption": caption,
                   "hard": hard_captions(meta), "data": read_at(path, members[ext])}


@torch.no_grad()
def embed(samples, bundle, batch: int, device: str, writer: ShardWriter, progress: bool
          ) -> tuple[list[dict], torch.Tensor]:
    """The samples whose image decodes (each with its image's hash instead of its bytes) and their (N, D)
    L2-normalised float32 features on the CPU: the model's eval preprocess, ``batch`` images at a time, so only one
    batch of pixels is held. A picture stored twice is encoded once, so its copies tie exactly."""
    from tqdm import tqdm
    model = bundle.model.eval().to(device)
    kept, rows, pixels, feats = [], {}, [], []

    def flush():
        if pixels:
            x = torch.stack(pixels).to(device)
            feats.append(F.normalize(model.encode_image(x).float(), dim=-1).cpu())
            pixels.clear()

    for s in tqdm(samples, desc="embed", unit="img", disable=not progress):
        data = s.pop("data")
        s["hash"] = hashlib.blake2b(data, digest_size=16).digest()
        if s["hash"] not in rows:
            try:
                pixels.append(bundle.preprocess_val(Image.open(io.BytesIO(data)).convert("RGB")))
            except Exception:
                writer.skip(UNDECODABLE, f"{s['shard'].name}#{s['key']}")
                continue
            rows[s["hash"]] = len(rows)
        kept.append(s)
        if len(pixels) == batch:
            flush()
    flush()
    features = torch.cat(feats) if feats else torch.zeros(0, 0)
    return kept, features[torch.tensor([rows[s["hash"]] for s in kept], dtype=torch.long)]


def nearest(features: torch.Tensor, groups: torch.Tensor, k: int, block: int = BLOCK
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's ``k`` nearest rows by dot product (cosine for normalised rows), exactly: (N, k) indices and
    similarities, nearest first, equal similarities to the lower index; a row of its own group (itself, its
    duplicates) is never chosen; -1 (and -inf) where a row has fewer than ``k`` others."""
    n = features.shape[0]
    kk = min(k, n)
    index = torch.full((n, k), -1, dtype=torch.long)
    value = torch.full((n, k), float("-inf"))
    for lo in range(0, n, block):
        sims = features[lo:lo + block] @ features.T
        sims[groups[lo:lo + block, None] == groups[None, :]] = float("-inf")
        top = sims.topk(min(kk + 1, n), dim=1)                       # one more: is the k-th place tied?
        idx, kth = top.indices[:, :kk], top.values[:, kk - 1:kk]
        crowded = (top.values[:, kk:kk + 1] == kth).any(1).nonzero()[:, 0]     # tied rows take the lowest indices
        if len(crowded):
            above, tied = sims[crowded] > kth[crowded], sims[crowded] == kth[crowded]
            chosen = above | (tied & (tied.cumsum(1, dtype=torch.int32) <= kk - above.sum(1, keepdim=True)))
            idx[crowded] = chosen.nonzero()[:, 1].view(-1, kk)
        idx = idx.sort(dim=1).values                                # then nearest first, equal ones by index
        idx = idx.gather(1, sims.gather(1, idx).sort(dim=1, descending=True, stable=True).indices)
        val = sims.gather(1, idx)
        index[lo:lo + block, :kk] = torch.where(torch.isinf(val), -1, idx)
        value[lo:lo + block, :kk] = val
    return index, value


def groups_of(samples: list[dict]) -> torch.Tensor:
    """Each sample's image group: samples whose image bytes are equal share one."""
    first: dict[bytes, int] = {}
    return torch.tensor([first.setdefault(s["hash"], len(first)) for s in samples], dtype=torch.long)


def draw(seed: int, key: str, n: int) -> int:
    """Which of a sample's ``n`` neighbours becomes its ``neg.*``: seeded per sample, so any order of work agrees."""
    return random.Random(f"{seed}/{key}").randrange(n)


def record(meta: dict, neighbours: list[dict], drawn: int, other: dict) -> dict:
    """The sample's json with its hard image: see the module docstring."""
    out = dict(meta)
    relcomp = meta.get(schema.RELCOMP)
    if isinstance(relcomp, dict):
        kept = {k: v for k, v in relcomp.items() if not k.startswith("negative_")}
        out[schema.RELCOMP] = {**kept, "negative_image": NEGATIVE_IMAGE, "negative_image_caption": other["caption"],
                               "negative_image_negatives": other["hard"]}
    out[FIELD] = {"neighbours": neighbours, "drawn": drawn}
    return out


def hard_images(shards, out, model="ViT-B-32", pretrained="openai", k="3", batch="64", device="cpu", seed="0",
                maxcount="1000", progress="true") -> dict:
    """SHARDS → ``out/shard-*.tar`` + ``manifest.json``, each sample with its nearest-neighbour hard image; see the
    module docstring."""
    k, batch, seed, maxcount, progress = int(k), int(batch), int(seed), int(maxcount), truthy(progress)
    if k < 1 or batch < 1 or seed < 0:
        raise ValueError("need k >= 1, batch >= 1, seed >= 0")
    if device not in ("cpu", "cuda") and not str(device).startswith("cuda:"):
        raise ValueError(f"device must be cpu or cuda, not {device!r}")
    paths = shard_paths(shards)
    if Path(out).resolve() in {p.parent.resolve() for p in paths}:
        raise ValueError(f"out={out} holds the input shards: pass a new folder")
    bundle = load_model(model, pretrained, seed)
    inputs = {"shards": str(shards), "model": model, "pretrained": pretrained}
    with ShardWriter(out, "hard-images", LAYOUT_SOURCE, inputs, maxcount=maxcount, progress=progress) as writer:
        samples, features = embed(scan(paths, writer), bundle, batch, device, writer, progress)
        index, value = nearest(features, groups_of(samples), k) if samples else (None, None)
        without_hard = 0
        for i, s in enumerate(samples):
            found = [j for j in index[i].tolist() if j >= 0]
            if not found:
                writer.skip(NO_NEIGHBOUR, f"{s['shard'].name}#{s['key']}")
                continue
            neighbours = [{"key": samples[j]["key"], "caption": samples[j]["caption"],
                           "cosine": round(float(c), 6)} for j, c in zip(found, value[i].tolist())]
            drawn = draw(seed, s["key"], len(found))
            other = samples[found[drawn]]
            members = {e: read_at(s["shard"], place) for e, place in s["members"].items()
                       if e != "json" and e != s["ext"] and e not in schema.NEGATIVE_IMAGE_KEYS}
            members[f"neg.{other['ext']}"] = read_at(other["shard"], other["members"][other["ext"]])
            meta = json.loads(read_at(s["shard"], s["members"]["json"]))
            without_hard += not s["hard"]
            writer.add(s["key"], read_at(s["shard"], s["members"][s["ext"]]), s["ext"],
                       record(meta, neighbours, drawn, other), members)
        writer.notes.update({
            "model": model, "pretrained": pretrained, "k": k, "seed": seed,
            "features": f"open_clip image features ({features.shape[1]}-d), L2-normalised, float32",
            "samples_without_hard_captions": without_hard,
            "policy": f"each sample's {k} nearest other images by cosine (same shards, byte-identical images "
                      "excluded), one drawn with the seed as neg.*; relcomp records gain it as negative_image "
                      f"'{NEGATIVE_IMAGE}' with its caption and hard captions",
        })
        manifest = writer.close()
    return {**manifest, "out": str(out)}
