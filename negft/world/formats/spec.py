"""The world as SPEC's six subsets, in its released layout (wjpoom/SPEC ``spec/dataset.py``; see
``negft.probes.spec``): ``<subset>/image2text.json`` (``[{"query": image, "keys": [captions], "label": i}]``),
``<subset>/text2image.json`` (``[{"query": caption, "keys": [images], "label": i}]``) and the subset's images
``<subset>/images/<group>_<k>.png``, paths relative to the subset's folder. Where the files sit: at the top of the
split folder, the same relative paths as under the manifest's root (``$NEGFT_DATA/spec/<subset>/...``).

Each of the first ``GROUPS`` probe records gives one group per subset: images rendered anew (``render.render``) on
the record's background with its first object A (its shape, colour and fill; B: its second object, or A with
another shape), differing in one concept only (the images of a group share their background and draw their jitter
from one seed, drawn per group), and one caption per image, true of that image and false of the others:

- absolute_size: A alone, small / large ("a small red star"; the world has two sizes, SPEC three);
- relative_size: A beside B, A larger / smaller / the same size ("a red star larger than a blue circle");
- absolute_spatial: A alone, small, at each of 3 × 3 places ("a red star at the top left of the image");
- relative_spatial: A to the left of / right of / above / below B ("a red star to the left of a blue circle");
- existence: B with A, B alone ("there is a red star" / "there is no red star");
- count: one to four copies of A, small ("two red stars").

Each image is a query of ``image2text.json`` against the group's captions, each caption one of
``text2image.json`` against the group's images, the true one at its index. Randomness (render jitter):
``formats.rng(seed, split_dir, "spec")`` only.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from negft import phrasings
from negft.world import formats
from negft.world.render import IMAGE_SIZE, SHAPES, SIZES, png_bytes, render

SUBSETS = ("absolute_size", "relative_size", "absolute_spatial", "relative_spatial", "existence", "count")
GROUPS = 12                              # probe records per split that give a group
PLACES = {"top left": (0, 0), "top": (1, 0), "top right": (2, 0), "left": (0, 1), "center": (1, 1),
          "right": (2, 1), "bottom left": (0, 2), "bottom": (1, 2), "bottom right": (2, 2)}
NUMBERS = ("one", "two", "three", "four")
RELATIVE_SIZE = ("larger than", "smaller than", "the same size as")


def _obj(proto: dict, size: str, x0: int, y0: int) -> dict:
    """A drawable object (render's private fields) of ``proto``'s shape, colour and fill at (x0, y0)."""
    px = SIZES[size]
    return {"shape": proto["shape"], "color": proto["color"], "fill": proto["fill"], "size": size,
            "bbox": [x0, y0, x0 + px, y0 + px], "_px": px, "_angle": 0.0}


def _centre(size: str) -> int:
    return (IMAGE_SIZE - SIZES[size]) // 2


def _name(o: dict) -> str:
    return phrasings.with_article(f"{o['color']} {o['shape']}")


def _plural(shape: str) -> str:
    return shape + ("es" if shape.endswith(("s", "x")) else "s")


def groups(a: dict, b: dict) -> dict[str, list[tuple[str, list[dict]]]]:
    """subset -> [(caption, objects of its image)] for objects A and B."""
    small, large = SIZES["small"], SIZES["large"]
    mid = _centre("small")
    far = IMAGE_SIZE - large - 4
    out = {"absolute_size": [(phrasings.with_article(f"{s} {a['color']} {a['shape']}"),
                              [_obj(a, s, _centre(s), _centre(s))]) for s in ("small", "large")]}
    sizes = {"larger than": ("large", "small"), "smaller than": ("small", "large"), "the same size as": ("small",
                                                                                                       "small")}
    out["relative_size"] = [(f"{_name(a)} {rel} {_name(b)}", [_obj(a, sa, 4, mid), _obj(b, sb, far, mid)])
                            for rel, (sa, sb) in sizes.items()]
    step = (IMAGE_SIZE - small) // 2
    out["absolute_spatial"] = [(f"{_name(a)} at the {place} of the image", [_obj(a, "small", step * i, step * j)])
                               for place, (i, j) in PLACES.items()]
    lo, hi = 6, IMAGE_SIZE - small - 6
    places = {"left of": ((lo, mid), (hi, mid)), "right of": ((hi, mid), (lo, mid)),
              "above": ((mid, lo), (mid, hi)), "below": ((mid, hi), (mid, lo))}
    out["relative_spatial"] = [(f"{_name(a)} {phrasings.PREDICATE_WORDS[p]} {_name(b)}",
                                [_obj(a, "small", *pa), _obj(b, "small", *pb)]) for p, (pa, pb) in places.items()]
    out["existence"] = [(f"there is {_name(a)}", [_obj(a, "small", lo, mid), _obj(b, "small", hi, mid)]),
                        (f"there is no {a['color']} {a['shape']}", [_obj(b, "small", hi, mid)])]
    corners = [(lo, lo), (hi, hi), (hi, lo), (lo, hi)]
    out["count"] = [(f"{NUMBERS[n - 1]} {a['color']} {a['shape'] if n == 1 else _plural(a['shape'])}",
                     [_obj(a, "small", *xy) for xy in corners[:n]]) for n in range(1, len(NUMBERS) + 1)]
    return out


def _partner(scene: dict) -> dict:
    """B: the scene's second object, or (a one-object scene) A with another shape."""
    objs = scene["objects"]
    if len(objs) > 1:
        return objs[1]
    shape = next(s for s in SHAPES if s != objs[0]["shape"])
    return {**objs[0], "shape": shape}


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    split_dir = Path(split_dir)
    rng = formats.rng(seed, split_dir, "spec")
    rows = {s: {"i2t": [], "t2i": []} for s in SUBSETS}
    for g, rec in enumerate(main[:GROUPS]):
        scene = rec["scene"]
        group_seed = int(rng.integers(1 << 62))         # each image of the group draws the same background, jitter
        for subset, group in groups(scene["objects"][0], _partner(scene)).items():
            folder = split_dir / subset / "images"
            folder.mkdir(parents=True, exist_ok=True)
            captions, images = [c for c, _ in group], []
            for k, (_, objects) in enumerate(group):
                path = f"images/{g:04d}_{k}.png"
                scene_k = {"background": scene["background"], "objects": objects}
                image = render(scene_k, np.random.default_rng(group_seed))
                (folder / Path(path).name).write_bytes(png_bytes(image))
                images.append(path)
            rows[subset]["i2t"] += [{"query": p, "keys": captions, "label": k} for k, p in enumerate(images)]
            rows[subset]["t2i"] += [{"query": c, "keys": images, "label": k} for k, c in enumerate(captions)]
    for subset, by in rows.items():
        (split_dir / subset).mkdir(parents=True, exist_ok=True)
        for direction, file in (("i2t", "image2text.json"), ("t2i", "text2image.json")):
            (split_dir / subset / file).write_text(json.dumps(by[direction], indent=2) + "\n", encoding="utf-8")
