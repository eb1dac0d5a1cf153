"""The world's probe images as VL-CheckList files, in the released layout (om-ai-lab/VL-CheckList ``data/`` and
``DATASETS.md``; see ``negft.probes.vl_checklist``): at the top of the split folder, as under the manifest's root
(``$NEGFT_DATA/vl_checklist/``), five of its 56 files, each a JSON list of ``[image path, {"POS": [phrase],
"NEG": [phrase]}]`` whose NEG phrase is false of the image:

- ``data/Attribute/vg/color.json``: an object's colour ("red star" / "blue star", no blue star in the image);
- ``data/Attribute/vaw/size.json``: its size ("large star" / "small star");
- ``data/Relation/vg/spatial.json``: a relation and its opposite ("red star above blue circle" / "red star below
  blue circle");
- ``data/Object/Location/hake_location/hake_obj_<center|mid|margin>.json``: the relation's object replaced by a
  shape absent from the image ("... above blue hexagon"), filed by where the object sits (the larger offset of its
  centre from the image's: under a sixth of the image, under a third, beyond);
- ``data/Object/Size/swig_size/swig_agent/swig_agent_<small|large>.json``: the relation's subject replaced by an
  absent shape, filed by its size (the world has no medium objects).

Images: JPEG copies under the folder each file's ``IMG_ROOT`` names: ``vg/VG_100K/<n>.jpg`` (Visual Genome's and
VAW's files), ``hake/hake_images_20190730/<n>.jpg``, ``swig/world_<n>.jpg``, n the probe image's number.
Randomness (which relation, which colour or shape): ``formats.rng(seed, split_dir, "vl_checklist")`` only.
"""
from __future__ import annotations

import json
from pathlib import Path


from negft import phrasings
from negft.world import formats
from negft.world.render import COLORS, IMAGE_SIZE, SHAPES, SIZES

VG, HAKE, SWIG = "VG_100K/{}.jpg", "hake_images_20190730/{}.jpg", "world_{}.jpg"     # image paths in the files
IMAGE_ROOTS = {VG: "vg", HAKE: "hake", SWIG: "swig"}
# every file the writer can write (the others of the release's 56 the world has nothing for)
WRITTEN = ("data/Attribute/vg/color.json", "data/Attribute/vaw/size.json", "data/Relation/vg/spatial.json",
           *(f"data/Object/Location/hake_location/hake_obj_{v}.json" for v in ("center", "mid", "margin")),
           *(f"data/Object/Size/swig_size/swig_agent/swig_agent_{v}.json" for v in SIZES))


def phrase(obj: dict, shape: str | None = None, color: str | None = None) -> str:
    return f"{color or obj['color']} {shape or obj['shape']}"


def location(obj: dict) -> str:
    offset = max(abs(obj["x"] - IMAGE_SIZE / 2), abs(obj["y"] - IMAGE_SIZE / 2))
    return "center" if offset < IMAGE_SIZE / 6 else "mid" if offset < IMAGE_SIZE / 3 else "margin"


def _pick(rng, options: list):
    return options[int(rng.random() * len(options))]


def rows_of(rec: dict, rng) -> list[tuple[str, str, str, str]]:
    """(file, image path pattern, POS, NEG) of one probe record."""
    objects, rels = rec["scene"]["objects"], rec["scene"]["relations"]
    present = {(o["color"], o["shape"]) for o in objects}
    absent_shapes = [s for s in SHAPES if s not in {o["shape"] for o in objects}]
    o = objects[0]
    out = []
    colors = [c for c in COLORS if (c, o["shape"]) not in present]
    if colors:
        out.append(("data/Attribute/vg/color.json", VG, phrase(o), phrase(o, color=_pick(rng, colors))))
    other_size = [s for s in SIZES if s != o["size"]][0]
    out.append(("data/Attribute/vaw/size.json", VG, f"{o['size']} {o['shape']}", f"{other_size} {o['shape']}"))
    if rels:
        i, pred, j = _pick(rng, rels)
        a, b = objects[i], objects[j]
        words = phrasings.PREDICATE_WORDS
        pos = f"{phrase(a)} {words[pred]} {phrase(b)}"
        opposite = f"{phrase(a)} {words[phrasings.OPPOSITE[pred]]} {phrase(b)}"
        out.append(("data/Relation/vg/spatial.json", VG, pos, opposite))
        if absent_shapes:
            out.append((f"data/Object/Location/hake_location/hake_obj_{location(b)}.json", HAKE, pos,
                        f"{phrase(a)} {words[pred]} {phrase(b, shape=_pick(rng, absent_shapes))}"))
            out.append((f"data/Object/Size/swig_size/swig_agent/swig_agent_{a['size']}.json", SWIG, pos,
                        f"{phrase(a, shape=_pick(rng, absent_shapes))} {words[pred]} {phrase(b)}"))
    return out


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    split_dir = Path(split_dir)
    rng = formats.rng(seed, split_dir, "vl_checklist")
    files: dict[str, list] = {}
    for rec in main:
        n = int(Path(rec["image_path"]).stem)
        for file, pattern, pos, neg in rows_of(rec, rng):
            image = pattern.format(n)
            if not (split_dir / IMAGE_ROOTS[pattern] / image).exists():     # one copy however many rows name it
                formats.copy_as_jpeg(split_dir / rec["image_path"], split_dir / IMAGE_ROOTS[pattern] / image)
            files.setdefault(file, []).append([image, {"POS": [pos], "NEG": [neg]}])
    for file, rows in sorted(files.items()):
        path = split_dir / file
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(rows) + "\n", encoding="utf-8")
