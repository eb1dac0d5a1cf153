"""SNARE (000_1b4b29f68247e2ac, sections III-B to III-E, tables III-IV): multiple-choice alignment probes.

Each sample is an image and a few captions of known class; we report the share of picks per class (the
paper's "class probability"), ties split evenly. Differences from the reference: ties share the pick instead
of going to the first option, and every share has a bootstrap interval.

- ``snare_negation``: Cor "the X is A and the Y is B" / Wro "the X is not A and the Y is not B".
- ``snare_attribute``: Cor "the A X and the B Y" / Sep "the X and the Y are A and B respectively" /
  Exc "the B X and the A Y" (attribute ownership; A ≠ B).
- ``snare_relation``: Cor "the X is R the Y" / Exc "the Y is R the X" / None "the X and the Y".
- ``snare_spatial``: the four predicates "the X is {to the left of, to the right of, above, below} the Y";
  ``acc`` is the right one's share (the world says "above" where the paper's data says "on").
- ``snare_structure``: an image's caption against its shuffles (content words, non-content words, all);
  a text tower blind to word order splits its picks evenly.

World: samples come from the probe split's ``annotations.jsonl`` (colours, shapes, relations) and its
``retrieval.csv`` captions, the first ``WORLD_SAMPLES`` per task in image order (SNARE would otherwise
be two thirds of the suite's texts, evaluated after every epoch); content words are the generator's vocabulary
(``world_text``). Real data: a CSV per
task, ``snare_<task>.csv`` with ``image_path`` and one column per class (spatial: the four predicates and
``answer``); semantic structure on real captions needs a part-of-speech tagger we cannot install offline, so it
is skipped there unless the CSV already holds the shuffles.
"""
from __future__ import annotations

import json

import numpy as np
import torch

from negft.data import world_text as T
from negft.probes import register
from negft.probes.base import (EvalContext, Dataset, ProbeResult, missing, parse_list, parse_once, read_csv,
                               read_jsonl, resolve)
from negft.probes.stats import choice_shares

CLASSES = {
    "negation": ("cor", "wro"),
    "attribute": ("cor", "sep", "exc"),
    "relation": ("cor", "exc", "none"),
    "spatial": ("left", "right", "above", "below"),
    "structure": ("origin", "shuffle_content", "shuffle_noncontent", "shuffle_all"),
}
WORLD_SAMPLES = 500            # per task on the world
SPATIAL = {"left": "left of", "right": "right of", "above": "above", "below": "below"}
CONTENT = {*T.SETTING_WORDS, *T.FILL_WORDS, "small", "large"}     # + the world's shapes and colours


def negation(x: dict, y: dict) -> list[str]:
    return [f"the {x['shape']} is {x['color']} and the {y['shape']} is {y['color']}",
            f"the {x['shape']} is not {x['color']} and the {y['shape']} is not {y['color']}"]


def attribute(x: dict, y: dict) -> list[str]:
    a, b = x["color"], y["color"]
    return [f"the {a} {x['shape']} and the {b} {y['shape']}",
            f"the {x['shape']} and the {y['shape']} are {a} and {b} respectively",
            f"the {b} {x['shape']} and the {a} {y['shape']}"]


def relation(x: dict, pred: str, y: dict) -> list[str]:
    r = T.PREDICATE_WORDS[pred]
    return [f"the {x['shape']} is {r} the {y['shape']}", f"the {y['shape']} is {r} the {x['shape']}",
            f"the {x['shape']} and the {y['shape']}"]


def spatial(x: dict, y: dict) -> list[str]:
    return [f"the {x['shape']} is {T.PREDICATE_WORDS[p]} the {y['shape']}" for p in SPATIAL.values()]


def shuffles(caption: str, content: set[str], rng) -> list[str]:
    """The caption, then with its content words, its other words, and all words shuffled in place."""
    words = caption.split()
    is_content = [w.strip(",.").lower() in content for w in words]

    def shuffle(which):
        idx = [i for i, c in enumerate(is_content) if which(c)]
        out = list(words)
        for i, j in zip(idx, rng.permutation(idx)):
            out[i] = words[j]
        return " ".join(out)
    return [caption, shuffle(lambda c: c), shuffle(lambda c: not c), shuffle(lambda c: True)]


def world_samples(root) -> dict[str, list[tuple[str, list[str], int]]]:
    """task -> [(image path, options in CLASSES order, index of the true option)] from the world's annotations,
    built once per version of the annotations file (every evaluation of a run asks for the same)."""
    return dict(parse_once(root / "annotations.jsonl", _world_samples))


def _world_samples(annotations):
    root = annotations.parent
    meta = json.loads((root.parent / "world.json").read_text())
    content = CONTENT | set(meta["shapes"]) | set(meta["colors"])
    captions = {r["filepath"]: parse_list(r["captions"])[0] for r in read_csv(root / "retrieval.csv")}
    out = {task: [] for task in CLASSES}
    for n, a in enumerate(read_jsonl(annotations)):
        path, objs, rels = resolve(root, a["image_path"]), a["scene"]["objects"], a["scene"]["relations"]
        rng = np.random.default_rng(n)
        if a["image_path"] in captions:
            out["structure"].append((path, shuffles(captions[a["image_path"]], content, rng), 0))
        if len(objs) >= 2:
            x, y = objs[0], objs[1]
            out["negation"].append((path, negation(x, y), 0))
            if x["color"] != y["color"]:
                out["attribute"].append((path, attribute(x, y), 0))
        if rels:
            i, pred, j = rels[int(rng.integers(len(rels)))]
            out["relation"].append((path, relation(objs[i], pred, objs[j]), 0))
            out["spatial"].append((path, spatial(objs[i], objs[j]), list(SPATIAL.values()).index(pred)))
    return [(task, items[:WORLD_SAMPLES]) for task, items in out.items()]


def real_samples(dataset: Dataset) -> tuple[dict[str, list], dict[str, str]]:
    """(task -> samples as ``world_samples`` gives them, skipped prefix -> why) from ``snare_<task>.csv``."""
    out, skipped, root = {}, {}, dataset.root
    for task, classes in CLASSES.items():
        path = root / f"snare_{task}.csv"
        if not path.exists():
            skipped[f"snare_{task}/{dataset.name}"] = missing(dataset, path) + (
                "; the shuffles of real captions need a part-of-speech tagger that installs offline"
                if task == "structure" else "")
            continue
        rows = read_csv(path)
        if task == "spatial":
            out[task] = [(resolve(root, r["image_path"]), [r[c] for c in classes], classes.index(r["answer"]))
                         for r in rows]
        else:
            out[task] = [(resolve(root, r["image_path"]), [r[c] for c in classes], 0) for r in rows]
    return out, skipped


def load_samples(dataset: Dataset) -> tuple[dict[str, list], dict[str, str]]:
    if (dataset.root / "annotations.jsonl").exists() and (dataset.root.parent / "world.json").exists():
        return world_samples(dataset.root), {}
    return real_samples(dataset)


def _texts(dataset: Dataset) -> list[str]:
    return [o for items in load_samples(dataset)[0].values() for _, opts, _ in items for o in opts]


@register("snare", texts=_texts)
def run(ctx: EvalContext, dataset: Dataset) -> ProbeResult:
    result = ProbeResult()
    tasks, skipped = load_samples(dataset)
    result.skipped.update(skipped)
    for task, items in tasks.items():
        prefix = f"snare_{task}/{dataset.name}"
        if not items:
            result.skipped[prefix] = "no sample of this kind in the probe split"
            continue
        k = len(CLASSES[task])
        images = ctx.encode_images([p for p, _, _ in items])
        texts = ctx.encode_texts([o for _, opts, _ in items for o in opts]).view(len(items), k, -1)
        shares = choice_shares(torch.einsum("nd,nkd->nk", images, texts))
        if task == "spatial":
            right = torch.tensor([r for _, _, r in items])
            result.add(f"{prefix}/acc", shares.gather(1, right.view(-1, 1)).squeeze(1), ctx.n_boot)
            for c, name in enumerate(CLASSES[task]):       # the paper's figure 2: which predicate is preferred
                result.add(f"{prefix}/chose_{name}", shares[:, c], ctx.n_boot)
        else:
            for c, name in enumerate(CLASSES[task]):
                result.add(f"{prefix}/{name}", shares[:, c], ctx.n_boot)
        result.records[prefix] = [{"image_path": p, "options": o, "right": r, "shares": s}
                                  for (p, o, r), s in zip(items, shares.tolist())]
    return result
