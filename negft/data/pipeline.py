"""webdataset pipelines: shards → decoded, validated, tokenised batches for one training stream.

Shards are split by node (rank) and by loader worker, or (``resampled``) drawn with replacement by
each; shard order and the sample shuffle are seeded by (seed, epoch, pass) so an epoch's data order
is reproducible.

What a stream leaves out is counted by reason in a ``Tally`` that travels with the next batch, so the loop can
report it (log, TensorBoard, ledger) at the end of the epoch and stop past ``train.max_skipped``: a shard that
cannot be opened, is not a tar archive or ends early (truncated or corrupt: the rest of it is skipped), and a
sample whose json or image is missing or undecodable, whose field is malformed (an MCQ answer out of range, ...)
or whose named hard-negative image is missing. Two things are counted but are not faults: a sample without the
stream's field, which belongs to another stream (merged NegCap + NegMCQ shards hold images with only one of the
two), and a text longer than the model's context, which is cut to it as open_clip's tokenizer cuts it.

A stream's loader workers live as long as the run (``persistent_workers``): a second pass over the shards
or a new epoch does not restart them. They read the (epoch, pass) they serve from shared memory, and each
pass reseeds their random state from it, so the data order and the augmentations stay a function of
(seed, epoch, pass, rank, worker), whether the workers are new or not. ``SyntheticBatches`` stands in for a
stream with random batches made on the device (``train.synthetic``).
"""
from __future__ import annotations

import io
import itertools
import atexit
import json
import multiprocessing
import os
import random
import re
import signal
import tarfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import torch
import webdataset as wds
from PIL import Image
from webdataset.gopen import gopen
from webdataset.utils import pytorch_worker_info

from negft.data import schema

MAX_NEGATIVES = schema.MAX_NEGATIVES


@dataclass
class StreamSpec:
    urls: list[str]
    task: str            # contrastive | mcq | itm
    field: str           # caption | negcap | mcq | relcomp
    batch_size: int
    resampled: bool = False   # draw shards with replacement (each rank and worker on its own), never runs dry
    # the batch fields the objective's terms ask for (negft.losses, Term.fields; negft.train.task.stream_extras):
    # name -> fn(the batch's samples' json, the tokenizer) -> tensor, e.g. the drift guard's ``captions``
    fields: dict[str, Callable] = field(default_factory=dict)
    # an itm stream's hard captions drawn anew from each sample's caption whenever it is read:
    # fn(json, sample key, epoch) -> json (negft.convert.negatives.Redraw; streams.NAME.redraw_negatives)
    redraw: Callable | None = None


# ----------------------------------------------------------------------------- what a stream leaves out
# shard faults: the shard, or the rest of it, is skipped
SHARD_UNOPENED = "shard_unopened"            # missing file, failing pipe: command, unreachable URL
SHARD_NOT_TAR = "shard_not_tar"              # no tar member could be read: the whole shard is skipped
SHARD_TRUNCATED = "shard_truncated"          # ends early or is corrupt after some samples: the rest is skipped
# sample faults: the sample is skipped
JSON_MISSING, JSON_UNDECODABLE = "json_missing", "json_undecodable"
IMAGE_MISSING, IMAGE_UNDECODABLE = "image_missing", "image_undecodable"
NEGATIVE_IMAGE_MISSING = "negative_image_missing"        # relcomp.negative_image names one; no neg.* member
NEGATIVE_IMAGE_UNDECODABLE = "negative_image_undecodable"
# a malformed field: "<field>_<what>", e.g. "mcq_answer_out_of_range" (``_text``)
SAMPLE_UNREADABLE = "sample_unreadable"      # anything else that fails while decoding one sample
NO_NEGATIVE_DRAWN = "relcomp_no_negative_drawn"   # redraw_negatives found none in the caption


@dataclass
class Tally:
    """What a stream read and left out. Faults (``skipped`` samples, ``shard_faults``) count toward
    ``train.max_skipped``; ``other_stream`` (samples without this stream's field) and ``truncated_texts`` (texts
    cut to the context) are not faults."""
    read: int = 0                  # this stream's samples examined: kept or skipped
    shards: int = 0                # shards opened
    skipped: Counter = field(default_factory=Counter)          # sample reason -> samples
    shard_faults: Counter = field(default_factory=Counter)     # shard reason -> shards
    bad_shards: dict = field(default_factory=dict)             # shard url -> what happened to it
    other_stream: int = 0
    truncated_texts: int = 0
    examples: dict = field(default_factory=dict)               # sample reason -> a few "shard#key"
    whole: int = 0                 # shards read to their end, and the samples they held: a shard's usual size
    whole_samples: int = 0
    cut_samples: int = 0           # samples read from shards that failed part-way, before they failed

    EXAMPLES = 3

    @property
    def faults(self) -> int:
        return sum(self.skipped.values()) + sum(self.shard_faults.values())

    def lost(self) -> int | None:
        """About how many samples the failed shards held past where they failed: each as many as a shard read to
        its end held on average, less what was read of them; None when no shard was read to its end."""
        faults = sum(self.shard_faults.values())
        if not faults:
            return 0
        if not self.whole:
            return None
        return max(0, round(faults * self.whole_samples / self.whole) - self.cut_samples)

    def fraction(self) -> float:
        """The share of the samples left out: skipped samples among those read, plus the samples failed shards
        lost (``lost``, an estimate) among all the shards' samples; 1 when every shard failed."""
        lost = self.lost()
        if lost is None:
            return 1.0
        held = self.whole_samples + self.cut_samples + lost
        return sum(self.skipped.values()) / max(1, self.read) + (lost / held if lost else 0.0)

    def skip(self, reason: str, sample: dict) -> None:
        self.read += 1
        self.skipped[reason] += 1
        seen = self.examples.setdefault(reason, [])
        if len(seen) < self.EXAMPLES:
            seen.append(f"{sample.get('__url__', '?')}#{sample.get('__key__', '?')}")

    def shard_fault(self, url: str, reason: str, note: str) -> None:
        self.shard_faults[reason] += 1
        self.bad_shards[url] = f"{reason} ({note})"

    def add(self, other: "Tally | dict") -> "Tally":
        o = other if isinstance(other, Tally) else Tally.from_dict(other)
        self.read += o.read
        self.shards += o.shards
        self.whole += o.whole
        self.whole_samples += o.whole_samples
        self.cut_samples += o.cut_samples
        self.skipped.update(o.skipped)
        self.shard_faults.update(o.shard_faults)
        self.bad_shards.update(o.bad_shards)
        self.other_stream += o.other_stream
        self.truncated_texts += o.truncated_texts
        for reason, seen in o.examples.items():
            mine = self.examples.setdefault(reason, [])
            mine += [x for x in seen if x not in mine][:self.EXAMPLES - len(mine)]
        return self

    def as_dict(self) -> dict:
        """The counts (the shard sizes behind ``lost`` only where a shard failed: a clean run's record is as it
        was)."""
        out = {"read": self.read, "shards": self.shards, "skipped": dict(sorted(self.skipped.items())),
               "shard_faults": dict(sorted(self.shard_faults.items())), "bad_shards": dict(self.bad_shards),
               "other_stream": self.other_stream, "truncated_texts": self.truncated_texts,
               "fraction_skipped": round(self.fraction(), 6), "examples": dict(sorted(self.examples.items()))}
        if self.shard_faults:
            out.update(whole=self.whole, whole_samples=self.whole_samples, cut_samples=self.cut_samples,
                       samples_lost=self.lost())
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "Tally":
        return cls(d.get("read", 0), d.get("shards", 0), Counter(d.get("skipped", {})),
                   Counter(d.get("shard_faults", {})), dict(d.get("bad_shards", {})), d.get("other_stream", 0),
                   d.get("truncated_texts", 0), {k: list(v) for k, v in d.get("examples", {}).items()},
                   d.get("whole", 0), d.get("whole_samples", 0), d.get("cut_samples", 0))

    def full(self) -> dict:
        """Every count, the shard sizes included, for another process's ``add`` (a worker's, a rank's)."""
        return {**self.as_dict(), "whole": self.whole, "whole_samples": self.whole_samples,
                "cut_samples": self.cut_samples}

    def take(self) -> dict:
        """The counts so far (``full``); the tally starts again from zero."""
        out = self.full()
        self.__init__()
        return out

    def describe(self, max_shards: int = 10, named: set | None = None) -> str:
        """One line for the log: the faults by reason and the bad shards by name (those of ``named``, already
        listed, by count only; the others are added to it); '' when nothing was left out."""
        parts = []
        if self.skipped:
            parts.append(f"skipped {sum(self.skipped.values())} of {self.read} samples ("
                         + ", ".join(f"{k}: {v}" + (f" e.g. {', '.join(self.examples[k])}" if self.examples.get(k)
                                                     else "") for k, v in sorted(self.skipped.items())) + ")")
        if self.shard_faults:
            named = set() if named is None else named
            names = [(url, why) for url, why in sorted(self.bad_shards.items()) if url not in named]
            shown = "; ".join(f"{url}: {why}" for url, why in names[:max_shards])
            more = f"; and {len(names) - max_shards} more" if len(names) > max_shards else ""
            before = len(self.bad_shards) - len(names)
            listed = "; ".join(t for t in (shown + more, f"{before} named above" if before else "") if t)
            lost = self.lost()
            cost = (f"about {lost} samples lost past where they failed" if lost is not None
                    else "no shard was read to its end")
            parts.append(f"{sum(self.shard_faults.values())} of {self.shards} shard reads failed, {cost} ({listed})")
            named.update(url for url, _ in names)
        if self.other_stream:
            parts.append(f"{self.other_stream} samples without this stream's field passed over (another "
                         "stream's samples, not a fault)")
        if self.truncated_texts:
            parts.append(f"{self.truncated_texts} texts longer than the context cut to it (not a fault)")
        return "; ".join(parts)

    def report(self, what: str, writer, prefix: str, step: int, named: set | None = None) -> None:
        """``describe`` in the log (when something was left out; shards in ``named`` by count only) and every
        count in TensorBoard under ``prefix``."""
        line = self.describe(named=named)
        if line:
            print(f"[negft] {what}: {line} (all ranks)", flush=True)
        counts = {k: v for k, v in self.as_dict().items() if isinstance(v, (int, float))}
        counts.update(skipped=sum(self.skipped.values()), shard_faults=sum(self.shard_faults.values()),
                      **self.skipped, **self.shard_faults)
        for k, v in counts.items():
            writer.add_scalar(f"{prefix}/{k}", v, step)


class DataError(RuntimeError):
    """A stream left out more than ``train.max_skipped`` of its data."""


def check_skipped(tallies: dict[str, Tally], max_skipped: float, epoch: int) -> None:
    """Raise ``DataError`` naming the shards and reasons when a stream's share of skipped data (``Tally.fraction``)
    is past ``max_skipped``."""
    over = {name: t for name, t in tallies.items() if t.fraction() > max_skipped}
    if over:
        named = set()           # streams reading the same shards: each shard named once
        lines = [f"stream '{name}' left out {t.fraction():.2%} of its samples in epoch {epoch}: "
                 f"{t.describe(named=named)}" for name, t in over.items()]
        raise DataError("; ".join(lines) + f". That is past train.max_skipped={max_skipped:g}; "
                        f"checkpoints/epoch_{epoch} is kept, and its evaluation where it was due. Fix or remove "
                        "the shards and samples named (for a manifest's data `negft data check NAME "
                        "checksums=true` lists broken shards), or raise train.max_skipped, then run again with "
                        "resume=latest")


def gather(tally: Tally) -> Tally:
    """Every rank's tally summed on every rank (a collective when there are several ranks)."""
    import torch.distributed as dist
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return tally
    parts = [None] * dist.get_world_size()
    dist.all_gather_object(parts, tally.full())
    total = Tally()
    for p in parts:
        total.add(p)
    return total


# ----------------------------------------------------------------------------- reading shards
_MEMBER = re.compile(r"^((?:.*/|)[^./]+)[.]([^/]*)$")    # webdataset's key.ext split: the key ends at the first dot


class _Ending(tarfile.TarInfo):
    """A TarInfo that notes why a tar stream ended: tarfile reads a missing, cut or garbled header after the first
    member as the end of the archive, with no error; only an all-zero block is the end a tar writer writes."""

    @classmethod
    def fromtarfile(cls, tf):
        try:
            return super().fromtarfile(tf)
        except tarfile.HeaderError as e:
            tf.negft_end = e
            raise


def _shard_samples(url: str, tally: Tally):
    """The samples of one shard ({"__key__", "__url__", ext: bytes}, grouped by key as webdataset groups them);
    a shard that cannot be read to its end is counted in ``tally`` and its rest skipped."""
    sample, n = None, 0
    try:
        stream = gopen(url, "rb")
    except Exception as e:
        tally.shard_fault(url, SHARD_UNOPENED, f"{type(e).__name__}: {e}")
        return
    try:
        with stream, tarfile.open(fileobj=stream, mode="r|*", tarinfo=_Ending) as tf:
            for info in tf:
                if not info.isreg() or info.name.startswith("__"):
                    continue
                m = _MEMBER.match(info.name)
                if m is None:
                    continue
                key, ext = m.group(1), m.group(2).lower()
                if sample is not None and sample["__key__"] != key:
                    yield sample
                    n += 1
                    sample = None
                data = tf.extractfile(info).read()        # a cut member fails here: its sample is dropped
                if sample is None:
                    sample = {"__key__": key, "__url__": url}
                sample.setdefault(ext, data)
            end = getattr(tf, "negft_end", None)
            if end is not None and not isinstance(end, tarfile.EOFHeaderError):
                if sample is not None:      # every member read whole: the sample is kept (and checked)
                    yield sample
                    n, sample = n + 1, None
                raise tarfile.ReadError(f"ends without the end-of-archive blocks ({end})")
    except Exception as e:
        first = n == 0 and sample is None
        tally.shard_fault(url, SHARD_NOT_TAR if first else SHARD_TRUNCATED,
                          f"{type(e).__name__}: {e}" if first else
                          f"after {n} samples: {type(e).__name__}: {e}; the rest skipped")
        tally.cut_samples += n
        return
    tally.whole += 1                    # counted before the last sample: a reader may stop after taking it
    tally.whole_samples += n + (sample is not None)
    if sample is not None:
        yield sample


def _read_shards(tally: Tally):
    """A pipeline stage: shard dicts ({"url": ...}) in, samples out; every shard opened is counted."""
    def stage(src):
        for shard in src:
            tally.shards += 1
            yield from _shard_samples(shard["url"], tally)
    return stage


# ----------------------------------------------------------------------------- samples and batches
class _Malformed(Exception):
    """A sample that has what a stream needs but cannot be used; ``args[0]`` is the reason."""


def _image(sample, keys, missing: str, undecodable: str) -> Image.Image | None:
    """The decoded image of the first of ``keys`` the sample has; ``_Malformed`` when it has none (``missing``;
    "" for an optional image, which is None then) or it does not decode."""
    for k in keys:
        if k in sample:
            try:
                return Image.open(io.BytesIO(sample[k])).convert("RGB")
            except Exception:
                raise _Malformed(undecodable) from None
    if missing:
        raise _Malformed(missing)
    return None


def _preprocess(preprocess, image: Image.Image, undecodable: str) -> torch.Tensor:
    try:
        return preprocess(image)
    except Exception:
        raise _Malformed(undecodable) from None


def _text(meta: dict, field: str, rng: random.Random):
    """The training text(s) of a sample for ``field``: None when the sample has no such field (another
    stream's sample), ``_Malformed`` when the field is there but unusable."""
    value = meta.get(field)
    if value is None:
        return None
    if field == schema.CAPTION:
        if not isinstance(value, str) or not value.strip():
            raise _Malformed("caption_empty_or_not_text")
        return value
    if field == schema.NEGCAP:
        if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
            raise _Malformed("negcap_not_a_list_of_texts")
        return rng.choice(value)
    if field == schema.MCQ:
        if not isinstance(value, dict):
            raise _Malformed("mcq_not_an_object")
        options, answer = value.get("options"), value.get("answer")
        if (not isinstance(options, list) or len(options) != schema.N_OPTIONS
                or not all(isinstance(o, str) and o for o in options)):
            raise _Malformed(f"mcq_options_not_{schema.N_OPTIONS}_texts")
        if answer is None:
            raise _Malformed("mcq_answer_missing")
        if not isinstance(answer, int) or isinstance(answer, bool):
            raise _Malformed("mcq_answer_not_an_integer")
        if not 0 <= answer < len(options):
            raise _Malformed("mcq_answer_out_of_range")
        return options, answer
    if field == schema.RELCOMP:
        if not isinstance(value, dict):
            raise _Malformed("relcomp_not_an_object")
        if not isinstance(value.get("caption"), str) or not value["caption"]:
            raise _Malformed("relcomp_caption_missing")
        negatives = value.get("negatives")
        if (not isinstance(negatives, list) or not 1 <= len(negatives) <= MAX_NEGATIVES
                or not all(isinstance(n, dict) and isinstance(n.get("text"), str) and n["text"] for n in negatives)):
            raise _Malformed(f"relcomp_negatives_not_1_to_{MAX_NEGATIVES}_texts")
        return value["caption"], [n["text"] for n in negatives]
    raise ValueError(f"unknown field '{field}'")


def _texts(value) -> list[str]:
    """The non-empty strings of a list field (none when it is not a list)."""
    return [t for t in value if isinstance(t, str) and t] if isinstance(value, list) else []


def mcq_as_relcomp(meta: dict) -> dict | None:
    """A NegMCQ question as a RelComp record, for an itm stream that reads field=mcq: the right answer the caption,
    the other options its hard negatives (kind ``mcq``), no negative image, so that a baseline's loss trains on
    NegMCQ's negatives (experiments/comparison.py's arms). None for a sample without ``mcq`` (another stream's);
    ``_Malformed`` where the question is unusable, as for an mcq stream."""
    value = _text(meta, schema.MCQ, None)
    if value is None:
        return None
    options, answer = value
    return {**meta, schema.RELCOMP: {"caption": options[answer], "negatives": [
        {"text": o, "kind": "mcq"} for i, o in enumerate(options) if i != answer]}}


def _example(sample: dict, spec: StreamSpec, preprocess, rng: random.Random, epoch: int = 0):
    """(image, text) of one sample for the stream, None for another stream's sample; ``_Malformed`` if broken.
    The text is read first (and the image decoded only for this stream's samples)."""
    if "json" not in sample:
        raise _Malformed(JSON_MISSING)
    try:
        meta = json.loads(sample["json"])
    except ValueError:
        raise _Malformed(JSON_UNDECODABLE) from None
    if not isinstance(meta, dict):
        raise _Malformed(JSON_UNDECODABLE)
    field = spec.field
    if spec.task == "itm" and field == schema.MCQ:
        meta, field = mcq_as_relcomp(meta), schema.RELCOMP
        if meta is None:
            return None
    if spec.redraw is not None and field == schema.RELCOMP:
        meta = spec.redraw(meta, str(sample.get("__key__", "")), epoch)
        if isinstance(meta.get(schema.RELCOMP), dict) and not meta[schema.RELCOMP].get("negatives"):
            raise _Malformed(NO_NEGATIVE_DRAWN)
    text = _text(meta, field, rng)
    if text is None:
        return None
    image = _image(sample, schema.IMAGE_KEYS, IMAGE_MISSING, IMAGE_UNDECODABLE)
    if field == schema.RELCOMP:
        named = bool(meta[schema.RELCOMP].get("negative_image"))
        negative = _image(sample, schema.NEGATIVE_IMAGE_KEYS, NEGATIVE_IMAGE_MISSING if named else "",
                          NEGATIVE_IMAGE_UNDECODABLE)
        if negative is not None:        # before the image: a random crop draws in this order
            negative = _preprocess(preprocess, negative, NEGATIVE_IMAGE_UNDECODABLE)
        text = (*text, negative)
    image = _preprocess(preprocess, image, IMAGE_UNDECODABLE)
    if not spec.fields:
        return image, text
    if field == schema.NEGCAP:          # which objects the drawn caption negates (losses.negcap_hard_negatives)
        meta[schema.DRAWN_NEGCAP] = text
    if field == schema.RELCOMP:         # one hard caption of the image and of its negative image, drawn anew each
        record = meta[schema.RELCOMP]   # epoch as NegCLIP draws them (losses.hard_caption)
        meta[schema.DRAWN_NEGATIVES] = (rng.randrange(len(text[1])),
                                        rng.randrange(max(1, len(_texts(record.get("negative_image_negatives"))))))
    return image, text, meta            # the json for the terms' fields


def _examples(src, spec: StreamSpec, preprocess, tally: Tally, seed: int, epoch: int = 0):
    rng = random.Random(seed)
    for sample in src:
        try:
            example = _example(sample, spec, preprocess, rng, epoch)
        except _Malformed as e:
            tally.skip(e.args[0], sample)
            continue
        except Exception:
            tally.skip(SAMPLE_UNREADABLE, sample)
            continue
        if example is None:
            tally.other_stream += 1
            continue
        tally.read += 1
        yield example


TOKEN_CACHE = 100_000      # texts whose tokens a stream's worker keeps (~0.6 kB each with a context of 77)


class _Tokens:
    """The tokenizer, counting the texts it cuts to the context (their tokens reach its last position and their
    full encoding is longer: open_clip's tokenizer cuts silently). ``cache`` (text -> its token row and whether it
    was cut), kept by the stream's worker across passes: an MCQ's options and a NegCap caption come back every
    epoch, and open_clip's tokenizer costs a third of a batch's making."""

    def __init__(self, tokenizer, tally: Tally, cache: dict | None = None):
        self.tokenizer, self.tally = tokenizer, tally
        self.pad = int(tokenizer([""])[0, -1])
        self.encode = getattr(tokenizer, "encode", None)
        self.cache = {} if cache is None else cache

    def __call__(self, texts: list[str]) -> torch.Tensor:
        new = [t for t in dict.fromkeys(texts) if t not in self.cache]
        fresh = {}
        if new:
            tokens = self.tokenizer(new)
            full = set((tokens[:, -1] != self.pad).nonzero().flatten().tolist())
            n = tokens.shape[1]
            for i, (text, row) in enumerate(zip(new, tokens)):
                fresh[text] = (row, i in full and (self.encode is None or len(self.encode(text)) + 2 > n))
            for text in new[:max(0, TOKEN_CACHE - len(self.cache))]:
                self.cache[text] = fresh[text]
        rows = [fresh[t] if t in fresh else self.cache[t] for t in texts]
        self.tally.truncated_texts += sum(cut for _, cut in rows)
        return torch.stack([row for row, _ in rows])


def _batches(src, spec: StreamSpec, tokenizer, tally: Tally, token_cache: dict | None = None):
    tokenizer = _Tokens(tokenizer, tally, token_cache)
    images, texts, metas = [], [], []
    for image, text, *meta in src:
        images.append(image)
        texts.append(text)
        metas += meta
        if len(images) == spec.batch_size:
            batch = {"images": torch.stack(images)}
            if spec.task == "mcq":
                options = [o for opts, *_ in texts for o in opts]
                batch["options"] = tokenizer(options).view(len(texts), schema.N_OPTIONS, -1)
                batch["answers"] = torch.tensor([t[1] for t in texts])
            elif spec.task == "itm":
                batch.update(_itm_batch(texts, tokenizer, batch["images"]))
            else:
                batch["texts"] = tokenizer(texts)
            for name, make in spec.fields.items():       # the terms' fields (negft.losses)
                batch[name] = make(metas, tokenizer)
            batch["skipped"] = torch.tensor(tally.faults)
            batch["tally"] = tally.take()
            yield batch
            images, texts, metas = [], [], []
    if tally.faults or tally.read or tally.shards or tally.other_stream:   # counts after the last full batch
        yield {"skipped": torch.tensor(tally.faults), "tally": tally.take()}


def _itm_batch(examples, tokenizer, images) -> dict:
    """Captions, negatives padded to MAX_NEGATIVES with a mask, and negative images (zeros where absent)."""
    captions, negatives, negative_images = zip(*examples)
    padded = [n + [""] * (MAX_NEGATIVES - len(n)) for n in negatives]
    has_image = torch.tensor([im is not None for im in negative_images])
    return {
        "texts": tokenizer(list(captions)),
        "negatives": tokenizer([t for n in padded for t in n]).view(len(padded), MAX_NEGATIVES, -1),
        "negative_mask": torch.tensor([[k < len(n) for k in range(MAX_NEGATIVES)] for n in negatives]),
        "negative_images": torch.stack([torch.zeros_like(images[0]) if im is None else im
                                        for im in negative_images]),
        "has_negative_image": has_image,
    }


class Stream(torch.utils.data.IterableDataset):
    """One pass over a stream's shards for (epoch, pass), this rank's and this worker's share."""

    def __init__(self, spec: StreamSpec, preprocess, tokenizer, seed: int, shuffle_buffer: int = 1000):
        self.spec, self.preprocess, self.tokenizer = spec, preprocess, tokenizer
        self.seed, self.shuffle_buffer = seed, shuffle_buffer
        # (epoch, pass) in shared memory: persistent loader workers hold a copy of this object made when they
        # started, and read the current pass from here when each pass begins
        self._key = multiprocessing.Array("q", 2, lock=False)
        self._tokens: dict = {}         # _Tokens' cache, this process's (each worker fills its own copy)

    @property
    def epoch(self) -> int:
        return self._key[0]

    @property
    def pass_(self) -> int:
        return self._key[1]

    def set_epoch(self, epoch: int, pass_: int = 0):
        self._key[0], self._key[1] = epoch, pass_

    def __iter__(self):
        rank, world, worker, nworkers = pytorch_worker_info()
        key = (self.seed, self.epoch, self.pass_)
        urls = list(self.spec.urls)
        random.Random(hash(key) & 0xFFFFFFFF).shuffle(urls)
        tally = Tally()
        local_seed = hash((*key, rank, worker)) & 0xFFFFFFFF
        if torch.utils.data.get_worker_info() is not None:
            torch.manual_seed(local_seed)      # the augmentations of this pass, in this worker
        readers = world * max(1, nworkers)
        read = _read_shards(tally)
        if self.spec.resampled:       # seeded by (seed, epoch, pass) and by rank and worker
            shards = wds.ResampledShards(urls, seed=hash(key) & 0xFFFFFFFF, deterministic=True)
            stages = [read]
        elif len(urls) >= readers:    # the usual case: each rank and worker reads its own shards
            stages = [wds.split_by_node, wds.split_by_worker, read]
        else:                         # fewer shards than readers: everyone reads all, keeps every n-th sample
            me = rank * max(1, nworkers) + worker
            stages = [read, lambda src: itertools.islice(src, me, None, readers)]
        pipe = wds.DataPipeline(
            shards if self.spec.resampled else wds.SimpleShardList(urls),
            *stages,
            wds.shuffle(self.shuffle_buffer, initial=self.shuffle_buffer, rng=random.Random(local_seed)),
        )
        examples = _examples(iter(pipe), self.spec, self.preprocess, tally, local_seed, self.epoch)
        yield from _batches(examples, self.spec, self.tokenizer, tally, self._tokens)


def loader(stream: Stream, workers: int, persistent: bool = False) -> torch.utils.data.DataLoader:
    """Worker RNGs seeded from (seed, epoch, pass), so a resumed epoch sees the same augmentations."""
    seed = hash((stream.seed, stream.epoch, stream.pass_)) & 0xFFFFFFFF
    if workers > 0:         # once, and after multiprocessing's own exit handler (torch imported it), so before it
        atexit.unregister(_kill_workers)
        atexit.register(_kill_workers)
    return torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers,
                                       persistent_workers=persistent and workers > 0,
                                       pin_memory=torch.cuda.is_available(),
                                       worker_init_fn=_cpu_worker if not torch.cuda.is_available() else _worker,
                                       generator=torch.Generator().manual_seed(seed))


def _worker(_worker_id: int) -> None:
    """A scheduler's SIGTERM (or Slurm's SIGUSR1) reaches every process of a job; the training process stops after
    its step (``negft.train.stop``), which a worker killed by it would fail. Workers end with their parent
    (``_kill_workers``)."""
    from negft.signals import STOP_SIGNALS
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_IGN)


def _cpu_worker(worker_id: int) -> None:
    """On a machine without a GPU the workers share the cores with the training step's threads: at the lowest
    priority they decode in the step's gaps instead of stalling its threads (world pretraining on 2 cores: about
    5% less time per step; bench/RESULTS.md)."""
    _worker(worker_id)
    os.nice(19)


def _kill_workers() -> None:
    """At exit, SIGKILL this process's daemonic children (loader workers). Python ends them with SIGTERM, which
    the workers ignore (``_worker``): a run that ends with a loader still open (an uncaught exception, Ctrl-C)
    would wait for them forever."""
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()


def shard_note(urls: list[str], readers: int, resampled: bool) -> str | None:
    """A note when a stream's shards split unevenly over its readers (ranks × loader workers), else None.

    Each reader reads whole shards: with fewer shards than readers every reader decodes every shard (and keeps
    every n-th sample), and when the count is not a multiple of the readers some finish a pass early while
    the rest decode alone. A few shards per reader, in a multiple of the readers, keep all of them busy."""
    n = len(urls)
    if resampled or readers <= 1 or (n >= readers and n % readers == 0):
        return None
    if n < readers:
        return (f"{n} shard(s) for {readers} readers (ranks × workers): every reader decodes every shard; "
                f"write at least {readers} shards, a multiple of {readers}, or use fewer workers")
    return (f"{n} shards for {readers} readers (ranks × workers): {n % readers} reader(s) read one shard more "
            f"than the others each pass; a multiple of {readers} shards keeps them even")


class EpochBatches:
    """Exactly ``steps`` batches of a stream for one epoch, starting further passes if it runs dry.

    Every rank draws the same number of batches, so collective ops never wait on a rank whose
    share of shards ran out first. One loader serves every pass and epoch; its workers persist.
    """

    def __init__(self, stream: Stream, workers: int):
        self.stream, self.workers = stream, workers
        self.tally = Tally()           # what this epoch's batches so far read and left out, on this rank
        self._loader = None

    @property
    def skipped(self) -> int:
        return self.tally.faults

    def _count(self, counts: dict) -> None:
        for url, why in counts.get("bad_shards", {}).items():
            if url not in self.tally.bad_shards:        # said once an epoch, when it happens
                print(f"[negft] shard {url}: {why}", flush=True)
        self.tally.add(counts)

    def epoch(self, epoch: int, steps: int, start: int = 0):
        """Batches ``start`` .. ``steps``−1 of ``epoch`` (a resumed epoch re-draws and drops the first ones)."""
        self.tally = Tally()
        drawn, pass_ = 0, 0
        while drawn < steps:
            self.stream.set_epoch(epoch, pass_)
            if self._loader is None:
                self._loader = loader(self.stream, self.workers, persistent=True)
            got = 0
            for batch in self._loader:
                batch.pop("skipped")
                self._count(batch.pop("tally"))
                if not batch:          # the counts after the last full batch, no samples
                    continue
                if drawn >= start:
                    yield batch
                got += 1
                drawn += 1
                if drawn == steps:
                    return
            if got == 0:
                raise DataError(f"stream {self.stream.spec.urls[:2]}... yielded no batch of "
                                f"{self.stream.spec.batch_size} on this rank: too few samples or shards"
                                + (f"; {self.tally.describe()}" if self.tally.describe() else ""))
            pass_ += 1


class SyntheticBatches:
    """Random batches of a stream's shapes made on the device: no shards, no decoding, no host copy.

    Images are N(0, 1) at the model's image size; texts fill the whole context (start token, random tokens,
    end-of-text token last), so no step is cheapened by trimming. Seeded by (seed, epoch, rank). What
    ``train.synthetic`` trains on: the step's speed alone, and a cluster tested without data.
    """
    skipped = 0
    tally = Tally()

    def __init__(self, spec: StreamSpec, image_size: tuple[int, int], tokenizer, device, dtype, seed: int,
                 rank: int = 0):
        self.spec, self.image_size, self.device, self.dtype = spec, tuple(image_size), torch.device(device), dtype
        self.seed, self.rank = seed, rank
        blank = tokenizer([""])[0]           # [start, end, 0, ...]: the ids and the context length
        self.sot, self.eot, self.context = int(blank[0]), int(blank[1]), blank.shape[0]

    def _tokens(self, n: int, g: torch.Generator) -> torch.Tensor:
        t = torch.randint(1, min(self.sot, self.eot), (n, self.context), generator=g, device=self.device)
        t[:, 0], t[:, -1] = self.sot, self.eot
        return t

    def _images(self, n: int, g: torch.Generator) -> torch.Tensor:
        return torch.randn(n, 3, *self.image_size, generator=g, device=self.device, dtype=self.dtype)

    def batch(self, g: torch.Generator) -> dict:
        b = self.spec.batch_size
        out = {"images": self._images(b, g)}
        if self.spec.task == "mcq":
            out["options"] = self._tokens(b * schema.N_OPTIONS, g).view(b, schema.N_OPTIONS, -1)
            out["answers"] = torch.randint(0, schema.N_OPTIONS, (b,), generator=g, device=self.device)
        elif self.spec.task == "itm":
            out["texts"] = self._tokens(b, g)
            out["negatives"] = self._tokens(b * MAX_NEGATIVES, g).view(b, MAX_NEGATIVES, -1)
            out["negative_mask"] = torch.ones(b, MAX_NEGATIVES, dtype=torch.bool, device=self.device)
            out["negative_images"] = self._images(b, g)
            out["has_negative_image"] = torch.ones(b, dtype=torch.bool, device=self.device)
        else:
            out["texts"] = self._tokens(b, g)
        return out

    def epoch(self, epoch: int, steps: int, start: int = 0):
        g = torch.Generator(self.device).manual_seed(hash((self.seed, epoch, self.rank)) & 0xFFFFFFFF)
        for i in range(steps):
            batch = self.batch(g)
            if i >= start:
                yield batch
