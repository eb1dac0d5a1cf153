"""The world's probe images as CREPE's files, in its released layout (RAIVNLab/CREPE; see ``negft.probes.crepe``):

- ``prod_hard_negatives/<type>/prod_vg_hard_negs_<type>_complexity_<n>.csv`` (type atom, swap, negate; n 4..12):
  ``image_id, caption, x, y, width, height, hard_negs``;
- ``syst_hard_negatives/syst_vg_hard_negs_<seen|unseen>_compounds_in_world.csv``: ``region_id, caption, x, y,
  width, height, valid_hard_negs_comp, valid_hard_negs_atom, image_id, valid_hard_negs_combined`` (the column
  order of a row of the released file as a downstream loader prints it; the productivity files' order is not
  known, so the loader's order);
- ``VG_100K/<image_id>.jpg``: the probe images as JPEGs, named by ``image_id`` (the image's index + 1, as
  Visual Genome's ids start at 1).

List cells are ``str(list)``, the Python literal pandas writes. Where the files sit: at the top of the split
folder, at the same relative paths as under the manifest's root (``$NEGFT_DATA/crepe/prod_hard_negatives/...``).

Captions are a small scene graph of the image, said as clauses joined by "and": a relation "a red star to the left
of a blue circle", or an object alone "a small striped heart"; each object is named by its shape (shapes in a
scene are distinct) with some of its size, colour and fill. The complexity is CREPE's: the number of atoms
(objects, attributes, relations) in the graph, 4 to 12; each probe image gets the complexity, among those its
scene allows, with the fewest examples so far, so every file has rows. The box is the graph's objects with a
2-pixel margin. The hard negatives, each false of the image (up to ``PER_ROW`` of each kind, drawn):

- atom: one atom replaced: an object's shape by a shape absent from the scene, an attribute by another value,
  a relation by its opposite;
- swap: two atoms of one kind exchanged: two objects' values of one attribute (values that differ), or a
  relation's subject and object;
- negate: one atom negated: "a star that is not red", "a red star not to the left of a blue circle".

Systematicity: one object of each probe image, "a red star" (a colour-shape compound); ``unseen`` when the
compound is one the world holds out of training (``generator.held_out_combos``), ``seen`` otherwise: the
world's own pretraining set, named ``world``. ``valid_hard_negs_atom``: the colour replaced (twice) or the shape
replaced by an absent one; ``valid_hard_negs_comp``: two such foil compounds joined by "and" ("a red heart and a
blue star"); ``valid_hard_negs_combined``: both lists. The box is the object's. Randomness:
``formats.rng(seed, split_dir, "crepe")`` only.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path

from PIL import Image

from negft import phrasings
from negft.world import formats
from negft.world.render import COLORS, FILLS, IMAGE_SIZE, SHAPES, SIZES

PROD_DIR, SYST_DIR, IMAGE_DIR = "prod_hard_negatives", "syst_hard_negatives", "VG_100K"
TYPES = ("atom", "swap", "negate")
COMPLEXITIES = tuple(range(4, 13))
PROD_COLUMNS = ("image_id", "caption", "x", "y", "width", "height", "hard_negs")
SYST_COLUMNS = ("region_id", "caption", "x", "y", "width", "height", "valid_hard_negs_comp", "valid_hard_negs_atom",
                "image_id", "valid_hard_negs_combined")
PRETRAINING = "world"
ATTRIBUTES = {"size": tuple(SIZES), "color": tuple(COLORS), "fill": FILLS}      # in the world's word order
PER_ROW = 4
MARGIN = 2


# ------------------------------------------------------------------ a caption's scene graph
def noun_phrase(obj: dict, negated: str | None = None) -> str:
    """'a small red star' from the attributes ``obj`` mentions; ``negated`` (an attribute) adds 'that is not
    <value>'."""
    words = [_word(a, obj[a]) for a in ATTRIBUTES if a in obj and a != negated]
    text = phrasings.with_article(" ".join([*words, obj["shape"]]))
    return f"{text} that is not {_word(negated, obj[negated])}" if negated else text


def _word(attr: str, value: str) -> str:
    return phrasings.FILL_WORDS[value] if attr == "fill" else value


def say(graph: dict) -> str:
    """The graph's clauses joined by 'and': each relation, then each object in no relation. A ``negate`` entry
    ("relation", k) or ("attribute", object index, attribute) negates that atom."""
    neg = graph.get("negate")
    objs = graph["objects"]

    def np(i):
        return noun_phrase(objs[i], neg[2] if neg and neg[0] == "attribute" and neg[1] == i else None)

    clauses = [f"{np(a)}{' not' if neg == ('relation', k) else ''} {phrasings.PREDICATE_WORDS[p]} {np(b)}"
               for k, (a, p, b) in enumerate(graph["relations"])]
    related = {i for a, _, b in graph["relations"] for i in (a, b)}
    clauses += [np(i) for i in range(len(objs)) if i not in related]
    return phrasings.join_list(clauses)


def _pair_relations(scene: dict, chosen: list[int], rng) -> list[tuple[int, str, int]]:
    """One relation per related pair of ``chosen`` scene objects (drawn among those that hold), as graph indices."""
    out = []
    for a in range(len(chosen)):
        for b in range(a + 1, len(chosen)):
            holds = [(x, p, y) for x, p, y in scene["relations"] if {x, y} == {chosen[a], chosen[b]}]
            if holds:
                x, p, y = holds[int(rng.random() * len(holds))]
                out.append((chosen.index(x), p, chosen.index(y)))
    return out


def most_complex(scene: dict) -> int:
    """Every object with every attribute and a relation per related pair."""
    pairs = {frozenset((x, y)) for x, _, y in scene["relations"]}
    return 4 * len(scene["objects"]) + len(pairs)


def graph_of(scene: dict, target: int, rng) -> dict:
    """A graph of the scene with ``target`` atoms: the first s objects of a random order, with atoms drawn among
    their attributes and relations."""
    order = [int(i) for i in rng.permutation(len(scene["objects"]))]
    sizes = [s for s in range(1, len(order) + 1) if s <= target]
    for s in [sizes[int(i)] for i in rng.permutation(len(sizes))]:
        chosen = order[:s]
        relations = _pair_relations(scene, chosen, rng)
        extras = [("attribute", i, a) for i in range(s) for a in ATTRIBUTES] + [("relation", r) for r in relations]
        if target - s > len(extras):
            continue
        picked = [extras[int(k)] for k in rng.permutation(len(extras))[:target - s]]
        objects = [{"shape": scene["objects"][i]["shape"]} for i in chosen]
        for e in picked:
            if e[0] == "attribute":
                objects[e[1]][e[2]] = scene["objects"][chosen[e[1]]][e[2]]
        return {"objects": objects, "relations": [e[1] for e in picked if e[0] == "relation"],
                "scene_index": chosen}
    raise ValueError(f"no graph of {target} atoms in this scene")


# ------------------------------------------------------------------ hard negatives
def _other(values, value, rng):
    rest = [v for v in values if v != value]
    return rest[int(rng.random() * len(rest))]


def atom_foils(graph: dict, absent: list[str], rng) -> list[dict]:
    """One atom replaced: a shape by an absent one, an attribute by another value, a relation by its opposite."""
    out = []
    for i, o in enumerate(graph["objects"]):
        out.append(_with_object(graph, i, {**o, "shape": absent[int(rng.random() * len(absent))]}))
        out += [_with_object(graph, i, {**o, a: _other(ATTRIBUTES[a], o[a], rng)}) for a in ATTRIBUTES if a in o]
    for k, (a, p, b) in enumerate(graph["relations"]):
        out.append(_with_relation(graph, k, (a, phrasings.OPPOSITE[p], b)))
    return out


def swap_foils(graph: dict) -> list[dict]:
    """Two atoms of one kind exchanged: two objects' differing values of an attribute, a relation's ends."""
    objs, out = graph["objects"], []
    for i in range(len(objs)):
        for j in range(i + 1, len(objs)):
            for a in ATTRIBUTES:
                if a in objs[i] and a in objs[j] and objs[i][a] != objs[j][a]:
                    swapped = _with_object(graph, i, {**objs[i], a: objs[j][a]})
                    out.append(_with_object(swapped, j, {**objs[j], a: objs[i][a]}))
    out += [_with_relation(graph, k, (b, p, a)) for k, (a, p, b) in enumerate(graph["relations"])]
    return out


def negate_foils(graph: dict) -> list[dict]:
    """One atom negated: an attribute ('that is not red') or a relation ('not to the left of')."""
    out = [{**graph, "negate": ("attribute", i, a)} for i, o in enumerate(graph["objects"]) for a in ATTRIBUTES
           if a in o]
    return out + [{**graph, "negate": ("relation", k)} for k in range(len(graph["relations"]))]


def _with_object(graph: dict, i: int, obj: dict) -> dict:
    return {**graph, "objects": [obj if k == i else o for k, o in enumerate(graph["objects"])]}


def _with_relation(graph: dict, k: int, relation) -> dict:
    return {**graph, "relations": [relation if m == k else r for m, r in enumerate(graph["relations"])]}


def drawn(texts: list[str], caption: str, rng) -> list[str]:
    """Up to PER_ROW distinct texts other than the caption, in a random order."""
    unique = [t for t in dict.fromkeys(texts) if t != caption]
    return [unique[int(k)] for k in rng.permutation(len(unique))[:PER_ROW]]


# ------------------------------------------------------------------ rows
def region(scene: dict, indices) -> tuple[int, int, int, int]:
    """(x, y, width, height) of the objects' boxes with a margin, inside the image."""
    boxes = [scene["objects"][i]["bbox"] for i in indices]
    x0, y0 = max(0, min(b[0] for b in boxes) - MARGIN), max(0, min(b[1] for b in boxes) - MARGIN)
    x1 = min(IMAGE_SIZE, max(b[2] for b in boxes) + MARGIN)
    y1 = min(IMAGE_SIZE, max(b[3] for b in boxes) + MARGIN)
    return x0, y0, x1 - x0, y1 - y0


def image_id(rec: dict) -> int:
    """``images/000012.png`` -> 13."""
    return int(Path(rec["image_path"]).stem) + 1


def prod_rows(rec: dict, target: int, rng) -> dict[str, dict]:
    """type -> the productivity row of one probe image at complexity ``target`` (a type with no foil: absent)."""
    scene = rec["scene"]
    graph = graph_of(scene, target, rng)
    caption = say(graph)
    absent = [s for s in SHAPES if s not in {o["shape"] for o in scene["objects"]}]
    foils = {"atom": atom_foils(graph, absent, rng), "swap": swap_foils(graph), "negate": negate_foils(graph)}
    x, y, w, h = region(scene, graph["scene_index"])
    out = {}
    for kind, graphs in foils.items():
        negatives = drawn([say(g) for g in graphs], caption, rng)
        if negatives:
            out[kind] = {"image_id": image_id(rec), "caption": caption, "x": x, "y": y, "width": w, "height": h,
                         "hard_negs": str(negatives)}
    return out


def compound(colour: str, shape: str) -> str:
    """'a red star': a colour-shape compound."""
    return phrasings.with_article(f"{colour} {shape}")


def syst_row(rec: dict, index: int, held_out: set, rng) -> tuple[str, dict]:
    """(seen | unseen, the systematicity row) of one probe image: one object's colour-shape compound."""
    scene = rec["scene"]
    i = int(rng.random() * len(scene["objects"]))
    obj = scene["objects"][i]
    absent = [s for s in SHAPES if s not in {o["shape"] for o in scene["objects"]}]
    colours = [c for c in COLORS if c != obj["color"]]
    colours = [colours[int(k)] for k in rng.permutation(len(colours))[:3]]
    shapes = [absent[int(k)] for k in rng.permutation(len(absent))[:2]]
    caption = compound(obj["color"], obj["shape"])
    atom = [compound(c, obj["shape"]) for c in colours[:2]] + [compound(obj["color"], shapes[0])]
    comp = [f"{compound(obj['color'], s)} and {compound(c, obj['shape'])}" for s, c in zip(shapes, colours[1:])]
    x, y, w, h = region(scene, [i])
    row = {"region_id": index, "caption": caption, "x": x, "y": y, "width": w, "height": h,
           "valid_hard_negs_comp": str(comp), "valid_hard_negs_atom": str(atom), "image_id": image_id(rec),
           "valid_hard_negs_combined": str(atom + comp)}
    return ("unseen" if (obj["color"], obj["shape"]) in held_out else "seen"), row


def write_csv(path: Path, columns, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)


def write_image(split_dir: Path, rec: dict) -> None:
    """The probe image as ``VG_100K/<image_id>.jpg``."""
    buf = io.BytesIO()
    Image.open(split_dir / rec["image_path"]).convert("RGB").save(buf, format="JPEG", quality=95)
    (split_dir / IMAGE_DIR / f"{image_id(rec)}.jpg").write_bytes(buf.getvalue())


def write(split_dir: Path, main: list[dict], zeroshot: list[dict], seed: int) -> None:
    from negft.world.generator import held_out_combos
    split_dir = Path(split_dir)
    rng = formats.rng(seed, split_dir, "crepe")
    held_out = {tuple(c) for c in held_out_combos(seed)}
    prod = {(kind, n): [] for kind in TYPES for n in COMPLEXITIES}
    syst: dict[str, list[dict]] = {"seen": [], "unseen": []}
    counts = dict.fromkeys(COMPLEXITIES, 0)
    (split_dir / IMAGE_DIR).mkdir(exist_ok=True)
    for index, rec in enumerate(main):
        allowed = [n for n in COMPLEXITIES if n <= most_complex(rec["scene"])]
        fewest = [n for n in allowed if counts[n] == min(counts[m] for m in allowed)]
        target = fewest[int(rng.random() * len(fewest))]
        counts[target] += 1
        for kind, row in prod_rows(rec, target, rng).items():
            prod[kind, target].append(row)
        split, row = syst_row(rec, index, held_out, rng)
        syst[split].append(row)
        write_image(split_dir, rec)
    for (kind, n), rows in prod.items():
        write_csv(split_dir / PROD_DIR / kind / f"prod_vg_hard_negs_{kind}_complexity_{n}.csv", PROD_COLUMNS, rows)
    for split, rows in syst.items():
        write_csv(split_dir / SYST_DIR / f"syst_vg_hard_negs_{split}_compounds_in_{PRETRAINING}.csv", SYST_COLUMNS,
                  rows)
