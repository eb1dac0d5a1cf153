"""The module DeepSpeed trains: an open_clip model plus one objective, chosen by ``loss.name``.

A step's batch is keyed by stream task (``contrastive``, ``mcq``, ``itm``; streams sharing a task are
concatenated first). ``Task.forward`` encodes every image and text of the step in one pass per tower and
normalises the features in fp32; the objective's terms (``negft.losses.OBJECTIVES``) score them and are summed.
Adding a loss term is one class in ``negft/losses/`` (a baseline: one module and one registry line); nothing here
changes.
"""
from __future__ import annotations

import hashlib

import torch
import torch.nn.functional as F
from torch import nn

from negft.losses import HOST, MAX_LOGIT_SCALE, OBJECTIVES, Objective, Step, Term, batch_fields, build_terms, rows_of
from negft.models import encode_image_tokens, encode_text_grouped, encode_text_tokens, trim_width

MAX_CACHED_IMAGES = 100_000     # FrozenImageFeatures' bound: 100k × 512 fp32 features is 200 MB


def negative_images(batch: dict[str, dict], host: dict | None) -> torch.Tensor | None:
    """The rows of the itm batch that have a negative image (read from the host's copy of the mask where the step
    has one), None without an itm batch."""
    if "itm" not in batch:
        return None
    itm = batch["itm"]
    has = (host or batch)["itm"]["has_negative_image"]
    return rows_of(has, itm["has_negative_image"].device)


def step_texts(batch: dict[str, dict]) -> list[torch.Tensor]:
    """The token rows of a step's one text pass, before the terms' own: ``step_inputs``' texts."""
    texts = []
    if "contrastive" in batch:
        texts.append(batch["contrastive"]["texts"])
    if "mcq" in batch:
        texts.append(batch["mcq"]["options"].flatten(0, 1))
    if "itm" in batch:
        texts += [batch["itm"]["texts"], batch["itm"]["negatives"].flatten(0, 1)]
    return texts


def step_inputs(batch: dict[str, dict], negative_rows: torch.Tensor | None = None
                ) -> tuple[list[torch.Tensor], list[torch.Tensor], dict, dict]:
    """The images and token rows of a step, in ``negft.config.STREAM_TASKS`` order (``step_features`` splits them
    back), and each stream task's rows among them: ``(images, texts, image_rows, text_rows)``, the rows a slice per
    task (``losses.Step.image_rows`` / ``text_rows``). ``negative_rows``: the itm rows that have a negative image
    (``negative_images``)."""
    images, texts, image_rows, text_rows = [], [], {}, {}

    def add(task, imgs, txts):
        i, t = sum(x.shape[0] for x in images), sum(x.shape[0] for x in texts)
        images.extend(imgs)
        texts.extend(txts)
        image_rows[task] = slice(i, i + sum(x.shape[0] for x in imgs))
        text_rows[task] = slice(t, t + sum(x.shape[0] for x in txts))

    if "contrastive" in batch:
        add("contrastive", [batch["contrastive"]["images"]], [batch["contrastive"]["texts"]])
    if "mcq" in batch:
        add("mcq", [batch["mcq"]["images"]], [batch["mcq"]["options"].flatten(0, 1)])
    if "itm" in batch:
        itm = batch["itm"]
        if negative_rows is None:
            negative_rows = negative_images(batch, None)
        add("itm", [itm["images"], itm["negative_images"][negative_rows]],
            [itm["texts"], itm["negatives"].flatten(0, 1)])
    return images, texts, image_rows, text_rows


def step_features(batch: dict[str, dict], img: torch.Tensor, txt: torch.Tensor,
                  host: dict | None = None, negative_rows: torch.Tensor | None = None) -> dict:
    """Normalised features per stream task: ``contrastive`` = (images, texts); ``mcq`` = (images, options
    (M, C, D), answers, per-question weights or None); ``itm`` = the keyword arguments of ``ITMTripletLoss``
    (with the rows that have a negative caption and a negative image, from the host's copies of the masks where
    ``host`` has them)."""
    img, txt = F.normalize(img, dim=-1), F.normalize(txt, dim=-1)
    parts = {}
    if "contrastive" in batch:
        b = batch["contrastive"]["images"].shape[0]
        parts["contrastive"] = (img[:b], txt[:b])
        img, txt = img[b:], txt[b:]
    if "mcq" in batch:
        mcq = batch["mcq"]
        m, c = mcq["options"].shape[:2]
        parts["mcq"] = (img[:m], txt[:m * c].view(m, c, -1), mcq["answers"], mcq.get("mcq_weight"))
        img, txt = img[m:], txt[m * c:]
    if "itm" in batch:
        itm = batch["itm"]
        b, k = itm["negatives"].shape[:2]
        has = itm["has_negative_image"]
        if negative_rows is None:
            negative_rows = negative_images(batch, host)
        negative_image = torch.zeros_like(img[:b])
        negative_image[negative_rows] = img[b:]
        parts["itm"] = {"image": img[:b], "positive": txt[:b], "negatives": txt[b:].view(b, k, -1),
                        "negative_mask": itm["negative_mask"], "negative_image": negative_image,
                        "has_negative_image": has, "negative_rows": negative_rows,
                        "anchors": rows_of((host or batch)["itm"]["negative_mask"].any(1), has.device)}
    return parts


class Task(nn.Module):
    """One objective over a dual encoder: ``forward(batch) -> (loss, logs)``, the sum of its terms.

    Every image is encoded in one pass of the image tower, every text (the terms' own texts too, ``Term.texts``)
    in one pass of the text tower, trimmed to the step's longest (on a CPU, in groups of rows of similar length:
    ``encode_text_grouped``); each term gets the features (``losses.Step``) and returns its weighted value and
    its logs, which are merged.

    ``logit_scale`` is clamped here, in forward: under ZeRO an in-place clamp of the parameter would be
    overwritten from the fp32 master copy.

    The loss is computed in fp32 from the towers' features (a no-op for an fp32 model; autocast is off for it
    under ``train.autocast``): bf16 cosine similarities keep about 3 significant digits (MCQ options closer
    than about 0.004 tie at any scale), the loss is rounded to 1/32 near ln 256, and the clamp at ln 100
    rounds to 4.594 (a largest scale of 98.9).

    The terms are plain objects, not submodules: what they hold (the drift guard's frozen base) is not in
    ``state_dict()`` or ``parameters()``.
    """

    def __init__(self, clip: nn.Module, objective: Objective, terms: list[Term]):
        super().__init__()
        self.clip = clip
        self.objective = objective
        self.terms = tuple(terms)
        # a FrozenImageFeatures when the image tower is frozen and the images are not augmented (use_image_cache)
        object.__setattr__(self, "image_features", None)

    def term(self, name: str) -> Term | None:
        """The term of that name, None if the objective does not have it on."""
        return next((t for t in self.terms if t.name == name), None)

    def term_state(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each term's ``Term.state`` (where it has one), for a checkpoint."""
        return {t.name: {k: v.detach().cpu().clone() for k, v in st.items()} for t in self.terms if (st := t.state())}

    def load_term_state(self, states: dict[str, dict[str, torch.Tensor]]) -> None:
        """Give each term its state from a checkpoint (``term_state``); a term that has one and finds none there is
        an error: the checkpoint was written by a negft that did not keep it."""
        for t in self.terms:
            if t.state():
                if t.name not in states:
                    raise ValueError(f"the checkpoint holds no state of loss term '{t.name}' (a negft before it kept "
                                     "one wrote it): start a new run from its weights instead of resuming")
                t.load_state(states[t.name])

    def use_image_cache(self) -> None:
        """Keep the frozen image tower's features (FrozenImageFeatures); the caller checks that the tower is
        frozen, in eval mode, on the CPU, and that the training transform does not augment."""
        object.__setattr__(self, "image_features", FrozenImageFeatures())

    def forward(self, batch: dict[str, dict]):
        reads = self.objective.reads
        unread = [k for k in batch if k not in reads]
        if unread:
            raise ValueError(f"loss.name={self.objective.name} reads {', '.join(reads)} batches, "
                             f"not {', '.join(unread)}")
        scale = self.clip.logit_scale.float().clamp(0, MAX_LOGIT_SCALE).exp()
        # the host's copy of each batch (engine.batch_to), where the step has them all: the texts' trim and the
        # rows a mask selects are read there, so no op waits for the device
        host = {k: b[HOST] for k, b in batch.items()} if all(HOST in b for b in batch.values()) else None
        batch = {k: {f: v for f, v in b.items() if f != HOST} for k, b in batch.items()}
        negative_rows = negative_images(batch, host)
        images, texts, image_rows, text_rows = step_inputs(batch, negative_rows)
        own = [term.texts(batch) for term in self.terms]      # the terms' texts, in the same text pass
        counts = [sum(t.shape[0] for t in rows) for rows in own]
        texts = texts + [t for rows in own for t in rows]
        images = torch.cat(images)
        host_texts = None       # the host's copy of the text pass's rows, where it has them all
        if host is not None:
            rows = step_texts(host) + [t for term in self.terms for t in term.texts(host)]
            host_texts = torch.cat([t.reshape(-1, t.shape[-1]) for t in rows]) if rows else None
        tokens = None
        if "itm" in batch and any(term.tokens for term in self.terms):
            img, patches = encode_image_tokens(self.clip, images)
            width = None if host_texts is None else trim_width(self.clip, [host_texts])
            txt, text_tokens, token_mask = encode_text_tokens(self.clip, torch.cat(texts), width)
            img, txt = img.float(), txt.float()
            tokens = itm_tokens(batch["itm"], patches[image_rows["itm"]].float(),
                                text_tokens[text_rows["itm"]].float(), token_mask[text_rows["itm"]])
        else:
            if self.image_features is not None:
                img = self.image_features(self.clip.encode_image, images)
            else:
                img = self.clip.encode_image(images).float()
            txt = encode_text_grouped(self.clip, torch.cat(texts), host_texts).float()
        extra, n = {}, sum(counts)
        if n:
            txt, rest = txt[:-n], txt[-n:]
            start = 0
            for term, count in zip(self.terms, counts):
                if count:
                    extra[term.name] = rest[start:start + count]
                    start += count
        with torch.autocast(img.device.type, enabled=False):     # the scores in fp32 under train.autocast too
            step = Step(batch, scale, step_features(batch, img, txt, host, negative_rows), img, txt, extra,
                        encode_host_trimmed, image_rows, text_rows, host, tokens)
            total, logs = None, {}
            for term in self.terms:
                value, term_logs = term(step)
                if value is not None:
                    total = value if total is None else total + value
                logs.update(term_logs)
        logs["logit_scale"] = scale.detach()
        return total, logs


def itm_tokens(itm: dict, patches: torch.Tensor, text_tokens: torch.Tensor, token_mask: torch.Tensor) -> dict:
    """The itm batch's patch and token features as ``TokenPatchHardNegativeLoss`` takes them, from the rows of its
    images (its images, then its negative images) and of its texts (its captions, then their K negatives each)."""
    b, k = itm["negatives"].shape[:2]
    return {"itm": {"image_tokens": patches[:b], "text_tokens": text_tokens[:b], "token_mask": token_mask[:b],
                    "negative_tokens": text_tokens[b:].view(b, k, *text_tokens.shape[1:]),
                    "negative_token_mask": token_mask[b:].view(b, k, -1)}}


def encode_host_trimmed(model, tokens: torch.Tensor, host: torch.Tensor | None = None) -> torch.Tensor:
    """``encode_text_grouped``, cut where the host's copy of the tokens (``host``, where the caller has it) says."""
    return encode_text_grouped(model, tokens, host)


class FrozenImageFeatures:
    """The features of a frozen image tower, kept by the images' pixel content. When the image tower does not train
    and the training transform does not augment (the world's default), a sample's image always gives the same
    features; the NegCap and NegMCQ streams read the same images and every epoch reads them again, so the demo
    encodes each image about three times. Only the misses are encoded (in one batch); at most
    ``MAX_CACHED_IMAGES`` are kept (then new images are encoded and not kept). CPU only: on a GPU, reading the
    pixels back to hash them would cost about what encoding them does."""

    def __init__(self, limit: int = MAX_CACHED_IMAGES):
        self.features: dict[bytes, torch.Tensor] = {}
        self.limit = limit

    def __call__(self, encode, images: torch.Tensor) -> torch.Tensor:
        keys = [hashlib.blake2b(row.contiguous().flatten().view(torch.uint8).numpy().tobytes(),
                                digest_size=16).digest() for row in images.detach()]
        miss = [i for i, k in enumerate(keys) if k not in self.features]
        fresh = {}
        if miss:
            encoded = encode(images[miss]).float()
            fresh = dict(zip((keys[i] for i in miss), encoded))
            for k, f in fresh.items():
                if len(self.features) < self.limit:
                    self.features[k] = f
        return torch.stack([fresh[k] if k in fresh else self.features[k] for k in keys])


def stream_extras(loss_cfg, task: str) -> dict:
    """The keyword arguments of a ``task`` stream's ``data.pipeline.StreamSpec`` for the objective's terms: the
    batch fields they need (``Term.fields``)."""
    return {"fields": batch_fields(loss_cfg, task)}


def build_task(clip: nn.Module, loss_cfg, rank: int = 0, world_size: int = 1, tower: str = "vt") -> Task:
    """The ``loss.name`` objective over ``clip`` with its terms that are on (``tower``: the towers that train; the
    drift guard freezes a copy of them as they are now, the base)."""
    terms = build_terms(loss_cfg, rank, world_size)
    for term in terms:
        term.attach(clip, tower)
    return Task(clip, OBJECTIVES[loss_cfg.name], terms)
