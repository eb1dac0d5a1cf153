"""The world's training splits in each baseline's own kind of data (README: the embedded world).

The ``relcomp`` split serves every image-tower baseline the same two-object relation captions; their papers train
on other things. These splits give each method the data its paper trains on, drawn exactly from the world's scenes:

- ``ccneg`` (CoN-CLIP, CC-Neg's form): the image with its alt-text caption; the negated caption denies an object
  the image shows and the caption names (the other objects affirmed, CC-Neg's "negative-prompt"); the distractor
  image is the same scene rendered again without that object, so the negated caption is true of it and the caption
  false. ``ccneg`` = {removed, distractor_objects}.
- ``negclip`` (NegCLIP; FSC-CLIP's COCO run reads the same file): an alt-text caption that states one relation
  between coloured objects (COCO's captions describe, alt-text lists: ``described_caption``), NegCLIP's swaps of it
  (``negft.convert.negatives``' ``negclip`` generator) and, as NegCLIP's nearest-neighbour hard image, the scene with
  one object edited, with its own described caption and swaps.
- ``ceclip`` (CE-CLIP): the described caption and CE-CLIP's four types (relation, adjective, noun, verb: the
  ``ceclip`` generator; the relation phrase stands in for the verb, as its code takes a preposition without a verb).
- ``tripletclip`` / ``tripletclip_pretrain`` (TripletCLIP, fine-tuning and pretraining): the alt-text caption T, a
  minimal edit T⁻ of it (an object's colour or shape replaced, or two objects' colours exchanged: T rewritten from
  the edited scene with the same draws, so only the edit differs), and I⁻ rendered from T⁻'s scene. The pretraining
  split draws its scenes as the ``pretrain`` split does.

Every negative is checked against the scene (``negatives.keeper``): false of the image, and naming no colour-shape
pair the world holds out of training. Each split draws from its own stream (``generator.SPLIT_IDS``), so adding one
changes no other split's draws.
"""
from __future__ import annotations

import numpy as np

from negft import phrasings
from negft.convert import negatives as gen
from negft.data.schema import CAPTION, OBJECTS, RELCOMP, SCENE
import negft.world.generator as g
from negft.world.render import COLORS, FILLS, SHAPES, SIZES as OBJ_SIZES

# samples per split by world size (tripletclip_pretrain: as many as the pretrain split)
SIZES = {"tiny": 200, "demo": 6000, "full": 50000}
SPLITS = ("ccneg", "negclip", "ceclip", "tripletclip", "tripletclip_pretrain")
EDIT_TRIES = 20


def count(split: str, size: str) -> int:
    return g.SIZES[size]["pretrain"] if split == "tripletclip_pretrain" else SIZES[size]


def world_tagger(held_out: set) -> gen.WorldTagger:
    """The world's vocabulary and every colour-shape pair training may name (all but the held-out ones)."""
    return gen.WorldTagger(SHAPES, [*COLORS, *OBJ_SIZES, *(phrasings.FILL_WORDS[f] for f in FILLS)],
                           {(c, s) for c in COLORS for s in SHAPES} - set(held_out))


def _draw(split: str, seed: int, index: int, held_out: set, objects: str):
    """(rng, png, private scene, redraw) of one image. ``objects``: ``related`` 2-4 objects with a relation,
    ``several`` 2-4 objects, ``alt`` the ``pretrain`` split's counts (tripletclip_pretrain) or the finetune split's."""
    rng = np.random.default_rng([seed, g.SPLIT_IDS[split], index])
    while True:
        n = 2 + int(rng.random() * 3) if objects != "alt" else None
        private = g.sample_scene(rng, held_out, probe=False, n_objects=n,
                                 split="pretrain" if split == "tripletclip_pretrain" else "default")
        if objects != "related" or private["relations"]:
            break
    state = rng.bit_generator.state
    png = g.png_bytes(g.render(private, rng))

    def redraw(objs: list[dict]) -> bytes:
        again = np.random.default_rng()
        again.bit_generator.state = state
        return g.png_bytes(g.render({**private, "objects": objs}, again))

    return rng, png, private, redraw


def _scene(private: dict, objects: list[dict] | None = None) -> dict:
    objects = private["objects"] if objects is None else objects
    return g.strip_private({**private, "objects": objects, "relations": g.relations(objects)})


def described_caption(scene: dict, rng) -> str:
    """An alt-text template whose object list starts with one relation between two coloured objects ("a photo of a
    red star to the left of a blue circle and a heart"): the described form of COCO's captions, which the NegCLIP,
    FSC-CLIP and CE-CLIP generators work on (two nouns, adjectives, a relation word)."""
    objs = scene["objects"]
    i, pred, j = scene["relations"][int(rng.random() * len(scene["relations"]))]
    t = phrasings.AFFIRM_TRAIN[int(rng.random() * len(phrasings.AFFIRM_TRAIN))]
    named = lambda o: phrasings.with_article(" ".join(
        ([o["size"]] if rng.random() < 0.2 else []) + [o["color"], o["shape"]]))
    head = f"{named(objs[i])} {phrasings.PREDICATE_WORDS[pred]} {named(objs[j])}"
    rest = [phrasings.object_phrase(o, rng, g.ALT_TEXT_DETAIL) for k, o in enumerate(objs) if k not in (i, j)]
    bgs = phrasings.BACKGROUND_PHRASES[scene["background"]]
    return phrasings._fill(t, objs=phrasings.join_list([head, *rest]), bg=bgs[int(rng.random() * len(bgs))])


def _negatives(method: str, caption: str, scene: dict, rng, tagger: gen.WorldTagger, k: int) -> list[dict]:
    t = tagger.tag([caption])[0]
    return gen.generate(method, t, rng, gen.vocabulary([], tagger.lexicon), k, scene, tagger)


# ------------------------------------------------------------------ edits a renderer can show
def edit_objects(objects: list[dict], rng, held_out: set) -> list[dict] | None:
    """The objects with one renderable edit: an object's colour replaced, its shape replaced by one absent from the
    scene, or (two objects) their colours exchanged; never a held-out colour-shape pair. None where none fits."""
    kinds = ["color", "shape"] + (["exchange"] if len(objects) > 1 else [])
    kind = kinds[int(rng.random() * len(kinds))]
    objs = [dict(o) for o in objects]
    i = int(rng.random() * len(objs))
    o = objs[i]
    if kind == "color":
        options = [c for c in COLORS if c != o["color"] and (c, o["shape"]) not in held_out]
        o["color"] = options[int(rng.random() * len(options))]
        return objs
    if kind == "shape":
        present = {p["shape"] for p in objs}
        options = [s for s in SHAPES if s not in present and (o["color"], s) not in held_out]
        if not options:
            return None
        return g._swapped(objs, i, "object", options[int(rng.random() * len(options))])
    j = (i + 1 + int(rng.random() * (len(objs) - 1))) % len(objs)
    a, b = objs[i], objs[j]
    if a["color"] == b["color"] or (b["color"], a["shape"]) in held_out or (a["color"], b["shape"]) in held_out:
        return None
    a["color"], b["color"] = b["color"], a["color"]
    return objs


# ------------------------------------------------------------------ the splits
def ccneg_sample(split, seed, index, held_out):
    rng, png, private, redraw = _draw(split, seed, index, held_out, "several")    # CC-Neg affirms the rest
    scene = _scene(private)
    caption = phrasings.affirmative_caption(scene, rng, detail=g.ALT_TEXT_DETAIL, bg_p=g.ALT_TEXT_BG_P)
    # the removed object is one the caption names, so the caption is false of the distractor (as of CC-Neg's, a
    # different image) and the third term's candidates hold one true caption
    named = {shape for shape, _ in gen.reading(world_tagger(held_out).tag([caption])[0])[0]}
    ks = [m for m, o in enumerate(private["objects"]) if o["shape"] in named]
    k = ks[int(rng.random() * len(ks))]
    kept = [o for m, o in enumerate(private["objects"]) if m != k]
    distractor = _scene(private, kept)
    removed = private["objects"][k]["shape"]
    negated = phrasings.negated_caption(distractor, removed, rng)
    record = {"caption": caption, "negatives": [{"text": negated, "kind": "negation"}], "negative_image": "distractor",
              "negative_image_caption": negated, "negative_image_negatives": []}
    rec = {CAPTION: caption, RELCOMP: record, SCENE: scene,
           OBJECTS: {"positive": [o["shape"] for o in scene["objects"]], "negative": []},
           "ccneg": {"removed": removed, "distractor_objects": distractor["objects"]}}
    return png, rec, redraw(kept)


def negclip_sample(split, seed, index, held_out):
    rng, png, private, redraw = _draw(split, seed, index, held_out, "related")
    scene, tagger = _scene(private), world_tagger(held_out)
    caption = described_caption(scene, rng)
    negs = _negatives("negclip", caption, scene, rng, tagger, gen.METHODS["negclip"])
    record = {"caption": caption, "negatives": negs, "negative_image": None}
    negative_png = None
    for _ in range(EDIT_TRIES):     # the nearest neighbour: the scene with one object edited, still related
        objs = edit_objects(private["objects"], rng, held_out)
        near = None if objs is None else _scene(private, objs)
        if near is not None and near["relations"]:
            near_caption = described_caption(near, rng)
            record.update(negative_image="neighbour", negative_image_caption=near_caption,
                          negative_image_negatives=[n["text"] for n in _negatives(
                              "negclip", near_caption, near, rng, tagger, gen.METHODS["negclip"])],
                          negative_objects=near["objects"])
            negative_png = redraw(objs)
            break
    rec = {CAPTION: caption, RELCOMP: record, SCENE: scene,
           OBJECTS: {"positive": [o["shape"] for o in scene["objects"]], "negative": []}}
    return png, rec, negative_png


def ceclip_sample(split, seed, index, held_out):
    rng, png, private, _ = _draw(split, seed, index, held_out, "related")
    scene = _scene(private)
    caption = described_caption(scene, rng)
    negs = _negatives("ceclip", caption, scene, rng, world_tagger(held_out), gen.METHODS["ceclip"])
    rec = {CAPTION: caption, RELCOMP: {"caption": caption, "negatives": negs, "negative_image": None}, SCENE: scene,
           OBJECTS: {"positive": [o["shape"] for o in scene["objects"]], "negative": []}}
    return png, rec, None


def tripletclip_sample(split, seed, index, held_out):
    rng, png, private, redraw = _draw(split, seed, index, held_out, "alt")
    scene = _scene(private)
    state = rng.bit_generator.state
    caption = phrasings.affirmative_caption(scene, rng, detail=g.ALT_TEXT_DETAIL, bg_p=g.ALT_TEXT_BG_P)
    tagger = world_tagger(held_out)
    record, negative_png = {"caption": caption, "negatives": [], "negative_image": None}, None
    for _ in range(EDIT_TRIES):
        objs = edit_objects(private["objects"], rng, held_out)
        if objs is None:
            continue
        edited = _scene(private, objs)
        again = np.random.default_rng()
        again.bit_generator.state = state        # T rewritten with T's own draws: only the edit differs
        hard = phrasings.affirmative_caption(edited, again, detail=g.ALT_TEXT_DETAIL, bg_p=g.ALT_TEXT_BG_P)
        if gen.keeper(caption, scene, tagger)(hard):
            record = {"caption": caption, "negatives": [{"text": hard, "kind": "negative"}],
                      "negative_image": "rendered", "negative_image_caption": hard,
                      "negative_image_negatives": [caption], "negative_objects": edited["objects"]}
            negative_png = redraw(objs)
            break
    rec = {CAPTION: caption, RELCOMP: record, SCENE: scene,
           OBJECTS: {"positive": [o["shape"] for o in scene["objects"]], "negative": []}}
    return png, rec, negative_png


SAMPLERS = {"ccneg": ccneg_sample, "negclip": negclip_sample, "ceclip": ceclip_sample,
            "tripletclip": tripletclip_sample, "tripletclip_pretrain": tripletclip_sample}


def train_sample(split: str, seed: int, index: int, held_out: set):
    """(png, json record, negative png or None) of one sample of a method split. A sample whose caption gave no
    negative keeps no ``relcomp`` (an itm stream passes it by as another stream's, not as a fault)."""
    png, rec, negative_png = SAMPLERS[split](split, seed, index, held_out)
    if not rec[RELCOMP]["negatives"]:
        del rec[RELCOMP]
        negative_png = None
    return png, rec, negative_png


g.METHOD_SAMPLERS.update({split: (train_sample, count) for split in SPLITS})
