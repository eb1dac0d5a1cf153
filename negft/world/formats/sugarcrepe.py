"""The world's probe images as SugarCrepe's seven splits, in its released layout (RAIVNLab/sugar-crepe
``data/<split>.json``: ``{"<id>": {"filename", "caption", "negative_caption"}}``, indented by 4).

Where the files sit: at the top of the split folder, at the same relative paths as under the manifest's root
(``$NEGFT_DATA/sugarcrepe/<split>.json``), so one reader reads both. ``filename`` is named as a COCO val2017 file
(``000000000012.png`` for world image 12, ``images/000012.png``) and resolved against ``val2017/`` beside the JSON
files, as the release's readers resolve it (RAIVNLab/sugar-crepe ``main_eval.py``: ``os.path.join(
coco_image_root, data['filename'])``; CLIP_benchmark's ``sugar_crepe/<split>``: ``<root>/val2017``), so
``clip_benchmark eval`` reads a world split as it is. The images are relative links to the world's PNGs
(``formats.link``: the pixels are the world's; COCO's are JPEGs, which the readers open alike).

Per probe image, one example per split where the scene allows it; the caption is true of the scene and the
negative false of it (shapes in a scene are distinct, so an object's shape names it):

- add_obj: some of the objects (colour and shape); the negative adds an object whose shape is absent.
- add_att: one object by shape alone; the negative gives it a colour, size or fill it does not have.
- replace_obj: every object; the negative replaces one object's shape by an absent shape (colour kept).
- replace_att: every object, one of them with its colour, size or fill; the negative replaces that attribute.
- replace_rel: "A red star positioned to the left of a blue circle" for a relation that holds; the negative
  says the opposite relation (which cannot hold at the same time). Scenes with no relation: none.
- swap_obj: the same caption with the two objects exchanged in the sentence (the relations are asymmetric).
- swap_att: two objects of different colours (related, when a pair is) with their colours exchanged; none
  where every object has the same colour.

Captions use the world's held-out phrasings (affirmative templates and the held-out RelComp template) with the
scene's background phrase, as the other probe files do. Randomness: ``formats.rng(seed, split_dir,
"sugarcrepe")`` only.
"""
from __future__ import annotations

import json
from pathlib import Path

from negft import phrasings
from negft.world import formats
from negft.world.render import COLORS, FILLS, SHAPES, SIZES

SPLITS = ("add_obj", "add_att", "replace_obj", "replace_att", "replace_rel", "swap_obj", "swap_att")
KEYS = ("filename", "caption", "negative_caption")
IMAGES = "val2017"                            # the image folder beside the JSON files
ATTRIBUTES = {"color": tuple(COLORS), "size": tuple(SIZES), "fill": tuple(FILLS)}
WORD_ORDER = ("size", "color", "fill")        # as phrasings.object_phrase orders them


def phrase(obj: dict, attrs=("color",)) -> str:
    """'a red star', 'a small star', 'a star' (attributes in the world's order)."""
    words = [phrasings.FILL_WORDS[obj[a]] if a == "fill" else obj[a] for a in WORD_ORDER if a in attrs]
    return phrasings.with_article(" ".join([*words, obj["shape"]]))


def _pick(rng, items):
    return items[int(rng.random() * len(items))]


def _capital(text: str) -> str:
    return text[0].upper() + text[1:]


def examples(scene: dict, rng) -> dict[str, tuple[str, str]]:
    """split -> (caption, negative_caption) for one scene; a split the scene does not allow is absent."""
    objs, rels = scene["objects"], scene["relations"]
    order = [int(i) for i in rng.permutation(len(objs))]
    template = _pick(rng, phrasings.AFFIRM_HELD_OUT)
    bg = _pick(rng, phrasings.BACKGROUND_PHRASES[scene["background"]])
    present = {o["shape"] for o in objs}
    absent = [s for s in SHAPES if s not in present]

    def listed(phrases: list[str]) -> str:
        return _capital(template.format(objs=phrasings.join_list(phrases), bg=bg))

    def related(subj: dict, pred: str, obj: dict) -> str:
        return phrasings.relcomp_caption(subj, pred, obj, phrasings.RELCOMP_HELD_OUT[0])

    def wrong(obj: dict, attr: str) -> str:
        return _pick(rng, [v for v in ATTRIBUTES[attr] if v != obj[attr]])

    out = {}
    colour = [phrase(objs[i]) for i in order]
    # add_obj: a subset of the objects, then an absent shape added
    m = 1 + int(rng.random() * len(objs))
    extra = {"shape": _pick(rng, absent), "color": _pick(rng, list(COLORS))}
    out["add_obj"] = (listed(colour[:m]), listed(colour[:m] + [phrase(extra)]))
    # add_att: one object named by shape only; the negative gives it an attribute it lacks
    k, attr = int(rng.random() * len(objs)), _pick(rng, tuple(ATTRIBUTES))
    target = objs[order[k]]
    bare = colour[:k] + [phrase(target, ())] + colour[k + 1:]
    added = colour[:k] + [phrase({**target, attr: wrong(target, attr)}, (attr,))] + colour[k + 1:]
    out["add_att"] = (listed(bare), listed(added))
    # replace_obj: one object's shape replaced by an absent shape
    k = int(rng.random() * len(objs))
    target = objs[order[k]]
    out["replace_obj"] = (listed(colour), listed(colour[:k] + [phrase({**target, "shape": _pick(rng, absent)})]
                                                 + colour[k + 1:]))
    # replace_att: one object's colour, size or fill replaced by one it does not have
    k, attr = int(rng.random() * len(objs)), _pick(rng, tuple(ATTRIBUTES))
    target = objs[order[k]]
    true_one = colour[:k] + [phrase(target, (attr,))] + colour[k + 1:]
    false_one = colour[:k] + [phrase({**target, attr: wrong(target, attr)}, (attr,))] + colour[k + 1:]
    out["replace_att"] = (listed(true_one), listed(false_one))
    if rels:
        i, pred, j = _pick(rng, rels)
        out["replace_rel"] = (related(objs[i], pred, objs[j]), related(objs[i], phrasings.OPPOSITE[pred], objs[j]))
        i, pred, j = _pick(rng, rels)
        out["swap_obj"] = (related(objs[i], pred, objs[j]), related(objs[j], pred, objs[i]))
    two_colours = [r for r in rels if objs[r[0]]["color"] != objs[r[2]]["color"]]
    if two_colours:
        i, pred, j = _pick(rng, two_colours)
        a, b = objs[i], objs[j]
        out["swap_att"] = (related(a, pred, b), related({**a, "color": b["color"]}, pred, {**b, "color": a["color"]}))
    else:
        pairs = [(i, j) for i in order for j in order if i < j and objs[i]["color"] != objs[j]["color"]]
        if pairs:
            i, j = _pick(rng, pairs)
            a, b = objs[i], objs[j]
            out["swap_att"] = (listed([phrase(a), phrase(b)]),
                               listed([phrase({**a, "color": b["color"]}), phrase({**b, "color": a["color"]})]))
    return out


def write_split(path: Path, rows: list[dict]) -> None:
    """One split file in the released layout: ``{"0": {filename, caption, negative_caption}, ...}``, indented
    by 4 as the release's files are."""
    data = {str(i): {k: r[k] for k in KEYS} for i, r in enumerate(rows)}
    Path(path).write_text(json.dumps(data, indent=4) + "\n", encoding="utf-8")


def coco_name(image_path: str) -> str:
    """``images/000012.png`` -> ``000000000012.png``: a COCO file name (12 digits) for a world image."""
    return f"{int(Path(image_path).stem):012d}{Path(image_path).suffix}"


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    rng = formats.rng(seed, split_dir, "sugarcrepe")
    rows: dict[str, list[dict]] = {s: [] for s in SPLITS}
    for rec in main:
        name = coco_name(rec["image_path"])
        formats.link(Path(split_dir), rec["image_path"], f"{IMAGES}/{name}")
        for split, (caption, negative) in examples(rec["scene"], rng).items():
            rows[split].append({"filename": name, "caption": caption, "negative_caption": negative})
    for split in SPLITS:
        write_split(Path(split_dir) / f"{split}.json", rows[split])
