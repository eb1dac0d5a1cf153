"""Visual Genome → RelComp training shards (the Probe-R/C/B paper, section 5), rule-based and seeded.

    negft data relcomp RELATIONSHIPS IMAGES out=DIR [attributes=FILE] [image_data=FILE] [exclude=FILE,...]
                       [seed=0] [max_per_image=1]

The paper did not release RelComp ("attribute-object and object-object relations ... based on MS COCO and
Visual Genome ... no overlap with the benchmark datasets ... selective negative and positive pairing based
on attribute and predicate swaps"). This builds it from Visual Genome v1.2's released files as they are.

Layouts (the repository and file each was taken from is in ``LAYOUT_SOURCE`` and every manifest.json):

- ``relationships.json``: a list of ``{image_id, relationships: [{relationship_id, predicate, synsets,
  subject: {object_id, name | names: [..], synsets, x, y, w, h[, attributes]}, object: {...}}]}``
- ``attributes.json``: a list of ``{image_id, attributes: [{object_id, names, synsets, x, y, w, h
  [, attributes: [str]]}]}`` (objects without attributes lack the key)
- ``image_data.json``: a list of ``{image_id (or id), url, width, height, coco_id, flickr_id}``
- images: ``IMAGES/VG_100K/<image_id>.jpg`` and ``IMAGES/VG_100K_2/<image_id>.jpg`` (VG's images.zip and
  images2.zip); a flat folder of ``<image_id>.jpg`` works too
- exclusion files (``exclude=``): ARO's ``visual_genome_relation.json`` / ``visual_genome_attribution.json``
  (a list of ``{image_id?, image_path, bbox_x, ..., true_caption, false_caption}``), any JSON list of ids,
  image paths or such dicts, a CSV with an ``image_id`` / ``image_path`` / ``image_0`` / ``image_1`` /
  ``filepath`` column, the Probe-R release's ``relation_eval_{subject,object}.json`` (VG ids: its keys and
  ``positive_image_ids`` / ``negative_image_ids``), the Probe-C release's ``data_*_switch.json`` (COCO ids:
  ``img1_id`` / ``img2_id``), or a text file of one id or path per line. A path's
  stem is a VG image id; a COCO file name (``COCO_val2014_000000123456.jpg``, ``000000123456.jpg``) is a
  COCO id, mapped to VG images through image_data.json's ``coco_id``.

One sample per chosen relationship (at most ``max_per_image`` per image, default 1, so a contrastive
batch rarely holds one image twice), keyed ``vg<image_id>_<relationship_id>``:

- ``relcomp.caption``: the relation with one attribute of each object where it has one ("A red car
  parked next to a white house"); the caption's attribute is a colour where the object has one, else a
  size-like attribute with a known antonym, else any of its attributes. Relationships whose two objects
  both carry an attribute are tried first, then those with one, then the rest (seeded order within).
- ``relcomp.negatives`` (≤ 3, kinds of schema.RELCOMP_NEGATIVE_KINDS, each ``{text, kind, triple,
  attributes}``), every one false of the image's annotations:
    ``attribute``  the two attributes exchanged (when they differ, neither object is annotated with the
                   other's, and the pair is not one name under a symmetric predicate, where that states
                   the caption's reverse), else one attribute replaced by another colour / its antonym
                   that the object is not annotated with (colours seen on that object name first)
    ``predicate``  the predicate's opposite (on → under, left of → right of, ...), else (Probe-R's rule,
                   section 3.1) a predicate frequent with the subject's name but never annotated with
                   this subject-object pair anywhere in VG; never a symmetric or generic one (near, with,
                   has, ...); never one annotated between the two names in this image
    ``exchange``   subject and object exchanged, for non-symmetric predicates only (``is_symmetric``),
                   two different names, and only if the image does not annotate the exchanged triple
  and, as a last guard, no annotated relation of the image (nor, for a symmetric predicate, its reverse)
  states the negative (same names, predicate, and attributes).
- ``relcomp.negative_image``: the kind (``predicate`` / ``exchange``) of a hard negative image — another
  VG image (not excluded, on disk) that annotates that negative's triple and not the caption's — stored
  byte for byte as the ``neg.jpg`` member; null when no image holds either. Found through one
  triple → images index built before the first sample.
- ``caption`` (= relcomp.caption, so the shards also feed a contrastive stream) and ``vg``: image id,
  file, size, coco/flickr ids, the two objects (id, name, attributes, box) and the negative image's id.

Image bytes are copied unchanged. Skipped and counted in manifest.json (``skipped``; an image is counted
once, a relationship once): an image excluded is not a skip but counted in ``exclusion``; an image whose
file is missing; an image without relationships; a relationship with an empty subject/object name, an
empty predicate, or from an object to itself; a relationship examined that has no valid negative
(relationships are examined in order until ``max_per_image`` samples, so later ones are not counted);
an image none of whose relationships made a sample.

Deterministic: each image draws from its own generator seeded by (seed, image_id), so a sample does not
depend on which other images were excluded or missing (only its hard negative image may).

``negft.world.formats.visual_genome.write_vg_example`` writes a small dataset in exactly VG's layout from the
embedded world, with bad rows planted and an ARO-style exclusion file.
"""
from __future__ import annotations

import csv
import json
import os
import random
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

from negft import phrasings
from negft.data.schema import CAPTION, RELCOMP, RELCOMP_NEGATIVE_KINDS
from negft.data.shards import IMAGE_EXTS, MISSING_IMAGE, ShardWriter, truthy

LAYOUT_SOURCE = {
    "relationships.json": "danfeiX/scene-graph-TF-release data_tools/vg_to_roidb.py (encode_relationships, "
                          "sync_objects: img['image_id'], img['relationships'][{predicate, subject/object: "
                          "{object_id, name, x, y, w, h}}]); ranjaykrishna/visual_genome_python_driver "
                          "visual_genome/local.py (relationship_id, synsets; 'name' or 'names')",
    "attributes.json": "ranjaykrishna/visual_genome_python_driver visual_genome/local.py "
                       "(add_attrs_to_scene_graphs / parse_graph_local: img['image_id'], img['attributes']"
                       "[{object_id, names, synsets, attributes, x, y, w, h}])",
    "image_data.json": "ranjaykrishna/visual_genome_python_driver visual_genome/utils.py (parse_image_data: "
                       "id or image_id, url, width, height, coco_id, flickr_id)",
    "images": "danfeiX/scene-graph-TF-release data_tools/vg_to_imdb.py (<image_dir>/<image_id>.jpg); "
              "VG's images.zip / images2.zip unpack to VG_100K/ and VG_100K_2/",
    "aro_exclusion": "mertyg/vision-language-models-are-bows dataset_zoo/aro_datasets.py (VG_Relation / "
                     "VG_Attribution: visual_genome_relation.json / visual_genome_attribution.json, a list "
                     "of {image_path, bbox_x, bbox_y, bbox_w, bbox_h, true_caption, false_caption, ...}, "
                     "images at <root>/images/<image_path>)",
}
IMAGE_DIRS = ("VG_100K", "VG_100K_2")

# skip reasons (manifest.json's "skipped")
MISSING_FILE = MISSING_IMAGE
NO_RELATIONSHIPS = "image without relationships"
NO_SAMPLE = "image without a usable relationship"
EMPTY_NAME = "relationship with an empty subject or object name"
EMPTY_PREDICATE = "relationship with an empty predicate"
SELF_RELATION = "relationship from an object to itself"
NO_NEGATIVE = "relationship with no valid negative"

# the world's RelComp phrasings that read well with any VG predicate ("{subj} is {rel}" fails for "has")
TEMPLATES = tuple(t for t in phrasings.RELCOMP_TRAIN if "{subj} is " not in t)

# predicates whose subject and object can be exchanged without making the caption false: exchanging them
# is no negative (ARO drops such relations from VG-Relation's score for the same reason: mertyg/
# vision-language-models-are-bows, notebooks/Replicate ARO! VG-Relation, VG-Attribution.ipynb)
SYMMETRIC_TAILS = ("next to", "near", "beside", "by", "close to", "adjacent to", "alongside", "with", "and",
                   "touching", "facing", "between", "among", "around", "surrounding", "opposite",
                   "across from", "talking to", "playing with", "same as", "similar to", "mixed with",
                   "connected to", "attached to", "tied to", "hugging", "kissing", "meeting", "side by side")
# vague predicates that often hold together with others ("man in / with / has shirt"): never a fallback swap
GENERIC = {"of", "has", "have", "having", "in", "on", "at", "is", "are", "from", "for", "to", "inside",
           "wearing", "wears", "holding", "holds", "has a", "have a", "belonging to", "part of", "on top of"}
OPPOSITE = {
    "left of": "right of", "right of": "left of",
    "to the left of": "to the right of", "to the right of": "to the left of",
    "on the left of": "on the right of", "on the right of": "on the left of",
    "on left side of": "on right side of", "on right side of": "on left side of",
    "above": "below", "below": "above", "over": "under", "under": "on", "on": "under",
    "on top of": "under", "beneath": "above", "underneath": "above",
    "in front of": "behind", "behind": "in front of", "inside": "outside", "outside": "inside",
    "inside of": "outside of", "outside of": "inside of",
    "higher than": "lower than", "lower than": "higher than", "bigger than": "smaller than",
    "larger than": "smaller than", "smaller than": "bigger than", "taller than": "shorter than",
    "shorter than": "taller than",
}
FALLBACK_TOP = 20           # Probe-R fallback: the subject name's most frequent predicates considered

COLORS = ("white", "black", "blue", "red", "green", "yellow", "brown", "gray", "orange", "pink", "purple",
          "silver", "tan", "gold", "beige", "cyan", "maroon", "navy")
_COLOR_ALIASES = {"grey": "gray", "golden": "gold"}
ANTONYMS = {"small": ("large", "big"), "little": ("large", "big"), "large": ("small",), "big": ("small",),
            "tall": ("short",), "long": ("short",), "short": ("long",), "open": ("closed",),
            "closed": ("open",), "empty": ("full",), "full": ("empty",), "wet": ("dry",), "dry": ("wet",),
            "young": ("old",), "old": ("young",), "clean": ("dirty",), "dirty": ("clean",),
            "thick": ("thin",), "thin": ("thick",), "wide": ("narrow",), "narrow": ("wide",),
            "standing": ("sitting",), "sitting": ("standing",), "bright": ("dark",), "dark": ("bright",)}
_IRREGULAR_PLURALS = {"people", "men", "women", "children", "feet", "teeth", "mice", "geese", "police"}
_DETERMINERS = ("a ", "an ", "the ", "some ", "two ", "three ", "many ", "several ")
_COCO_NAME = re.compile(r"^(?:COCO_[A-Za-z0-9]+_)?(0\d{11})$")


# ------------------------------------------------------------------ text
def norm(value) -> str:
    """Lower case, whitespace collapsed; '' for anything not a string."""
    return " ".join(value.lower().split()) if isinstance(value, str) else ""


def object_name(obj: dict) -> str:
    """An object's name: ``name``, or the first of ``names`` (VG uses both)."""
    name = obj.get("name")
    if name is None:
        names = obj.get("names") or [""]
        name = names[0] if isinstance(names, list) else names
    return norm(name)


def is_symmetric(pred: str) -> bool:
    return any(pred == t or pred.endswith(" " + t) for t in SYMMETRIC_TAILS)


def _color(attr: str) -> str | None:
    attr = _COLOR_ALIASES.get(attr, attr)
    return attr if attr in COLORS else None


def _plural(name: str) -> bool:
    last = name.split()[-1]
    return last in _IRREGULAR_PLURALS or (last.endswith("s") and not last.endswith(("ss", "us", "is", "ous")))


def noun_phrase(attr: str | None, name: str) -> str:
    """'a red car', 'an old man', 'white clouds' (no article for plurals or a name with a determiner)."""
    phrase = f"{attr} {name}" if attr else name
    if name.startswith(_DETERMINERS) or _plural(name):
        return phrase
    return phrasings.with_article(phrase)


def say(template: str, s_attr, s: str, pred: str, o_attr, o: str) -> str:
    text = template.format(subj=noun_phrase(s_attr, s), rel=pred, obj=noun_phrase(o_attr, o))
    return text[0].upper() + text[1:]


# ------------------------------------------------------------------ reading VG
def _load_json(path, what: str):
    try:
        with open(path, "rb") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} {path} is not JSON ({e})") from None


def _box(obj: dict) -> tuple:
    try:
        return tuple(int(obj[k]) for k in ("x", "y", "w", "h"))
    except (KeyError, TypeError, ValueError):
        return ()


class VG:
    """Visual Genome's relationships (compact), object attributes, image metadata and the indices the
    negatives need: triple → images, subject name → predicate counts, object name → colour counts."""

    def __init__(self, relationships, attributes=None, image_data=None):
        self.attrs: dict[int, set[str]] = defaultdict(set)
        self.names: dict[int, str] = {}
        self.images: list[tuple] = []     # (image_id, [rel], [(reason, relationship_id)])
        self.meta: dict[int, dict] = {}
        if image_data:
            for row in _load_json(image_data, "image_data"):
                iid = row.get("image_id", row.get("id")) if isinstance(row, dict) else None
                if isinstance(iid, int):
                    self.meta[iid] = row
        data = _load_json(relationships, "relationships")
        if not isinstance(data, list):
            raise ValueError(f"relationships {relationships}: expected a list of {{image_id, relationships}}, "
                             f"got {type(data).__name__}")
        intern = sys.intern
        for img in data:
            iid = img.get("image_id", img.get("id"))
            rels, bad = [], []
            for r in img.get("relationships") or []:
                rid = r.get("relationship_id", r.get("id"))
                subj, obj = r.get("subject") or {}, r.get("object") or {}
                s, o, p = object_name(subj), object_name(obj), norm(r.get("predicate"))
                s_id, o_id = subj.get("object_id", subj.get("id")), obj.get("object_id", obj.get("id"))
                if not s or not o:
                    bad.append((EMPTY_NAME, rid))
                    continue
                if not p:
                    bad.append((EMPTY_PREDICATE, rid))
                    continue
                if s_id == o_id:
                    bad.append((SELF_RELATION, rid))
                    continue
                for oid, d, name in ((s_id, subj, s), (o_id, obj, o)):
                    self.names.setdefault(oid, intern(name))
                    self._add_attrs(oid, d.get("attributes"))
                rels.append((rid, s_id, intern(s), _box(subj), intern(p), o_id, intern(o), _box(obj)))
            self.images.append((iid, rels, bad))
        del data
        if attributes:
            for img in _load_json(attributes, "attributes"):
                for a in img.get("attributes") or []:
                    oid = a.get("object_id", a.get("id"))
                    self._add_attrs(oid, a.get("attributes"))
                    if oid not in self.names:
                        self.names[oid] = intern(object_name(a))
        self.index: dict[tuple, list[int]] = defaultdict(list)
        self.subject_predicates: dict[str, Counter] = defaultdict(Counter)
        for iid, rels, _ in self.images:
            for t in dict.fromkeys((r[2], r[4], r[6]) for r in rels):
                self.index[t].append(iid)
            for r in rels:
                self.subject_predicates[r[2]][r[4]] += 1
        self.colors: dict[str, Counter] = defaultdict(Counter)
        for oid, attrs in self.attrs.items():
            for a in attrs:
                if _color(a):
                    self.colors[self.names.get(oid, "")][_color(a)] += 1
        self._sets: dict[tuple, set] = {}
        self._top: dict[str, list[str]] = {}

    def _add_attrs(self, oid, attrs) -> None:
        if isinstance(attrs, list):
            for a in attrs:
                a = norm(a)
                if a:
                    self.attrs[oid].add(sys.intern(a))

    def annotated_in(self, triple: tuple, iid: int) -> bool:
        """Does image ``iid`` annotate ``triple`` (subject name, predicate, object name)?"""
        ids = self.index.get(triple, ())
        if len(ids) < 32:
            return iid in ids
        if triple not in self._sets:
            self._sets[triple] = set(ids)
        return iid in self._sets[triple]

    def top_predicates(self, subject: str) -> list[str]:
        if subject not in self._top:
            ranked = sorted(self.subject_predicates[subject].items(), key=lambda kv: (-kv[1], kv[0]))
            self._top[subject] = [p for p, _ in ranked[:FALLBACK_TOP]]
        return self._top[subject]


def image_files(root: Path) -> dict[str, list[str]]:
    """File name → paths (relative to ``root``) in VG_100K/, VG_100K_2/ and ``root`` itself."""
    found: dict[str, list[str]] = defaultdict(list)
    for sub in ("", *IMAGE_DIRS):
        folder = root / sub
        if not folder.is_dir():
            continue
        with os.scandir(folder) as it:
            for e in it:
                if Path(e.name).suffix.lower() in IMAGE_EXTS and e.is_file():
                    found[e.name].append(f"{sub}/{e.name}" if sub else e.name)
    return found


def _id_of(value) -> tuple[str, int] | None:
    """('vg', id) or ('coco', id) from an id or an image path; None when it names neither."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return "vg", value
    if not isinstance(value, str) or not value.strip():
        return None
    stem = Path(value.strip()).stem
    m = _COCO_NAME.match(stem)
    if m:
        return "coco", int(m.group(1))
    return ("vg", int(stem)) if stem.isdigit() else None


_ID_FIELDS = ("image_id", "image_path", "image", "filepath", "file_name", "image_0", "image_1", "x0")
# the Probe-R / Probe-C release (negft/data/layout_rcb.py): relation_eval_*.json lists VG ids, the
# data_*_switch.json pairs COCO val2014 ids
_PROBE_R_FIELDS = ("positive_image_ids", "negative_image_ids")
_PROBE_C_FIELDS = ("img1_id", "img2_id")


def exclusion_ids(paths) -> dict:
    """VG and COCO image ids listed in exclusion files (see the module docstring)."""
    vg, coco, unparsed = set(), set(), 0

    def take(value):
        nonlocal unparsed
        got = _id_of(value)
        if got is None:
            unparsed += 1
        else:
            (vg if got[0] == "vg" else coco).add(got[1])

    def take_row(row: dict):
        coco_ids = [row[k] for k in _PROBE_C_FIELDS if str(row.get(k, "")).strip().isdigit()]
        vg_ids = [i for k in _PROBE_R_FIELDS for i in (row.get(k) or []) if isinstance(row.get(k), list)]
        if coco_ids or vg_ids:            # Probe-C pairs (COCO ids), Probe-R entries (VG ids)
            coco.update(int(i) for i in coco_ids)
            for i in vg_ids:
                take(int(i) if str(i).isdigit() else i)
            return
        keys = [k for k in _ID_FIELDS if row.get(k) not in (None, "")]
        if "image_id" in keys:            # ARO rows may carry both: the id wins
            keys = ["image_id"] + [k for k in keys if k in ("image_0", "image_1")]
        if not keys:
            nonlocal unparsed
            unparsed += 1
        for k in keys:
            take(row[k])

    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"exclusion file {path} not found")
        if path.suffix.lower() == ".json":
            data = _load_json(path, "exclusion file")
            if isinstance(data, dict) and data and all(isinstance(v, dict) for v in data.values()):
                for key in data:          # Probe-R: entries keyed by their VG image id
                    take(int(key) if str(key).isdigit() else key)
                data = list(data.values())
            elif isinstance(data, dict):
                data = next((data[k] for k in ("images", "data", "annotations") if isinstance(data.get(k), list)),
                            list(data))
            for item in data:
                take_row(item) if isinstance(item, dict) else take(item)
        elif path.suffix.lower() == ".csv":
            with open(path, newline="") as f:
                for row in csv.DictReader(f):
                    take_row(row)
        else:
            for line in path.read_text().splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    take(line.strip().split(",")[0].strip())
    return {"vg": vg, "coco": coco, "unparsed": unparsed}


# ------------------------------------------------------------------ building
class Builder:
    def __init__(self, vg: VG, root: Path, files: dict, excluded: set, seed: int, max_per_image: int):
        self.vg, self.root, self.files, self.excluded = vg, root, files, excluded
        self.seed, self.max_per_image = seed, max_per_image
        self._path_cache: dict[int, str | None] = {}
        self.stats = {"negatives": Counter(), "negative_images": Counter(), "predicate_rule": Counter(),
                      "attribute_rule": Counter()}

    def path(self, iid: int) -> str | None:
        """The image's file relative to the image root, or None when it is not on disk."""
        if iid not in self._path_cache:
            url = str(self.vg.meta.get(iid, {}).get("url") or "")
            names = [n for n in (Path(url).name, f"{iid}.jpg") if n]
            want = Path(url).parent.name
            found = None
            for name in names:
                hits = self.files.get(name)
                if hits:
                    found = next((h for h in hits if h.startswith(want + "/")), hits[0]) if want else hits[0]
                    break
            self._path_cache[iid] = found
        return self._path_cache[iid]

    # -------------------------------------------------------------- one relationship
    def _holds(self, rels, s_attr, s, p, o_attr, o) -> bool:
        """Does some annotated relation of the image state this caption (names, predicate, attributes)? For
        a symmetric predicate an annotated relation states its reverse too."""
        attrs = self.vg.attrs

        def states(r, s_attr, s, o_attr, o):
            return (r[2] == s and r[4] == p and r[6] == o and (s_attr is None or s_attr in attrs.get(r[1], ()))
                    and (o_attr is None or o_attr in attrs.get(r[5], ())))
        both = is_symmetric(p)
        return any(states(r, s_attr, s, o_attr, o) or both and states(r, o_attr, o, s_attr, s) for r in rels)

    def _caption_attr(self, oid, rng) -> str | None:
        attrs = sorted(self.vg.attrs.get(oid, ()))
        if not attrs:
            return None
        pool = [a for a in attrs if _color(a)] or [a for a in attrs if a in ANTONYMS] or attrs
        return pool[int(rng.random() * len(pool))]

    def _replacement(self, attr: str, oid, name: str, rng) -> str | None:
        """Another colour / an antonym the object is not annotated with."""
        own = self.vg.attrs.get(oid, ())
        if _color(attr):
            own_colors = {_color(a) for a in own if _color(a)}
            seen = self.vg.colors.get(name, Counter())
            pool = sorted((c for c in COLORS if c not in own_colors), key=lambda c: (-seen[c], c))
            pool = [c for c in pool if seen[c] > 0][:3] or pool
        else:
            pool = [a for a in ANTONYMS.get(attr, ()) if a not in own]
        return pool[int(rng.random() * len(pool))] if pool else None

    def example(self, iid: int, rels: list, rel: tuple, rng) -> dict | None:
        rid, s_id, s, s_box, p, o_id, o, o_box = rel
        vg = self.vg
        sa, oa = self._caption_attr(s_id, rng), self._caption_attr(o_id, rng)
        template = TEMPLATES[int(rng.random() * len(TEMPLATES))]
        caption = say(template, sa, s, p, oa, o)
        here = {(r[2], r[4], r[6]) for r in rels}
        negatives = []

        def add(kind, ns_attr, ns, np_, no_attr, no):
            text = say(template, ns_attr, ns, np_, no_attr, no)
            if text == caption or any(n["text"] == text for n in negatives) \
                    or self._holds(rels, ns_attr, ns, np_, no_attr, no):
                return False
            negatives.append({"text": text, "kind": kind, "triple": [ns, np_, no], "attributes": [ns_attr, no_attr]})
            return True

        # attribute: exchange the two attributes, else replace one by one the object does not have
        s_own, o_own = vg.attrs.get(s_id, ()), vg.attrs.get(o_id, ())
        # (with one name and a symmetric predicate the exchanged attributes state the caption's reverse: true)
        if sa and oa and sa != oa and sa not in o_own and oa not in s_own and not (s == o and is_symmetric(p)) \
                and add("attribute", oa, s, p, sa, o):
            self.stats["attribute_rule"]["exchanged"] += 1
        else:
            which = [k for k, a in ((0, sa), (1, oa)) if a]
            if len(which) == 2 and rng.random() < 0.5:
                which.reverse()
            for k in which:
                oid, attr, name = (s_id, sa, s) if k == 0 else (o_id, oa, o)
                new = self._replacement(attr, oid, name, rng)
                if new and add("attribute", *((new, s, p, oa, o) if k == 0 else (sa, s, p, new, o))):
                    self.stats["attribute_rule"]["replaced"] += 1
                    break
        # predicate: its opposite, else one frequent with the subject but never seen with this pair
        swap, rule = OPPOSITE.get(p), "opposite"
        if swap is None or (s, swap, o) in here:
            pool = [q for q in vg.top_predicates(s) if q != p and q not in GENERIC and not is_symmetric(q)
                    and q not in OPPOSITE and (s, q, o) not in vg.index]
            swap, rule = (pool[int(rng.random() * len(pool))], "unseen with the pair") if pool else (None, None)
        if swap and (s, swap, o) not in here and add("predicate", sa, s, swap, oa, o):
            self.stats["predicate_rule"][rule] += 1
        # exchange: not for symmetric predicates, nor when the image annotates the exchanged triple
        if s != o and not is_symmetric(p) and (o, p, s) not in here:
            add("exchange", oa, o, p, sa, s)
        if not negatives:
            return None

        # hard negative image: another image annotating a negative's triple but not the caption's
        neg_kind, neg_id = None, None
        kinds = [n for n in negatives if n["kind"] in ("predicate", "exchange")]
        rng.shuffle(kinds)
        for n in kinds:
            cands = vg.index.get(tuple(n["triple"]), ())
            start = int(rng.random() * len(cands)) if cands else 0
            for k in range(min(len(cands), 64)):
                b = cands[(start + k) % len(cands)]
                if b != iid and b not in self.excluded and not vg.annotated_in((s, p, o), b) and self.path(b):
                    neg_kind, neg_id = n["kind"], b
                    break
            if neg_kind:
                break
        for n in negatives:
            self.stats["negatives"][n["kind"]] += 1
        self.stats["negative_images"][str(neg_kind)] += 1
        meta = vg.meta.get(iid, {})
        return {
            CAPTION: caption,
            RELCOMP: {"caption": caption, "negatives": negatives, "negative_image": neg_kind,
                      "negative_image_id": neg_id, "triple": [s, p, o], "attributes": [sa, oa],
                      "template": template, "relationship_id": rid},
            "vg": {"image_id": iid, "file": self.path(iid), "width": meta.get("width"),
                   "height": meta.get("height"), "coco_id": meta.get("coco_id"),
                   "flickr_id": meta.get("flickr_id"),
                   "subject": {"object_id": s_id, "name": s, "attributes": sorted(s_own), "box": list(s_box)},
                   "object": {"object_id": o_id, "name": o, "attributes": sorted(o_own), "box": list(o_box)},
                   "negative_image_file": self.path(neg_id) if neg_id is not None else None},
        }

    # -------------------------------------------------------------- one image
    def image(self, iid: int, rels: list, skip) -> list[dict]:
        rng = random.Random(f"negft-relcomp-vg/{self.seed}/{iid}")
        attrs = self.vg.attrs
        order = list(range(len(rels)))
        rng.shuffle(order)
        order.sort(key=lambda k: -((rels[k][1] in attrs) + (rels[k][5] in attrs)))
        out, captions = [], set()
        for k in order:
            if len(out) >= self.max_per_image:
                break
            ex = self.example(iid, rels, rels[k], rng)
            if ex is None:
                skip(NO_NEGATIVE, f"image_id {iid} relationship_id {rels[k][0]}")
            elif ex[CAPTION] not in captions:
                captions.add(ex[CAPTION])
                out.append(ex)
        return out


def _files(value) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [v.strip() for v in str(value or "").split(",") if v.strip()]


def relcomp(relationships, images, out, attributes="", image_data="", exclude="", seed="0", max_per_image="1",
            maxcount="1000", progress="true") -> dict:
    """VG relationships.json (+ attributes.json, image_data.json) and images → RelComp shards in ``out``;
    see the module docstring. ``attributes`` / ``image_data`` default to the files of those names beside
    RELATIONSHIPS (``attributes=none``: build without attributes); ``exclude``: comma-separated files."""
    relationships, root = Path(relationships), Path(images)
    if not relationships.is_file():
        raise FileNotFoundError(f"relationships file {relationships} not found")
    if not root.is_dir():
        raise FileNotFoundError(f"image folder {root} not found (VG's root holding VG_100K/ and VG_100K_2/)")
    if str(attributes).lower() == "none":
        attributes = None
    else:
        attributes = Path(attributes) if attributes else relationships.parent / "attributes.json"
        if not attributes.is_file():
            raise FileNotFoundError(f"attributes file {attributes} not found (attributes=none builds without "
                                    f"attributes: captions then name no attribute)")
    image_data = Path(image_data) if image_data else relationships.parent / "image_data.json"
    if not image_data.is_file():
        if str(image_data) != str(relationships.parent / "image_data.json"):
            raise FileNotFoundError(f"image_data file {image_data} not found")
        image_data = None
    exclude = _files(exclude)
    seed, max_per_image = int(seed), int(max_per_image)
    if max_per_image < 1:
        raise ValueError(f"max_per_image must be >= 1, got {max_per_image}")
    listed = exclusion_ids(exclude)           # fail on a missing file before out/ is made
    inputs = {"relationships": str(relationships), "attributes": str(attributes or ""),
              "image_data": str(image_data or ""), "images": str(root), "exclude": exclude}
    with ShardWriter(out, "relcomp-vg", LAYOUT_SOURCE, inputs, maxcount=int(maxcount),
                     progress=truthy(progress)) as writer:
        vg = VG(relationships, attributes, image_data)
        coco_to_vg = {row.get("coco_id"): iid for iid, row in vg.meta.items() if row.get("coco_id")}
        excluded = set(listed["vg"]) | {coco_to_vg[c] for c in listed["coco"] if c in coco_to_vg}
        builder = Builder(vg, root, image_files(root), excluded, seed, max_per_image)
        n_excluded = missing = used = 0
        for iid, rels, bad in vg.images:
            if iid in excluded:
                n_excluded += 1
                continue
            if builder.path(iid) is None:
                missing += 1
                writer.skip(MISSING_FILE, f"image_id {iid}")
                continue
            for reason, rid in bad:
                writer.skip(reason, f"image_id {iid} relationship_id {rid}")
            if not rels:
                if not bad:
                    writer.skip(NO_RELATIONSHIPS, f"image_id {iid}")
                else:
                    writer.skip(NO_SAMPLE, f"image_id {iid}")
                continue
            samples = builder.image(iid, rels, writer.skip)
            if not samples:
                writer.skip(NO_SAMPLE, f"image_id {iid}")
                continue
            used += 1
            rel_path = builder.path(iid)
            with open(root / rel_path, "rb") as f:
                data = f.read()
            for meta in samples:
                extra = None
                neg_file = meta["vg"]["negative_image_file"]
                if neg_file:
                    with open(root / neg_file, "rb") as f:
                        extra = {f"neg.{IMAGE_EXTS[Path(neg_file).suffix.lower()]}": f.read()}
                writer.add(f"vg{iid}_{meta[RELCOMP]['relationship_id']}", data,
                           IMAGE_EXTS[Path(rel_path).suffix.lower()], meta, extra)
        writer.notes.update({
            "images": {"in_relationships": len(vg.images), "excluded": n_excluded, "missing": missing,
                       "with_samples": used},
            "exclusion": {"files": exclude, "vg_ids_listed": len(listed["vg"]), "coco_ids_listed": len(listed["coco"]),
                          "coco_ids_mapped": sum(c in coco_to_vg for c in listed["coco"]),
                          "unparsed_entries": listed["unparsed"], "images_excluded": n_excluded},
            "negatives_by_kind": {k: builder.stats["negatives"][k] for k in RELCOMP_NEGATIVE_KINDS},
            "negative_images_by_kind": dict(sorted(builder.stats["negative_images"].items())),
            "predicate_rule": dict(sorted(builder.stats["predicate_rule"].items())),
            "attribute_rule": dict(sorted(builder.stats["attribute_rule"].items())),
            "seed": seed, "max_per_image": max_per_image,
            "policy": "one caption per chosen relationship with one attribute per object; selective negatives "
                      "(attribute / predicate / exchange, each false of the image's annotations); hard negative "
                      "image: another VG image annotating a negative's triple but not the caption's",
        })
        manifest = writer.close()
    return {**manifest, "out": str(out)}

