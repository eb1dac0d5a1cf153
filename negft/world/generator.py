"""The embedded world: procedurally drawn, fully annotated scenes with captions (README: the embedded world).

``build_world(out, seed, size)`` writes

- ``pretrain/``, ``finetune/`` and ``relcomp/`` webdataset shards (schema.py field names), and on request the
  baselines' own splits (``METHOD_SPLITS``: ``ccneg``, ``negclip``, ``ceclip``, ``tripletclip``,
  ``tripletclip_pretrain``; negft/world/methods.py),
- ``val/`` and ``test/`` probe folders with NegBench-format CSVs (mcq, retrieval, retrieval_neg,
  zeroshot + classes.json), RelComp pairs (relcomp.csv), every other benchmark in its released layout
  (``negft.world.formats``: SugarCrepe, Winoground, ARO, Probe-R/C/B, VLU, a zero-shot folder set, image
  features, CREPE, SPEC) and ``annotations.jsonl`` (each image's full annotation, for tests and users; no probe reads it),
- ``world.json`` (the meta dict, also returned).

Every image's randomness comes from ``numpy.random.default_rng([seed, split_id, index])``, so the output
is identical whatever the number of workers. Held out from training: ~10% of colour-shape combinations
(they appear only in val/test images, at a raised rate) and some caption phrasings (phrasings.py).
"""

from __future__ import annotations

import csv
import json
import multiprocessing as mp
import os
import tarfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

from negft import phrasings
from negft.cache_lock import cache_lock
import negft.world.formats as formats
from negft.data.shards import dumps, tar_add
from negft.io import failing_writes, move_into_place, scratch_dir
from negft.data.schema import CAPTION, MCQ, MCQ_CSV_COLUMNS, NEGATIVE_IMAGE_KEYS, NEGCAP, OBJECTS, \
    PROBE_B_FILLERS, PROBE_C_KINDS, RELCOMP, RELCOMP_CSV_COLUMNS, SCENE, \
    RETRIEVAL_CSV_COLUMNS, ZEROSHOT_CSV_COLUMNS
from negft.world.render import BACKGROUNDS, COLORS, FILLS, IMAGE_SIZE, ROTATE, SHAPES, \
    SIZES as OBJ_SIZES, background_texture, png_bytes, render

GENERATOR_VERSION = "world-20"
SHARD_SIZE = 1000
PROBE_CHUNK = 250

SIZES: dict[str, dict] = {
    "tiny": {"pretrain": 600, "finetune": 300, "relcomp": 200, "val": 100, "test": 100},
    "demo": {"pretrain": 10240, "finetune": 12000, "relcomp": 6000, "val": 500, "test": 1500},
    "full": {"pretrain": 100000, "finetune": 100000, "relcomp": 50000, "val": 2000, "test": 5000},
}
SPLIT_IDS = {"pretrain": 0, "finetune": 1, "val": 2, "test": 3, "val_zeroshot": 4, "test_zeroshot": 5,
             "relcomp": 6, "ccneg": 7, "negclip": 8, "ceclip": 9, "tripletclip": 10, "tripletclip_pretrain": 11}
TRAIN_SPLITS = ("pretrain", "finetune", "relcomp")       # what a world build draws unless asked for others
# each baseline's own kind of data (negft/world/methods.py), drawn when a recipe's stream names one
METHOD_SPLITS = ("ccneg", "negclip", "ceclip", "tripletclip", "tripletclip_pretrain")
# split -> (train_sample, count): registered by negft/world/methods.py, which the package imports (methods draws
# with this module's primitives, so this module cannot import it)
METHOD_SAMPLERS: dict = {}
ALL_TRAIN_SPLITS = TRAIN_SPLITS + METHOD_SPLITS
PROBE_SPLITS = ("val", "test")

# context priors: unnormalised weights over SHAPES (default 1); objects and plausible absent objects
# are drawn from these
_BOOST = {
    "beach": {"star": 4, "circle": 4, "triangle": 2, "heart": 2, "crescent": 0.5},
    "grass": {"heart": 4, "diamond": 2, "cross": 2, "arrow": 3, "triangle": 2, "crescent": 0.5},
    "night": {"star": 6, "crescent": 6, "circle": 2, "diamond": 2, "square": 0.5},
    "snow": {"hexagon": 5, "triangle": 3, "circle": 2, "cross": 2, "heart": 0.5},
    "room": {"square": 5, "ring": 3, "pentagon": 2, "heart": 2, "arrow": 2, "star": 0.5},
}
CONTEXT_PRIORS = {bg: [float(_BOOST[bg].get(s, 1.0)) for s in SHAPES] for bg in BACKGROUNDS}
N_OBJECTS_P = (0.4, 0.3, 0.2, 0.1)         # P(1..4 objects)
# the pretraining corpus leans to single-object images, as alt-text corpora lean to one main subject
PRETRAIN_N_OBJECTS_P = (0.7, 0.15, 0.1, 0.05)
_N_OBJ_CDF = {"pretrain": np.cumsum(PRETRAIN_N_OBJECTS_P)[:-1], "default": np.cumsum(N_OBJECTS_P)[:-1]}
_BG_NAMES = list(BACKGROUNDS)
HELD_OUT_COMBO_FRACTION = 0.1
PROBE_HELD_OUT_COMBO_P = 0.3               # probe splits: P(an object takes a held-out colour of its shape)
PROBE_HELD_OUT_MCQ_P = 0.5                 # probe MCQs: P(an option uses a held-out phrasing)
ALT_TEXT_DETAIL = 0.3                      # alt-text names the objects, and their attributes less often
ALT_TEXT_BG_P = 0.1                        # ... and rarely the setting (a shortcut that slows shape learning)
GRID = 8                                   # objects sit on the 8-px patch grid of the tiny ViT
REL_MARGIN = 4                             # px between centres before a relation holds (> half a cell)
# probe images per split with Probe-B variants (8-12 images each) and with a Probe-C pair, by world size
PROBE_B_SAMPLES = {"tiny": 10, "demo": 200, "full": 1000}
PROBE_C_SAMPLES = {"tiny": 50, "demo": 500, "full": 2000}
PATCH = 24                                 # side of Probe-B's filler patch on the background (px)


# ------------------------------------------------------------------ scenes
def held_out_combos(seed: int) -> list[list[str]]:
    """~10% of colour-shape combos, at most one per shape, chosen from the seed."""
    rng = np.random.default_rng([seed, 1000])
    k = round(HELD_OUT_COMBO_FRACTION * len(SHAPES) * len(COLORS))
    shapes = [SHAPES[i] for i in rng.permutation(len(SHAPES))[:min(k, len(SHAPES))]]
    colors = list(COLORS)
    return sorted([[colors[int(rng.integers(len(colors)))], s] for s in shapes], key=lambda c: c[1])


def _prior_sample(bg: str, k: int, rng, exclude=()) -> list[str]:
    """k distinct shapes drawn without replacement, weighted by the context prior (Efraimidis-Spirakis)."""
    keys = rng.random(len(SHAPES)) ** _INV_PRIORS[bg]
    for s in exclude:
        keys[SHAPES.index(s)] = -1.0
    return [SHAPES[int(i)] for i in np.argsort(-keys, kind="stable")[:k]]


_INV_PRIORS = {bg: 1.0 / np.array(w) for bg, w in CONTEXT_PRIORS.items()}


def relations(objs: list[dict]) -> list[list]:
    rel = []
    for i, a in enumerate(objs):
        for j, b in enumerate(objs):
            if i == j:
                continue
            if a["x"] < b["x"] - REL_MARGIN:
                rel.append([i, "left of", j])
            if a["x"] > b["x"] + REL_MARGIN:
                rel.append([i, "right of", j])
            if a["y"] < b["y"] - REL_MARGIN:
                rel.append([i, "above", j])
            if a["y"] > b["y"] + REL_MARGIN:
                rel.append([i, "below", j])
    return rel


def _apart(p, q) -> bool:
    """Boxes (x0, y0, x1, y1) with at least a pixel between them."""
    return p[2] + 1 <= q[0] or q[2] + 1 <= p[0] or p[3] + 1 <= q[1] or q[3] + 1 <= p[1]


def _place(px: int, boxes: list, rng, tries: int = 40):
    if not boxes:
        tries = 1
    cells = (IMAGE_SIZE - px - 1) // GRID + 1
    for cx, cy in rng.integers(0, cells, (tries, 2)).tolist():
        x0, y0 = GRID * cx + 1, GRID * cy + 1
        box = (x0, y0, x0 + px, y0 + px)
        if all(_apart(box, b) for b in boxes):
            return box
    return None


def sample_scene(rng, held_out: set, probe: bool, n_objects: int | None = None, shapes=None,
                 split: str = "default") -> dict:
    """Background, 1-4 objects with distinct shapes, non-overlapping boxes, and pairwise relations.

    Training scenes never use a held-out (colour, shape); probe scenes use them at a raised rate.
    Objects carry private drawing params ``_px``/``_angle`` that ``strip_private`` removes.
    """
    bg = _BG_NAMES[int(rng.random() * len(_BG_NAMES))]
    if n_objects is None:
        n_objects = int(np.searchsorted(_N_OBJ_CDF.get(split, _N_OBJ_CDF["default"]), rng.random(),
                                        side="right")) + 1
    shapes = shapes or _prior_sample(bg, n_objects, rng)
    colors = list(COLORS)
    objs, boxes = [], []
    for shape in shapes:
        held = [c for c, s in held_out if s == shape]
        if probe and held and rng.random() < PROBE_HELD_OUT_COMBO_P:
            color = held[int(rng.random() * len(held))]
        else:
            allowed = colors if probe else [c for c in colors if (c, shape) not in held_out]
            color = allowed[int(rng.random() * len(allowed))]
        size = "small" if rng.random() < 0.5 else "large"
        fill = FILLS[int(rng.random() * len(FILLS))]
        px = OBJ_SIZES[size]
        box = _place(px, boxes, rng)
        if box is None and size == "large":
            size, px = "small", OBJ_SIZES["small"]
            box = _place(px, boxes, rng)
        if box is None:
            continue  # no room: drop the object (never happens for the first one)
        # rotation in 3-degree steps (masks are cached per step)
        angle = 3.0 * round(rng.uniform(-ROTATE[shape], ROTATE[shape]) / 3) if ROTATE[shape] else 0.0
        boxes.append(box)
        objs.append({"shape": shape, "color": color, "size": size, "fill": fill,
                     "x": box[0] + px // 2, "y": box[1] + px // 2, "bbox": list(box),
                     "_px": px, "_angle": angle})
    return {"background": bg, "objects": objs, "relations": relations(objs)}


def strip_private(scene: dict) -> dict:
    return {**scene, "objects": [{k: v for k, v in o.items() if not k.startswith("_")}
                                 for o in scene["objects"]]}


def _absent(scene: dict, k: int, rng) -> list[str]:
    present = {o["shape"] for o in scene["objects"]}
    return _prior_sample(scene["background"], k, rng, exclude=present)


# ------------------------------------------------------------------ samples
def _draw(split: str, seed: int, index: int, held_out: set, probe: bool):
    """(rng, png, public scene, present shapes, (private scene, redraw)) of one image; its rng continues
    into its texts.

    ``redraw(objects)`` renders other objects on the same background with the same colour jitter
    (the second image of a RelComp pair). The ``relcomp`` split draws 2-4 objects until two are related.
    """
    rng = np.random.default_rng([seed, SPLIT_IDS[split], index])
    while True:
        n_objects = 2 + int(rng.random() * 3) if split == "relcomp" else None
        private = sample_scene(rng, held_out, probe=probe, n_objects=n_objects, split=split)
        if split != "relcomp" or private["relations"]:
            break
    state = rng.bit_generator.state
    png = png_bytes(render(private, rng))

    def redraw(objects: list[dict], backdrop=None, keep=None) -> bytes:
        again = np.random.default_rng()
        again.bit_generator.state = state
        return png_bytes(render({**private, "objects": objects}, again, backdrop=backdrop, keep=keep))

    scene = strip_private(private)
    return rng, png, scene, [o["shape"] for o in scene["objects"]], (private, redraw)


def train_sample(split: str, seed: int, index: int, held_out: set) -> tuple[bytes, dict, bytes | None]:
    """(png, json record, hard-negative png or None) of one training image."""
    if split in METHOD_SPLITS:
        return METHOD_SAMPLERS[split][0](split, seed, index, held_out)
    rng, png, scene, present, (private, redraw) = _draw(split, seed, index, held_out, probe=False)
    rec = {CAPTION: phrasings.affirmative_caption(scene, rng, detail=ALT_TEXT_DETAIL, bg_p=ALT_TEXT_BG_P)}
    negative_png = None
    if split == "pretrain":
        rec[OBJECTS] = {"positive": present, "negative": []}
    elif split == "relcomp":
        rec[RELCOMP], objs = relcomp_example(private, rng, held_out)
        negative_png = redraw(objs) if objs is not None else None
        rec[OBJECTS] = {"positive": present, "negative": []}
    else:
        absent = _absent(scene, 3, rng)
        rec[NEGCAP] = [phrasings.negated_caption(scene, a, rng) for a in absent]
        rec[MCQ] = phrasings.make_mcq(present, absent, rng, option_objects=True)
        rec[OBJECTS] = {"positive": present, "negative": absent}
    rec[SCENE] = scene
    return png, rec, negative_png


def probe_sample(split: str, seed: int, index: int, held_out: set, size: str = "demo") -> tuple[bytes, dict]:
    rng, png, scene, present, (private, redraw) = _draw(split, seed, index, held_out, probe=True)
    absent = _absent(scene, len(phrasings.NEGATE_HELD_OUT), rng)
    rec = {
        "mcq": phrasings.make_mcq(present, absent, rng, held_out_p=PROBE_HELD_OUT_MCQ_P),
        "retrieval": [phrasings.affirmative_caption(scene, rng, templates=(t,), subset_p=0.0)
                      for t in phrasings.AFFIRM_HELD_OUT],
        "retrieval_neg": [phrasings.negated_caption(scene, a, rng, templates=(t,), subset_p=0.0)
                          for t, a in zip(phrasings.NEGATE_HELD_OUT, absent)],
        "negative": absent,
        "scene": scene,
        "relcomp": relcomp_pair(private, rng, redraw),
    }
    # Probe-B and Probe-C draw from their own stream, so they leave every other output of the scene unchanged
    extra = np.random.default_rng([seed, SPLIT_IDS[split], index, 1])
    if index < PROBE_B_SAMPLES[size]:
        rec["probe_b"] = probe_b_variants(private, extra, redraw)
    if index < PROBE_C_SAMPLES[size]:
        rec["probe_c"] = probe_c_pair(private, extra, redraw)
    return png, rec


def _filler(name: str, background: str, rng) -> Image.Image:
    """A Probe-B filler canvas: black, gray, Gaussian noise, or another (object-free) background."""
    if name == "noise":
        noise = rng.normal(128.0, 48.0, (IMAGE_SIZE, IMAGE_SIZE, 3))
        return Image.fromarray(np.clip(noise, 0, 255).astype(np.uint8), "RGB")
    if name == "scene":
        others = [b for b in BACKGROUNDS if b != background]
        return background_texture(others[int(rng.random() * len(others))], int(rng.random() * 4)).copy()
    return Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), {"black": (0, 0, 0), "gray": (128, 128, 128)}[name])


def probe_b_variants(private: dict, rng, redraw) -> dict:
    """Probe-B images of a probe scene (the Probe-R/C/B paper, section 3.3), per filler: ``patch`` (x̃0, a
    PATCH-px square of the filler on the background), ``bg`` (x̃1 of Probe-B_MR, the background replaced)
    and, with 2+ objects, ``one`` (x̃1 of Probe-B_R, background and every object but ``kept`` replaced).
    Objects are drawn over the filler and are pixel-identical to the original's."""
    objects = private["objects"]
    kept = int(rng.random() * len(objects))
    images = {}
    for name in PROBE_B_FILLERS:
        fill = _filler(name, private["background"], rng)
        at = tuple(int(v) for v in rng.integers(0, IMAGE_SIZE - PATCH + 1, 2))

        def patched(bg, fill=fill, at=at):
            bg.paste(fill.crop((*at, at[0] + PATCH, at[1] + PATCH)), at)
            return bg

        images[f"{name}_patch"] = redraw(objects, backdrop=patched)
        images[f"{name}_bg"] = redraw(objects, backdrop=lambda bg, fill=fill: fill.copy())
        if len(objects) > 1:
            images[f"{name}_one"] = redraw(objects, backdrop=lambda bg, fill=fill: fill.copy(), keep={kept})
    return {"kept": kept, "images": images}


def _swapped(objects: list[dict], i: int, kind: str, new_shape: str) -> list[dict] | None:
    """The objects with object i's size flipped (``composition``) or its shape replaced (``object``); None
    where the flipped size does not fit."""
    objs = [dict(o) for o in objects]
    o = objs[i]
    if kind == "object":
        limit = ROTATE[new_shape]
        o["shape"], o["_angle"] = new_shape, max(-limit, min(limit, o["_angle"]))
        return objs
    o["size"] = "small" if o["size"] == "large" else "large"
    px = OBJ_SIZES[o["size"]]
    x0, y0 = o["bbox"][:2]
    o["bbox"], o["_px"], o["x"], o["y"] = [x0, y0, x0 + px, y0 + px], px, x0 + px // 2, y0 + px // 2
    fits = max(o["bbox"][2:]) <= IMAGE_SIZE and all(_apart(o["bbox"], p["bbox"]) for k, p in enumerate(objs)
                                                    if k != i)
    return objs if fits else None


def probe_c_pair(private: dict, rng, redraw) -> dict:
    """A Probe-C pair (the Probe-R/C/B paper, section 3.2): one object with its size swapped for the antonym
    (kind ``composition``: "a large star" / "a small star") or its shape swapped for one absent from the
    scene (kind ``object``: "a red star" / "a red heart"). Caption k is true of image k only."""
    objects = private["objects"]
    absent = [s for s in SHAPES if s not in {o["shape"] for o in objects}]
    new_shape = absent[int(rng.random() * len(absent))]
    want = PROBE_C_KINDS[int(rng.random() * 2)]
    for kind in (want, *[k for k in PROBE_C_KINDS if k != want]):
        for i in rng.permutation(len(objects)).tolist():
            objs = _swapped(objects, i, kind, new_shape)
            if objs is not None:
                words = ("size", "shape") if kind == "composition" else ("color", "shape")
                caption_0, caption_1 = (phrasings.with_article(" ".join(o[w] for w in words))
                                        for o in (objects[i], objs[i]))
                return {"kind": kind, "caption_0": caption_0, "caption_1": caption_1, "png_1": redraw(objs)}
    raise AssertionError("an object swap always fits")


def _pair_objects(objects: list[dict], i: int, pred: str, j: int, kind: str,
                  held_out: set = frozenset()) -> list[dict] | None:
    """Objects of the pair's second image, or None when ``kind`` cannot make one here.

    ``relation``: the two objects trade grid-aligned top-left corners; kept only if the relation then
    reverses and no boxes overlap. ``attribute``: they trade colours (which must differ, and must not
    make a ``held_out`` colour-shape combination).
    """
    objs = [dict(o) for o in objects]
    a, b = objs[i], objs[j]
    if kind == "attribute":
        if a["color"] == b["color"] or (b["color"], a["shape"]) in held_out or (a["color"], b["shape"]) in held_out:
            return None
        a["color"], b["color"] = b["color"], a["color"]
        return objs
    (ax, ay), (bx, by) = a["bbox"][:2], b["bbox"][:2]
    for o, (x0, y0) in ((a, (bx, by)), (b, (ax, ay))):
        o["bbox"] = [x0, y0, x0 + o["_px"], y0 + o["_px"]]
        o["x"], o["y"] = x0 + o["_px"] // 2, y0 + o["_px"] // 2
    boxes = [o["bbox"] for o in objs]
    fits = all(_apart(p, q) for k, p in enumerate(boxes) for q in boxes[k + 1:]) and \
        all(max(box[2:]) <= IMAGE_SIZE for box in boxes)
    rel = relations(objs)
    return objs if fits and [i, pred, j] not in rel and [i, phrasings.OPPOSITE[pred], j] in rel else None


def _second_image(private: dict, triple: list, rng, held_out: set = frozenset()):
    """(kind, objects) of an image where ``triple``'s caption is false, trying a random kind first."""
    i, pred, j = triple
    want = "attribute" if rng.random() < 0.5 else "relation"
    for kind in (want, "relation" if want == "attribute" else "attribute"):
        objs = _pair_objects(private["objects"], i, pred, j, kind, held_out)
        if objs is not None:
            return kind, objs
    return None, None


def relcomp_pair(private: dict, rng, redraw) -> dict | None:
    """A Winoground-style pair for the RelComp probe, or None for a scene without a relation.

    Image 1 is image 0 with two related objects' positions exchanged (kind ``relation``: caption 1 swaps
    the predicate) or their colours exchanged (kind ``attribute``: caption 1 swaps the colours). Each
    caption is true of its own image and false of the other; shapes in a scene are distinct, so an
    object's shape names it.
    """
    rels = private["relations"]
    if not rels:
        return None
    i, pred, j = rels[int(rng.random() * len(rels))]
    template = phrasings.RELCOMP_HELD_OUT[int(rng.random() * len(phrasings.RELCOMP_HELD_OUT))]
    kind, objs = _second_image(private, [i, pred, j], rng)
    if kind is None:
        return None
    caption_0 = phrasings.relcomp_caption(private["objects"][i], pred, private["objects"][j], template)
    pred_1 = phrasings.OPPOSITE[pred] if kind == "relation" else pred
    caption_1 = phrasings.relcomp_caption(objs[i], pred_1, objs[j], template)
    return {"kind": kind, "caption_0": caption_0, "caption_1": caption_1, "png_1": redraw(objs),
            "triple": [i, pred, j], "template": template,
            "objects_1": strip_private({"objects": objs})["objects"]}


def relcomp_example(private: dict, rng, held_out: set) -> tuple[dict, list[dict] | None]:
    """A RelComp training record (schema.RELCOMP) and the objects of its hard negative image (or None).

    The caption states one relation with both objects' colours. Its selective negatives, one per kind:
    ``attribute`` (the two colours exchanged, or the subject's colour replaced when they match),
    ``predicate`` (the opposite predicate), ``exchange`` (subject and object exchanged). None of them is
    true of the image, and none names a held-out colour-shape combination.
    """
    objects = private["objects"]
    i, pred, j = private["relations"][int(rng.random() * len(private["relations"]))]
    subj, obj = objects[i], objects[j]
    template = phrasings.RELCOMP_TRAIN[int(rng.random() * len(phrasings.RELCOMP_TRAIN))]
    if subj["color"] != obj["color"] and (obj["color"], subj["shape"]) not in held_out \
            and (subj["color"], obj["shape"]) not in held_out:
        wrong = (dict(subj, color=obj["color"]), dict(obj, color=subj["color"]))
    else:
        others = [c for c in COLORS if c != subj["color"] and (c, subj["shape"]) not in held_out]
        wrong = (dict(subj, color=others[int(rng.random() * len(others))]), obj)
    negatives = [
        {"text": phrasings.relcomp_caption(wrong[0], pred, wrong[1], template), "kind": "attribute"},
        {"text": phrasings.relcomp_caption(subj, phrasings.OPPOSITE[pred], obj, template), "kind": "predicate"},
        {"text": phrasings.relcomp_caption(obj, pred, subj, template), "kind": "exchange"},
    ]
    kind, objs = _second_image(private, [i, pred, j], rng, held_out)
    caption = phrasings.relcomp_caption(subj, pred, obj, template)
    record = {"caption": caption, "negatives": negatives,
              "negative_image": kind, "triple": [i, pred, j], "template": template,
              "negative_objects": None if objs is None else strip_private({"objects": objs})["objects"]}
    if objs is not None:
        record.update(negative_image_text(objs, i, pred, j, kind, template, caption))
    return record, objs


def negative_image_text(objs: list[dict], i: int, pred: str, j: int, kind: str, template: str,
                        caption: str) -> dict:
    """The negative image's own caption (true of it, false of the image: the image's ``attribute`` or
    ``predicate`` negative, as ``kind`` drew it) and its own hard negatives (the predicate reversed, subject and
    object exchanged; the image's caption, which the attribute-kind image's colour exchange gives back, is left
    out): TripletCLIP's (I⁻, T⁻) and NegCLIP's hard image with its caption and hard captions. No randomness, so
    the rest of the record is what it was."""
    a, b = objs[i], objs[j]
    pred_1 = phrasings.OPPOSITE[pred] if kind == "relation" else pred
    own = phrasings.relcomp_caption(a, pred_1, b, template)
    negatives = [phrasings.relcomp_caption(a, phrasings.OPPOSITE[pred_1], b, template),
                 phrasings.relcomp_caption(b, pred_1, a, template)]
    return {"negative_image_caption": own, "negative_image_negatives": [n for n in negatives if n not in (caption, own)]}


def zeroshot_sample(split: str, seed: int, index: int, held_out: set) -> tuple[bytes, dict]:
    """Single-object image; classes are balanced (shape = index mod #shapes)."""
    rng = np.random.default_rng([seed, SPLIT_IDS[split + "_zeroshot"], index])
    shape = SHAPES[index % len(SHAPES)]
    scene = sample_scene(rng, held_out, probe=True, n_objects=1, shapes=[shape])
    png = png_bytes(render(scene, rng))
    return png, {"label": SHAPES.index(shape), "scene": strip_private(scene)}


# ------------------------------------------------------------------ workers


def _write_shard(task) -> int:
    """One webdataset shard: members ``<key>.png``, ``<key>.json`` and (RelComp) ``<key>.neg.png`` in key order.

    Written with tarfile directly (USTAR headers, mtime 0: byte-reproducible), which is exactly the layout
    ``webdataset.TarWriter`` produces and ``webdataset.WebDataset`` reads, at a third of its per-sample
    cost and without importing torch in every worker.
    """
    split, seed, start, stop, path, held_out = task
    held_out = {tuple(c) for c in held_out}
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(start, stop):
            png, rec, negative_png = train_sample(split, seed, i, held_out)
            key = f"{split}-{i:07d}"
            tar_add(tf, f"{key}.png", png)
            tar_add(tf, f"{key}.json", dumps(rec))
            if negative_png is not None:
                tar_add(tf, f"{key}.{NEGATIVE_IMAGE_KEYS[0]}", negative_png)
    return stop - start


def _write_probe_chunk(task):
    split, kind, seed, start, stop, img_dir, held_out, size = task
    held_out = {tuple(c) for c in held_out}
    prefix = "" if kind == "main" else "zs_"
    recs = []
    for i in range(start, stop):
        png, rec = probe_sample(split, seed, i, held_out, size) if kind == "main" else \
            zeroshot_sample(split, seed, i, held_out)
        name = f"images/{prefix}{i:06d}.png"
        with open(os.path.join(img_dir, f"{prefix}{i:06d}.png"), "wb") as f:
            f.write(png)
        rec["image_path"] = name
        for field, suffix in (("relcomp", "pair"), ("probe_c", "c")):
            if rec.get(field):
                with open(os.path.join(img_dir, f"{prefix}{i:06d}_{suffix}.png"), "wb") as f:
                    f.write(rec[field].pop("png_1"))
                rec[field]["image_1"] = f"images/{prefix}{i:06d}_{suffix}.png"
        if rec.get("probe_b"):
            paths = {}
            for variant, data in rec["probe_b"].pop("images").items():
                with open(os.path.join(img_dir, f"{prefix}{i:06d}_b_{variant}.png"), "wb") as f:
                    f.write(data)
                paths[variant] = f"images/{prefix}{i:06d}_b_{variant}.png"
            rec["probe_b"]["images"] = paths
        recs.append(rec)
    return (split, kind, start), recs


def _dispatch(task):
    if task[0] == "shard":
        return "shard", task[1][0], _write_shard(task[1])
    key, recs = _write_probe_chunk(task[1])
    return "probe", key, recs


def _write_probe_files(split_dir: Path, main: list[dict], zs: list[dict]) -> None:
    with open(split_dir / "mcq.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(MCQ_CSV_COLUMNS)
        for r in main:
            m = r["mcq"]
            w.writerow([m["answer"], *m["options"], m["answer_template"], r["image_path"]])
    for name, field in (("retrieval.csv", "retrieval"), ("retrieval_neg.csv", "retrieval_neg")):
        with open(split_dir / name, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(RETRIEVAL_CSV_COLUMNS)
            for r in main:
                w.writerow([r["image_path"], json.dumps(r[field])])
    for field in ("relcomp",):      # Winoground-style pairs
        with open(split_dir / f"{field}.csv", "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(RELCOMP_CSV_COLUMNS)
            for r in main:
                if r.get(field):
                    p = r[field]
                    w.writerow([r["image_path"], p["image_1"], p["caption_0"], p["caption_1"], p["kind"]])
    (split_dir / "classes.json").write_text(json.dumps(list(SHAPES)))    # zeroshot.csv's labels index it
    with open(split_dir / "zeroshot.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(ZEROSHOT_CSV_COLUMNS)
        for r in zs:
            w.writerow([r["image_path"], r["label"]])
    with open(split_dir / "annotations.jsonl", "w") as f:
        for r in main + zs:
            f.write(json.dumps({"image_path": r["image_path"], "scene": r["scene"],
                                "negative": r.get("negative", []),
                                "relcomp": r.get("relcomp")}, sort_keys=True) + "\n")


# ------------------------------------------------------------------ build
def _meta_base(seed: int, size: str) -> dict:
    counts = dict(SIZES[size])
    for s in PROBE_SPLITS:
        counts[f"{s}_zeroshot"] = counts[s] // 2
    return {
        "generator_version": GENERATOR_VERSION,
        "seed": seed,
        "size": size,
        "image_size": IMAGE_SIZE,
        "counts": counts,
        "shapes": list(SHAPES),
        "colors": {k: list(v) for k, v in COLORS.items()},
        "sizes": list(OBJ_SIZES),
        "fills": list(FILLS),
        "backgrounds": list(BACKGROUNDS),
        "context_priors": {bg: dict(zip(SHAPES, w)) for bg, w in CONTEXT_PRIORS.items()},
        "held_out_combos": held_out_combos(seed),
        "held_out_templates": {
            "affirm": list(phrasings.AFFIRM_HELD_OUT),
            "negate": list(phrasings.NEGATE_HELD_OUT),
            "mcq": {k: list(v) for k, v in phrasings.MCQ_HELD_OUT.items()},
        },
        "probe_policy": {"held_out_combo_p": PROBE_HELD_OUT_COMBO_P,
                         "mcq_held_out_option_p": PROBE_HELD_OUT_MCQ_P,
                         "retrieval": "held-out affirmative phrasings only",
                         "retrieval_neg": "held-out negation phrasings only"},
        "classes": list(SHAPES),
    }


def build_world(out: str | Path, seed: int = 0, size: str = "demo", workers: int | None = None,
                progress: bool = True, splits=TRAIN_SPLITS) -> dict:
    """Generate the world into ``out`` (atomic; cached by seed + size + GENERATOR_VERSION). ``splits``: the
    training splits to have (the probe splits are always drawn). A split the world does not have yet is drawn into
    it later: every image's randomness is keyed by its split and index, so a world drawn in parts is byte for byte
    the world drawn at once."""
    if size not in SIZES:
        raise ValueError(f"unknown world size {size!r}; choose from {sorted(SIZES)}")
    unknown = sorted(set(splits) - set(ALL_TRAIN_SPLITS))
    if unknown:
        raise ValueError(f"unknown world split(s) {unknown}; choose from {list(ALL_TRAIN_SPLITS)}")
    out = Path(out)
    if (old := _built(out, seed, size)) is not None and not _missing(old, splits):
        return old
    # jobs started together on a cold cache build it once: the others wait for the first, then read its world
    with cache_lock(out, f"the {size} world of seed {seed}"):
        old = _built(out, seed, size)
        if old is not None and not _missing(old, splits):
            return old
        return _build(out, seed, size, workers, progress, _missing(old, splits) if old else splits, old)


def _built(out: Path, seed: int, size: str) -> dict | None:
    """The world.json of a finished build of this seed, size and generator in ``out``, else None."""
    try:
        old = json.loads((out / "world.json").read_text())
    except (OSError, ValueError):
        return None
    same = (old.get("seed"), old.get("size"), old.get("generator_version")) == (seed, size, GENERATOR_VERSION)
    return old if same else None


def _missing(meta: dict, splits) -> list[str]:
    """The training splits of ``splits`` that the built world ``meta`` does not have, in build order."""
    return [s for s in BUILD_ORDER if s in splits and s not in meta["shards"]]


BUILD_ORDER = ("finetune", "relcomp", "pretrain", *METHOD_SPLITS)          # heavier chunks first


def split_count(split: str, size: str) -> int:
    """Samples of a training split in a world of ``size``."""
    if split in METHOD_SPLITS:
        return METHOD_SAMPLERS[split][1](split, size)
    return SIZES[size][split]


def _build(out: Path, seed: int, size: str, workers: int | None, progress: bool, splits,
           old: dict | None = None) -> dict:
    """Draw the training ``splits`` into ``out``, and the probe splits unless ``old`` (the world already there,
    whose world.json is rewritten last with the new splits added)."""
    meta_path = out / "world.json"
    with failing_writes(out, "the world that was there is kept, whole" if meta_path.exists()
                        else "nothing was left there"), scratch_dir(out) as build:
        meta = old or _meta_base(seed, size)
        held = meta["held_out_combos"]
        counts = {**SIZES[size], **{s: split_count(s, size) for s in splits}}
        probes = () if old else PROBE_SPLITS
        tasks, shards = [], {}
        for split in (s for s in BUILD_ORDER if s in splits):
            (build / split).mkdir()
            shards[split] = []
            for k, start in enumerate(range(0, counts[split], SHARD_SIZE)):
                name = f"shard-{k:06d}.tar"
                shards[split].append(name)
                tasks.append(("shard", (split, seed, start, min(start + SHARD_SIZE, counts[split]),
                                        str(build / split / name), held)))
        for split in probes:
            img_dir = build / split / "images"
            img_dir.mkdir(parents=True)
            for kind, n in (("main", counts[split]), ("zeroshot", counts[split] // 2)):
                for start in range(0, n, PROBE_CHUNK):
                    tasks.append(("probe", (split, kind, seed, start, min(start + PROBE_CHUNK, n),
                                            str(img_dir), held, size)))
        total = sum(counts[s] for s in shards) + sum(counts[s] + counts[s] // 2 for s in probes)
        workers = max(1, workers or os.cpu_count() or 1)
        results = {}
        t0 = time.perf_counter()
        bar = None
        if progress:
            from tqdm import tqdm
            bar = tqdm(total=total, desc=f"world {size} seed={seed}" + (f" ({', '.join(shards)})" if old else ""),
                       unit="img", smoothing=0.1)

        def consume(res):
            kind, key, payload = res
            if kind == "probe":
                results[key] = payload
            if bar is not None:
                bar.update(payload if kind == "shard" else len(payload))

        if workers == 1:
            for t in tasks:
                consume(_dispatch(t))
        else:
            with mp.get_context("fork" if "fork" in mp.get_all_start_methods() else None).Pool(workers) as pool:
                for res in pool.imap_unordered(_dispatch, tasks):
                    consume(res)
        for split in probes:
            def gather(kind):
                keys = sorted(k for k in results if k[0] == split and k[1] == kind)
                return [r for k in keys for r in results[k]]
            _write_probe_files(build / split, gather("main"), gather("zeroshot"))
            formats.write_all(build / split, gather("main"), gather("zeroshot"), seed)
        elapsed = time.perf_counter() - t0
        if bar is not None:
            bar.close()
        # a method split's count joins the meta when it is drawn (a world without one keeps its world.json as it was)
        meta["counts"].update({s: counts[s] for s in shards if s in METHOD_SPLITS})
        drawn = {**meta.get("shards", {}), **shards}
        meta["shards"] = {s: drawn[s] for s in BUILD_ORDER if s in drawn}     # one order, however it was drawn
        meta["build_seconds"] = round(meta.get("build_seconds", 0.0) + elapsed, 3)
        meta["images_per_second"] = round(total / elapsed, 1)
        (build / "world.json").write_text(json.dumps(meta, indent=1))
        # move into place; world.json last so a half-finished build is never taken for a cached one (and a split
        # moved in before its world.json names it is drawn again by the next build)
        with failing_writes(out, "it holds part of the new world and no world.json naming it, so nothing takes it "
                                 "for a built world; the same command builds it again"):
            if not old:
                meta_path.unlink(missing_ok=True)
            for name in (*shards, *probes):
                move_into_place(build / name, out / name)
            move_into_place(build / "world.json", meta_path)
    return meta


def ensure_world(cfg, rank: int, splits=None) -> Path:
    """The embedded world ``cfg.world`` names, with the training ``splits`` (None: those ``cfg``'s streams read),
    built by rank 0 where it is not there yet (a finished build is reused, a missing split added). The caller makes
    the other ranks wait for it (the training engine's ``barrier``)."""
    from negft.config import world_dir
    root = world_dir(cfg)
    if rank == 0:
        build_world(root, seed=cfg.world.seed, size=cfg.world.size,
                    splits={s.world_split for s in cfg.streams.values()} if splits is None else splits)
    return root
