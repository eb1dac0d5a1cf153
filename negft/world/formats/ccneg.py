"""The world's probe images as CC-Neg, in its released layout (jaisidhsingh/CoN-CLIP's loader,
``src/data/evaluation_datasets.py``: ``ccneg_preprocessed.pt``, a torch file of ``{"image_paths": [...],
"annotations": [{"json": {"caption", ...}, "sop_data": {"negative-prompt", ...}}, ...]}``).

Where the file sits: at the top of the split folder, the same relative path as under the manifest's root
(``$NEGFT_DATA/ccneg/ccneg_preprocessed.pt``). Image paths are written as the release writes them, under the
authors' ``/workspace/datasets/cc3m/``, which the reader replaces by the dataset folder: the world's
``/workspace/datasets/cc3m/images/000012.png`` is the split's ``images/000012.png``. Saved with ``torch.save`` of
dicts, lists and strings only, which ``torch.load(weights_only=True)`` reads.

Per probe image, one row, all in the evaluation split (the world's file is shorter than its 40,000 rows): the
caption names every object (held-out affirmative phrasings, with the scene's background) and is true of the
scene; the negated caption denies one object the scene has, in a held-out negation phrasing ("..., with no sign
of a star"), so it is false of it. Randomness: ``formats.rng(seed, split_dir, "ccneg")`` only.
"""
from __future__ import annotations

from pathlib import Path

import torch

from negft import phrasings
from negft.world import formats

FILE = "ccneg_preprocessed.pt"
PREFIX = "/workspace/datasets/cc3m/"


def _pick(rng, items):
    return items[int(rng.random() * len(items))]


def example(scene: dict, rng, affirm=phrasings.AFFIRM_HELD_OUT, negate=phrasings.NEGATE_HELD_OUT) -> tuple[str, str]:
    """(caption, negated caption) of one scene, in held-out phrasings unless told (the fine-tuning split's example,
    negft/world/formats/ccneg_train.py, says it in training ones)."""
    objects = scene["objects"]
    bg = _pick(rng, phrasings.BACKGROUND_PHRASES[scene["background"]])
    order = [int(i) for i in rng.permutation(len(objects))]
    phrases = [phrasings.with_article(f"{objects[i]['color']} {objects[i]['shape']}") for i in order]
    caption = _pick(rng, affirm).format(objs=phrasings.join_list(phrases), bg=bg)
    denied = objects[order[-1]]["shape"]
    rest = f"{phrasings.join_list(phrases[:-1])} {bg}" if len(phrases) > 1 else f"a scene {bg}"
    negated = phrasings.negate_text(rest, denied, rng, templates=negate)
    return caption[0].upper() + caption[1:], negated


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    rng = formats.rng(seed, split_dir, "ccneg")
    paths, annotations = [], []
    for rec in main:
        caption, negated = example(rec["scene"], rng)
        paths.append(PREFIX + rec["image_path"])
        annotations.append({"json": {"caption": caption, "key": Path(rec["image_path"]).stem},
                            "sop_data": {"negative-prompt": negated}})
    torch.save({"image_paths": paths, "annotations": annotations}, Path(split_dir) / FILE)
