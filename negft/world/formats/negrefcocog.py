"""The world's probe images as NegRefCOCOg, in its released layout (parkquasar/NegationCLIP
``NegRefCOCOg/NegRefCOCOg.json``; see ``negft.probes.negrefcocog``): ``NegRefCOCOg.json`` at the top of the split
folder, as under the manifest's root (``$NEGFT_DATA/negrefcocog/NegRefCOCOg.json``), indented by 4 as released:
a list of ``{"image", "phrase", "ref_bbox", "bbox_list"}``.

Per probe image with two or more objects where one object lacks a colour, size or fill that every other object
has: ``phrase`` "a shape that is not red" ("... not small", "... not striped"), true of that object only;
``bbox_list`` every object's box as ``[x, y, w, h]`` (the world's ``bbox`` is ``[x0, y0, x1, y1]``), the right
one first as the release lists it, and ``ref_bbox`` that box. ``image`` is the world's image path
(``images/000012.png``), resolved against the split folder as a dataset without a manifest resolves it; real data
resolves COCO file names against the manifest's ``images``. Randomness (which object, which attribute):
``formats.rng(seed, split_dir, "negrefcocog")`` only.
"""
from __future__ import annotations

import json
from pathlib import Path

from negft import phrasings
from negft.world import formats

FILE = "NegRefCOCOg.json"
ATTRIBUTES = ("color", "size", "fill")


def xywh(obj: dict) -> list:
    x0, y0, x1, y1 = obj["bbox"]
    return [x0, y0, x1 - x0, y1 - y0]


def singled_out(objects: list[dict]) -> list[tuple[int, str]]:
    """[(object, attribute value it lacks and every other object has)]: each a negated expression true of that
    object alone."""
    out = []
    for t, obj in enumerate(objects):
        for attr in ATTRIBUTES:
            values = {o[attr] for k, o in enumerate(objects) if k != t}
            if len(values) == 1 and obj[attr] not in values:
                out.append((t, values.pop() if attr != "fill" else phrasings.FILL_WORDS[values.pop()]))
    return out


def row(rec: dict, rng) -> dict | None:
    objects = rec["scene"]["objects"]
    choices = singled_out(objects) if len(objects) > 1 else []
    if not choices:
        return None
    t, value = choices[int(rng.random() * len(choices))]
    boxes = [xywh(objects[t])] + [xywh(o) for k, o in enumerate(objects) if k != t]
    return {"image": rec["image_path"], "phrase": f"a shape that is not {value}", "ref_bbox": boxes[0],
            "bbox_list": boxes}


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    rng = formats.rng(seed, split_dir, "negrefcocog")
    rows = [r for r in (row(rec, rng) for rec in main) if r is not None]
    (Path(split_dir) / FILE).write_text(json.dumps(rows, indent=4) + "\n", encoding="utf-8")
