"""webdataset pipelines: shards → decoded, validated, tokenised batches for one training stream.

Shards are split by node (rank) and by loader worker, or (``resampled``) drawn with replacement by
each; shard order and the sample shuffle are seeded by (seed, epoch, pass) so an epoch's data order
is reproducible. A sample whose field is
missing or malformed, or a tar member that cannot be read, is skipped and counted; the count
travels with the next batch so the loop can report it at the end of the epoch.

A stream's loader workers live as long as the run (``persistent_workers``): a second pass over the shards
or a new epoch does not restart them. They read the (epoch, pass) they serve from shared memory, and each
pass reseeds their random state from it, so the data order and the augmentations stay a function of
(seed, epoch, pass, rank, worker), whether the workers are new or not. ``SyntheticBatches`` stands in for a
stream with random batches made on the device (``train.synthetic``).
"""
from __future__ import annotations

import io
import itertools
import json
import multiprocessing
import random
from dataclasses import dataclass

import torch
import webdataset as wds
from PIL import Image
from webdataset.utils import pytorch_worker_info

from negft.data import schema

MAX_NEGATIVES = 3      # selective negatives per RelComp caption; batches pad to this many and carry a mask


@dataclass
class StreamSpec:
    urls: list[str]
    task: str            # contrastive | mcq | itm
    field: str           # caption | negcap | mcq | relcomp
    batch_size: int
    resampled: bool = False   # draw shards with replacement (each rank and worker on its own), never runs dry
    # the drift guard's inputs (loss.guard): each batch also carries the images' affirmative ``captions`` (tokens,
    # with ``has_caption`` false where a sample has none) and, for an mcq stream, ``option_affirmative`` (M, C)
    guard: bool = False
    # loss.t2i: each mcq batch also carries ``answer_truth`` (M, M): which images each right answer is true of
    t2i: bool = False


def _mentions(text: str, names) -> set:
    import re
    return {n for n in names if re.search(rf"\b{re.escape(n)}s?\b", text.lower())}


def _objects(meta: dict) -> tuple[list, list]:
    objects = meta.get(schema.OBJECTS)
    if not isinstance(objects, dict):
        return [], []
    return [o for o in objects.get("positive", []) if isinstance(o, str)], \
        [o for o in objects.get("negative", []) if isinstance(o, str)]


def answer_truth(metas: list[dict]) -> torch.Tensor:
    """(M, M) bool: whether question i's right answer is true of image j, from the object labels. The answer's
    mentioned objects that image i holds are affirmed, those it lacks negated; the answer is true of image j when
    j holds every affirmed object and none of the negated ones. The diagonal is true; a sample without object
    labels (real data without them) is true of its own image only."""
    objects = [_objects(m) for m in metas]
    pos = [set(p) for p, _ in objects]
    neg = [set(n) for _, n in objects]
    truth = torch.eye(len(metas), dtype=torch.bool)
    for i, m in enumerate(metas):
        answer = m[schema.MCQ]["options"][m[schema.MCQ]["answer"]]
        if not pos[i] and not neg[i]:
            continue
        said = _mentions(answer, pos[i] | neg[i])
        affirmed, negated = said & pos[i], said & neg[i]
        for j in range(len(metas)):
            if affirmed <= pos[j] and not (negated & pos[j]):
                truth[i, j] = True
    return truth


def _guard_fields(meta: dict, field: str):
    """(affirmative caption or "", which MCQ options are affirmative) of a sample, for the drift guard."""
    caption = meta.get(schema.CAPTION)
    caption = caption if isinstance(caption, str) else ""
    affirmative = [False] * schema.N_OPTIONS
    if field == schema.MCQ:
        templates = meta[schema.MCQ].get("option_templates")
        if isinstance(templates, list) and len(templates) == schema.N_OPTIONS:
            affirmative = [t == "positive" for t in templates]
    return caption, affirmative


def _image(sample, keys=schema.IMAGE_KEYS) -> Image.Image | None:
    for k in keys:
        if k in sample:
            return Image.open(io.BytesIO(sample[k])).convert("RGB")
    return None


def _text(meta: dict, field: str, rng: random.Random):
    """The training text(s) of a sample for ``field``, or None when missing/malformed."""
    if field == schema.CAPTION:
        value = meta.get(schema.CAPTION)
        return value if isinstance(value, str) and value else None
    if field == schema.NEGCAP:
        caps = meta.get(schema.NEGCAP)
        if not isinstance(caps, list) or not caps or not all(isinstance(c, str) and c for c in caps):
            return None
        return rng.choice(caps)
    if field == schema.MCQ:
        mcq = meta.get(schema.MCQ)
        if not isinstance(mcq, dict):
            return None
        options, answer = mcq.get("options"), mcq.get("answer")
        if (not isinstance(options, list) or len(options) != schema.N_OPTIONS
                or not all(isinstance(o, str) and o for o in options)
                or not isinstance(answer, int) or not 0 <= answer < len(options)):
            return None
        return options, answer
    if field == schema.RELCOMP:
        rel = meta.get(schema.RELCOMP)
        if not isinstance(rel, dict) or not isinstance(rel.get("caption"), str) or not rel["caption"]:
            return None
        negatives = rel.get("negatives")
        if (not isinstance(negatives, list) or not 1 <= len(negatives) <= MAX_NEGATIVES
                or not all(isinstance(n, dict) and isinstance(n.get("text"), str) and n["text"] for n in negatives)):
            return None
        return rel["caption"], [n["text"] for n in negatives]
    raise ValueError(f"unknown field '{field}'")


class _Counter:
    def __init__(self):
        self.n = 0

    def handler(self, exn) -> bool:
        self.n += 1
        return True


def _examples(src, spec: StreamSpec, preprocess, counter: _Counter, seed: int):
    rng = random.Random(seed)
    for sample in src:
        try:
            meta = json.loads(sample["json"])
            text = _text(meta, spec.field, rng)
            image = _image(sample)
            negative = _image(sample, schema.NEGATIVE_IMAGE_KEYS) if spec.field == schema.RELCOMP else None
        except Exception:
            text = image = None
        if text is None or image is None:
            counter.n += 1
            continue
        if spec.field == schema.RELCOMP:
            text = (*text, None if negative is None else preprocess(negative))
        if spec.guard or spec.t2i:
            yield preprocess(image), text, (*_guard_fields(meta, spec.field), meta if spec.t2i else None)
        else:
            yield preprocess(image), text


def _batches(src, spec: StreamSpec, tokenizer, counter: _Counter):
    images, texts, guards = [], [], []
    for image, text, *guard in src:
        images.append(image)
        texts.append(text)
        guards += guard
        if len(images) == spec.batch_size:
            batch = {"images": torch.stack(images)}
            if spec.task == "mcq":
                options = [o for opts, _ in texts for o in opts]
                batch["options"] = tokenizer(options).view(len(texts), schema.N_OPTIONS, -1)
                batch["answers"] = torch.tensor([a for _, a in texts])
            elif spec.task == "itm":
                batch.update(_itm_batch(texts, tokenizer, batch["images"]))
            else:
                batch["texts"] = tokenizer(texts)
            if spec.guard:
                batch["captions"] = tokenizer([c for c, _, _ in guards])
                batch["has_caption"] = torch.tensor([bool(c) for c, _, _ in guards])
                if spec.task == "mcq":
                    batch["option_affirmative"] = torch.tensor([a for _, a, _ in guards])
            if spec.t2i and spec.task == "mcq":
                batch["answer_truth"] = answer_truth([m for _, _, m in guards])
            batch["skipped"] = torch.tensor(counter.n)
            counter.n = 0
            yield batch
            images, texts, guards = [], [], []
    if counter.n:      # skips after the last full batch still get reported
        yield {"skipped": torch.tensor(counter.n)}
        counter.n = 0


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
        counter = _Counter()
        local_seed = hash((*key, rank, worker)) & 0xFFFFFFFF
        if torch.utils.data.get_worker_info() is not None:
            torch.manual_seed(local_seed)      # the augmentations of this pass, in this worker
        readers = world * max(1, nworkers)
        read = wds.tarfile_to_samples(handler=counter.handler)
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
        examples = _examples(iter(pipe), self.spec, self.preprocess, counter, local_seed)
        yield from _batches(examples, self.spec, self.tokenizer, counter)


def loader(stream: Stream, workers: int, persistent: bool = False) -> torch.utils.data.DataLoader:
    """Worker RNGs seeded from (seed, epoch, pass), so a resumed epoch sees the same augmentations."""
    seed = hash((stream.seed, stream.epoch, stream.pass_)) & 0xFFFFFFFF
    return torch.utils.data.DataLoader(stream, batch_size=None, num_workers=workers,
                                       persistent_workers=persistent and workers > 0,
                                       pin_memory=torch.cuda.is_available(),
                                       generator=torch.Generator().manual_seed(seed))


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
        self.skipped = 0
        self._loader = None

    def epoch(self, epoch: int, steps: int, start: int = 0):
        """Batches ``start`` .. ``steps``−1 of ``epoch`` (a resumed epoch re-draws and drops the first ones)."""
        self.skipped = 0
        drawn, pass_ = 0, 0
        while drawn < steps:
            self.stream.set_epoch(epoch, pass_)
            if self._loader is None:
                self._loader = loader(self.stream, self.workers, persistent=True)
            got = 0
            for batch in self._loader:
                self.skipped += int(batch.pop("skipped"))
                if not batch:          # a count of trailing skips, no samples
                    continue
                if drawn >= start:
                    yield batch
                got += 1
                drawn += 1
                if drawn == steps:
                    return
            if got == 0:
                raise RuntimeError(f"stream {self.stream.spec.urls[:2]}... yielded no batch of "
                                   f"{self.stream.spec.batch_size} on this rank: too few samples or shards")
            pass_ += 1


class SyntheticBatches:
    """Random batches of a stream's shapes made on the device: no shards, no decoding, no host copy.

    Images are N(0, 1) at the model's image size; texts fill the whole context (start token, random tokens,
    end-of-text token last), so no step is cheapened by trimming. Seeded by (seed, epoch, rank). What
    ``train.synthetic`` trains on: the step's speed alone, and a cluster tested without data.
    """
    skipped = 0

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
