"""Tests of the embedded world generator (negft.world.generator) on a tiny world."""

from __future__ import annotations

import csv
import io
import json
import re
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from negft.data import schema
from negft.world import generator as world_gen
from negft import phrasings
from negft.text import _NEG_RE

SHAPES = world_gen.SHAPES
SHAPE_RE = re.compile(r"\b(" + "|".join(SHAPES) + r")\b")
NEG_WORDS_RE = re.compile(r"\b(no|not|without|absent|none|nothing|never|lacking|lacks|missing|nowhere|"
                          r"neither|nor)\b|n't", re.IGNORECASE)


# ------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def world(cache):
    """The session's tiny world of seed 0 (tests/conftest.py ``cache``, drawn by two workers), read only."""
    out = cache / "world-s0-tiny"
    return out, json.loads((out / "world.json").read_text())


@pytest.fixture(scope="session")
def world_w1(tmp_path_factory):
    """The same world drawn by one process and in two parts, as a run that needs only the finetune split draws it
    and a later one adds the rest: (folder, world.json, the first part's world.json and folders)."""
    out = tmp_path_factory.mktemp("world0_w1")
    first = world_gen.build_world(out, seed=0, size="tiny", workers=1, progress=False, splits=("finetune",))
    drawn = sorted(p.name for p in out.iterdir() if not p.name.startswith("."))
    return out, world_gen.build_world(out, seed=0, size="tiny", workers=1, progress=False), first, drawn


@pytest.fixture(scope="session")
def world_seed1(tmp_path_factory):
    out = tmp_path_factory.mktemp("world1")
    return out, world_gen.build_world(out, seed=1, size="tiny", workers=2, progress=False, splits=("pretrain",))


def read_shards(split_dir: Path) -> list[tuple[str, bytes, dict]]:
    """(key, png bytes, json) for every sample, read with tarfile (webdataset's layout: key.ext)."""
    samples: dict[str, dict] = {}
    for tar_path in sorted(split_dir.glob("shard-*.tar")):
        with tarfile.open(tar_path) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return [(k, v["png"], json.loads(v["json"])) for k, v in samples.items()]


@pytest.fixture(scope="session")
def shards(world):
    out, _ = world
    return {s: read_shards(out / s) for s in world_gen.TRAIN_SPLITS}


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def load_annotations(split_dir: Path) -> dict[str, dict]:
    with open(split_dir / "annotations.jsonl") as f:
        return {r["image_path"]: r for r in map(json.loads, f)}


# ------------------------------------------------------------------ a template-based parser
def _slot_re(name: str) -> str:
    shape = "(?:" + "|".join(SHAPES) + ")"
    if name in ("p", "q", "Q", "an"):
        return rf"(?P<{name}>(?:[Aa]n?) {shape})"
    if name in ("n", "qn"):
        return rf"(?P<{name}>{shape})"
    if name == "bg":
        phrases = [p for ps in phrasings.BACKGROUND_PHRASES.values() for p in ps]
        return "(?P<bg>" + "|".join(map(re.escape, phrases)) + ")"
    return rf"(?P<{name}>.+)"           # objs / pos: a free list phrase


def compile_template(t: str) -> re.Pattern:
    parts = re.split(r"(\{\w+\})", t[0].lower() + t[1:])
    return re.compile("".join(_slot_re(p[1:-1]) if p.startswith("{") else re.escape(p) for p in parts) + "$")


AFFIRMED_SLOTS, NEGATED_SLOTS = ("p", "objs", "pos"), ("q", "Q", "qn", "n", "an")


def parse(text: str, templates) -> list[tuple[str, set, set]]:
    """Every way ``text`` matches a template: (template, affirmed shapes, negated shapes)."""
    text = text[0].lower() + text[1:]
    parses = []
    for t in templates:
        m = compile_template(t).match(text)
        if m:
            g = m.groupdict()
            aff = {s for k in AFFIRMED_SLOTS if g.get(k) for s in SHAPE_RE.findall(g[k])}
            neg = {s for k in NEGATED_SLOTS if g.get(k) for s in SHAPE_RE.findall(g[k])}
            parses.append((t, aff, neg))
    return parses


MCQ_KIND = {t: kind for table in (phrasings.MCQ_TRAIN, phrasings.MCQ_HELD_OUT) for kind, ts in table.items() for t in ts}


def mcq_truth(option: str, present: set) -> tuple[str, bool]:
    """(template kind, true of the scene?) of one MCQ option, by parsing it back."""
    ps = parse(option, list(MCQ_KIND))
    assert ps, f"MCQ option matches no template: {option!r}"
    results = {(MCQ_KIND[t], aff <= present and not (neg & present)) for t, aff, neg in ps}
    assert len(results) == 1, f"ambiguous MCQ option {option!r}: {results}"
    for t, aff, neg in ps:
        kind = MCQ_KIND[t]
        assert (len(aff), len(neg)) == {"positive": (1, 0), "negative": (0, 1), "hybrid": (1, 1)}[kind]
    return results.pop()


def check_mcq(options, answer, answer_template, option_templates, present: set):
    truths = [mcq_truth(o, present) for o in options]
    true_idx = [i for i, (_, ok) in enumerate(truths) if ok]
    assert len(true_idx) == 1, (options, present)
    assert answer == true_idx[0]
    assert [k for k, _ in truths] == list(option_templates)
    assert answer_template == option_templates[answer]


def check_negated(text: str, templates, present: set) -> None:
    ps = parse(text, templates)
    assert ps, f"no negation template matches {text!r}"
    for _, aff, neg in ps:
        assert len(neg) == 1 and not (neg & present), (text, present)
        assert aff and aff <= present, (text, present)


def check_affirmative(text: str, present: set) -> None:
    assert not NEG_WORDS_RE.search(text), text
    mentioned = set(SHAPE_RE.findall(text))
    assert mentioned and mentioned <= present, (text, present)


def training_texts(rec: dict) -> list[str]:
    texts = [rec[schema.CAPTION]]
    texts += rec.get(schema.NEGCAP, [])
    if schema.MCQ in rec:
        texts += rec[schema.MCQ]["options"]
    if schema.RELCOMP in rec:
        texts += [rec[schema.RELCOMP]["caption"]] + [n["text"] for n in rec[schema.RELCOMP]["negatives"]]
    return texts


def relcomp_true(caption: str, objs: list[dict], template: str) -> bool:
    """A RelComp caption is true of a scene iff it states one of the scene's relations."""
    return any(caption == phrasings.relcomp_caption(objs[x], p, objs[y], template) for x, p, y in world_gen.relations(objs))


def present_of(scene: dict) -> set:
    return {o["shape"] for o in scene["objects"]}


# ------------------------------------------------------------------ tests
def test_layout_and_meta(world):
    out, meta = world
    assert json.loads((out / "world.json").read_text()) == meta
    for key in ("seed", "size", "counts", "generator_version", "shapes", "colors", "sizes", "fills",
                "backgrounds", "held_out_combos", "held_out_templates", "classes", "images_per_second"):
        assert key in meta, key
    assert meta["generator_version"] == world_gen.GENERATOR_VERSION and meta["classes"] == list(SHAPES)
    assert len(SHAPES) >= 12 and len(meta["colors"]) >= 8 and len(meta["fills"]) == 3
    assert len(meta["backgrounds"]) >= 4 and meta["sizes"] == ["small", "large"]
    assert not list(out.glob(".*.tmp"))
    for split in ("val", "test"):
        for name in ("mcq.csv", "retrieval.csv", "retrieval_neg.csv", "zeroshot.csv", "annotations.jsonl"):
            assert (out / split / name).exists()
        n = world_gen.SIZES["tiny"][split]
        assert len(read_csv(out / split / "mcq.csv")) == n
        assert len(read_csv(out / split / "zeroshot.csv")) == n // 2
    with open(out / "test" / "mcq.csv", newline="") as f:
        assert tuple(next(csv.reader(f))) == schema.MCQ_CSV_COLUMNS


def test_cached_rebuild_is_a_noop(world):
    out, meta = world
    before = (out / "world.json").stat().st_mtime_ns
    assert world_gen.build_world(out, seed=0, size="tiny", workers=2, progress=False) == meta
    assert (out / "world.json").stat().st_mtime_ns == before


def test_counts_and_images(world, shards):
    out, meta = world
    assert len(shards["pretrain"]) == world_gen.SIZES["tiny"]["pretrain"]
    assert len(shards["finetune"]) == world_gen.SIZES["tiny"]["finetune"]
    pre_keys = {k for k, _, _ in shards["pretrain"]}
    assert not pre_keys & {k for k, _, _ in shards["finetune"]}
    for _, png, _ in shards["pretrain"][:5] + shards["finetune"][:5]:
        im = Image.open(io.BytesIO(png))
        assert im.size == (world_gen.IMAGE_SIZE, world_gen.IMAGE_SIZE) and im.mode == "RGB"
    pngs = [png for _, png, _ in shards["pretrain"][:50]]
    assert len(set(pngs)) == len(pngs)
    im = Image.open(out / "test" / read_csv(out / "test" / "mcq.csv")[0]["image_path"])
    assert im.size == (world_gen.IMAGE_SIZE, world_gen.IMAGE_SIZE)


def _check_scene(scene: dict) -> None:
    objs = scene["objects"]
    assert 1 <= len(objs) <= 4 and scene["background"] in world_gen.BACKGROUNDS
    assert len({o["shape"] for o in objs}) == len(objs)
    for o in objs:
        x0, y0, x1, y1 = o["bbox"]
        assert 0 <= x0 < x1 <= world_gen.IMAGE_SIZE and 0 <= y0 < y1 <= world_gen.IMAGE_SIZE
        assert x0 <= o["x"] <= x1 and y0 <= o["y"] <= y1
        assert (x0 - 1) % world_gen.GRID == 0 and (y0 - 1) % world_gen.GRID == 0, "object off the patch grid"
        assert o["color"] in world_gen.COLORS and o["size"] in ("small", "large") and o["fill"] in world_gen.FILLS
    for i, a in enumerate(objs):
        for b in objs[i + 1:]:
            (ax0, ay0, ax1, ay1), (bx0, by0, bx1, by1) = a["bbox"], b["bbox"]
            assert ax1 <= bx0 or bx1 <= ax0 or ay1 <= by0 or by1 <= ay0, "overlapping objects"
    expected = set()
    m = world_gen.REL_MARGIN
    for i, a in enumerate(objs):
        for j, b in enumerate(objs):
            if i != j:
                if a["x"] < b["x"] - m:
                    expected.add((i, "left of", j))
                if a["x"] > b["x"] + m:
                    expected.add((i, "right of", j))
                if a["y"] < b["y"] - m:
                    expected.add((i, "above", j))
                if a["y"] > b["y"] + m:
                    expected.add((i, "below", j))
    assert {tuple(r) for r in scene["relations"]} == expected
    for i, rel, j in scene["relations"]:  # opposite relations both ways
        inverse = {"left of": "right of", "right of": "left of", "above": "below", "below": "above"}[rel]
        assert (j, inverse, i) in expected


def test_scenes_and_relations(world, shards):
    out, _ = world
    for split in ("pretrain", "finetune"):
        for _, _, rec in shards[split]:
            _check_scene(rec[schema.SCENE])
    for split in ("val", "test"):
        for ann in load_annotations(out / split).values():
            _check_scene(ann["scene"])


def test_pretrain_captions_affirmative(shards):
    full = 0
    for _, _, rec in shards["pretrain"]:
        present = present_of(rec[schema.SCENE])
        check_affirmative(rec[schema.CAPTION], present)
        assert schema.NEGCAP not in rec and schema.MCQ not in rec
        full += set(SHAPE_RE.findall(rec[schema.CAPTION])) == present
    assert full / len(shards["pretrain"]) > 0.8  # all objects named most of the time


def test_alt_text_rarely_names_the_setting(shards):
    """Background words are a shortcut that slows shape learning, so alt-text names them ~ALT_TEXT_BG_P."""
    bg_words = re.compile("|".join(re.escape(p) for ps in phrasings.BACKGROUND_PHRASES.values() for p in ps), re.I)
    caps = [rec[schema.CAPTION] for _, _, rec in shards["pretrain"]]
    share = sum(bool(bg_words.search(c)) for c in caps) / len(caps)
    assert abs(share - world_gen.ALT_TEXT_BG_P) < 0.06, share
    rng = np.random.default_rng(0)
    scene = shards["pretrain"][0][2][schema.SCENE]
    assert all(bg_words.search(phrasings.affirmative_caption(scene, rng, bg_p=1.0)) for _ in range(20))
    assert not any(bg_words.search(phrasings.affirmative_caption(scene, rng, bg_p=0.0)) for _ in range(20))


def test_finetune_negcap_and_mcq(shards):
    used = set()
    for _, _, rec in shards["finetune"]:
        scene = rec[schema.SCENE]
        present = present_of(scene)
        check_affirmative(rec[schema.CAPTION], present)
        assert rec[schema.OBJECTS]["positive"] == [o["shape"] for o in scene["objects"]]
        assert not set(rec[schema.OBJECTS]["negative"]) & present
        assert len(rec[schema.NEGCAP]) == 3
        negated = []
        for cap in rec[schema.NEGCAP]:
            check_negated(cap, phrasings.NEGATE_TRAIN, present)
            ps = parse(cap, phrasings.NEGATE_TRAIN)
            used.update(t for t, _, _ in ps)
            negated.append(next(iter(ps[0][2])))
        assert len(set(negated)) == 3
        m = rec[schema.MCQ]
        assert len(m["options"]) == schema.N_OPTIONS and m["answer_template"] in schema.MCQ_TEMPLATES
        check_mcq(m["options"], m["answer"], m["answer_template"], m["option_templates"], present)
    assert len(used) >= 8


def test_mcq_answer_balance(shards):
    kinds = [rec[schema.MCQ]["answer_template"] for _, _, rec in shards["finetune"]]
    answers = [rec[schema.MCQ]["answer"] for _, _, rec in shards["finetune"]]
    for k in schema.MCQ_TEMPLATES:
        assert kinds.count(k) > len(kinds) / 6
    for a in range(4):
        assert answers.count(a) > len(answers) / 8


@pytest.mark.parametrize("split", ["val", "test"])
def test_probe_csvs(world, split):
    out, meta = world
    d = out / split
    ann = load_annotations(d)
    for row in read_csv(d / "mcq.csv"):
        assert (d / row["image_path"]).exists()
        present = present_of(ann[row["image_path"]]["scene"])
        options = [row[f"caption_{i}"] for i in range(4)]
        kinds = [mcq_truth(o, present)[0] for o in options]
        check_mcq(options, int(row["correct_answer"]), row["correct_answer_template"], kinds, present)
    for row in read_csv(d / "retrieval.csv"):
        present = present_of(ann[row["filepath"]]["scene"])
        caps = json.loads(row["captions"])
        assert caps
        for cap in caps:
            check_affirmative(cap, present)
            assert parse(cap, phrasings.AFFIRM_HELD_OUT)
    for row in read_csv(d / "retrieval_neg.csv"):
        present = present_of(ann[row["filepath"]]["scene"])
        caps = json.loads(row["captions"])
        assert caps
        for cap in caps:
            check_negated(cap, phrasings.NEGATE_HELD_OUT, present)
    rows = read_csv(d / "zeroshot.csv")
    for row in rows:
        scene = ann[row["filepath"]]["scene"]
        assert (d / row["filepath"]).exists() and len(scene["objects"]) == 1
        assert meta["classes"][int(row["label"])] == scene["objects"][0]["shape"]
    assert {int(r["label"]) for r in rows} == set(range(len(SHAPES)))
    assert not {r["filepath"] for r in rows} & {r["image_path"] for r in read_csv(d / "mcq.csv")}


@pytest.mark.parametrize("split", ["val", "test"])
def test_relcomp_pairs_each_caption_true_of_its_own_image_only(world, split):
    out, _ = world
    d = out / split
    ann = load_annotations(d)
    rows = read_csv(d / "relcomp.csv")
    assert len(rows) == sum(1 for a in ann.values() if a.get("relcomp"))
    assert {r["kind"] for r in rows} == {"relation", "attribute"}
    for row in rows:
        a = ann[row["image_0"]]
        pair, objs_0, objs_1 = a["relcomp"], a["scene"]["objects"], a["relcomp"]["objects_1"]
        i, pred, j = pair["triple"]
        assert pair["image_1"] == row["image_1"] and (d / row["image_1"]).exists()
        assert (d / row["image_0"]).read_bytes() != (d / row["image_1"]).read_bytes()
        assert parse(row["caption_0"], phrasings.RELCOMP_HELD_OUT)        # a phrasing no training text uses
        rel_0, rel_1 = world_gen.relations(objs_0), world_gen.relations(objs_1)

        def holds(caption, objs, rel):   # is some (subject, predicate, object) of this scene the caption?
            return any(caption == phrasings.relcomp_caption(objs[x], p, objs[y], pair["template"]) for x, p, y in rel)

        assert holds(row["caption_0"], objs_0, rel_0) and not holds(row["caption_0"], objs_1, rel_1)
        assert holds(row["caption_1"], objs_1, rel_1) and not holds(row["caption_1"], objs_0, rel_0)
        moved = [k for k in range(len(objs_0)) if objs_0[k] != objs_1[k]]
        assert moved == sorted([i, j])
        if row["kind"] == "attribute":
            assert [o["color"] for o in objs_1] != [o["color"] for o in objs_0]
            assert all(o0["bbox"] == o1["bbox"] for o0, o1 in zip(objs_0, objs_1))
        else:
            assert all(o1["bbox"][0] % world_gen.GRID == 1 and o1["bbox"][1] % world_gen.GRID == 1 for o1 in objs_1)


def test_relcomp_training_examples(world, shards):
    """The caption is true of the image; every selective negative, and the caption on the hard negative
    image, is false; the negative image is in the shard exactly when the record names one."""
    out, _ = world
    recs = shards["relcomp"]
    assert len(recs) == world_gen.SIZES["tiny"]["relcomp"]
    negative_pngs = {}
    for tar_path in sorted((out / "relcomp").glob("shard-*.tar")):
        with tarfile.open(tar_path) as tf:
            for m in tf.getmembers():
                key, ext = m.name.split(".", 1)
                if ext == schema.NEGATIVE_IMAGE_KEYS[0]:
                    negative_pngs[key] = tf.extractfile(m).read()
    kinds_of_image = []
    for key, png, rec in recs:
        r, objs = rec[schema.RELCOMP], rec[schema.SCENE]["objects"]
        assert len(objs) >= 2 and rec[schema.SCENE]["relations"]
        assert relcomp_true(r["caption"], objs, r["template"]), r["caption"]
        assert [n["kind"] for n in r["negatives"]] == list(schema.RELCOMP_NEGATIVE_KINDS)
        for n in r["negatives"]:
            assert not relcomp_true(n["text"], objs, r["template"]), (r["caption"], n)
        kinds_of_image.append(r["negative_image"])
        assert (key in negative_pngs) == (r["negative_image"] is not None)
        if r["negative_image"] is not None:
            assert not relcomp_true(r["caption"], r["negative_objects"], r["template"])
            # its own caption is true of it and false of the image; its own negatives are false of it
            assert relcomp_true(r["negative_image_caption"], r["negative_objects"], r["template"])
            assert not relcomp_true(r["negative_image_caption"], objs, r["template"])
            assert r["negative_image_caption"] in [n["text"] for n in r["negatives"]]
            assert r["negative_image_negatives"] and r["caption"] not in r["negative_image_negatives"]
            for n in r["negative_image_negatives"]:
                assert not relcomp_true(n, r["negative_objects"], r["template"]), (r["negative_image_caption"], n)
            neg = Image.open(io.BytesIO(negative_pngs[key]))
            assert neg.size == Image.open(io.BytesIO(png)).size and negative_pngs[key] != png
        else:
            assert "negative_image_caption" not in r
    # most examples get a hard negative image, of both kinds
    assert sum(k is not None for k in kinds_of_image) >= 0.7 * len(recs)
    assert {"relation", "attribute"} <= set(kinds_of_image)


def test_held_out_combos(world, shards):
    out, meta = world
    held = {tuple(c) for c in meta["held_out_combos"]}
    assert 0.05 <= len(held) / (len(SHAPES) * len(world_gen.COLORS)) <= 0.2
    combo_re = re.compile(r"\b(" + "|".join(world_gen.COLORS) + r") (" + "|".join(SHAPES) + r")\b")
    for split in world_gen.TRAIN_SPLITS:
        for _, _, rec in shards[split]:
            objects = list(rec[schema.SCENE]["objects"])
            objects += (rec.get(schema.RELCOMP) or {}).get("negative_objects") or []
            for o in objects:
                assert (o["color"], o["shape"]) not in held
            for text in training_texts(rec):
                assert not held & set(combo_re.findall(text)), text
    seen = {(o["color"], o["shape"]) for a in load_annotations(out / "test").values()
            for o in a["scene"]["objects"]}
    assert len(held & seen) >= len(held) // 2


def test_held_out_negations_use_only_negation_words_seen_in_training():
    """A held-out phrasing recombines negation words the training text uses: a word the tiny text tower
    never read carries no meaning for it (world-7's "nowhere" / "lacks" made the probe a vocabulary test)."""
    def cues(templates):
        return {m.group(0).lower() for t in templates for m in _NEG_RE.finditer(t)}
    train = list(phrasings.NEGATE_TRAIN) + [t for ts in phrasings.MCQ_TRAIN.values() for t in ts]
    held = list(phrasings.NEGATE_HELD_OUT) + [t for ts in phrasings.MCQ_HELD_OUT.values() for t in ts]
    assert cues(train) == set(phrasings.SEEN_NEGATION_CUES)
    assert cues(held) and cues(held) <= set(phrasings.SEEN_NEGATION_CUES), cues(held) - set(phrasings.SEEN_NEGATION_CUES)
    for t in phrasings.NEGATE_HELD_OUT + phrasings.MCQ_HELD_OUT["negative"] + phrasings.MCQ_HELD_OUT["hybrid"]:
        assert cues([t]), f"held-out negation without a negation word: {t!r}"


def test_held_out_phrasings(world, shards):
    out, meta = world
    markers = [m for ms in phrasings.HELD_OUT_MARKERS.values() for m in ms]
    held = meta["held_out_templates"]
    assert len(held["affirm"]) >= 2 and len(held["negate"]) >= 2
    assert all(len(held["mcq"][k]) >= 1 for k in schema.MCQ_TEMPLATES)
    # markers really identify held-out phrasings: no training phrasing contains one
    train_templates = list(phrasings.AFFIRM_TRAIN) + list(phrasings.NEGATE_TRAIN) + [t for ts in phrasings.MCQ_TRAIN.values() for t in ts] \
        + list(phrasings.RELCOMP_TRAIN)
    assert not [m for m in markers if any(m.lower() in t.lower() for t in train_templates)]
    for split in world_gen.TRAIN_SPLITS:
        for _, _, rec in shards[split]:
            for text in training_texts(rec):
                low = text.lower()
                assert not [m for m in markers if m.lower() in low], text
                for t in phrasings.AFFIRM_HELD_OUT + phrasings.NEGATE_HELD_OUT:
                    assert not compile_template(t).match(text[0].lower() + text[1:]), text
    test_text = "\n".join((out / "test" / n).read_text() for n in ("mcq.csv", "retrieval.csv",
                                                                     "retrieval_neg.csv", "relcomp.csv"))
    for m in markers:
        assert m in test_text or m.capitalize() in test_text, m


def test_determinism_across_workers_and_parts(world, world_w1, shards):
    (a, meta_a), (b, meta_b, first, drawn) = world, world_w1
    assert drawn == ["finetune", "test", "val", "world.json"] and list(first["shards"]) == ["finetune"]
    with pytest.raises(ValueError, match="unknown world split"):
        world_gen.build_world(b, seed=0, size="tiny", splits=("finetun",))
    def strip(m):       # the session's world may hold method splits other tests drew into it (METHOD_SPLITS)
        out = {k: v for k, v in m.items() if k not in ("build_seconds", "images_per_second")}
        for k in ("shards", "counts"):
            out[k] = {s: v for s, v in m[k].items() if s not in world_gen.METHOD_SPLITS}
        return out
    assert strip(meta_a) == strip(meta_b)
    for split in world_gen.TRAIN_SPLITS:
        sb = read_shards(b / split)
        assert [(k, j) for k, _, j in shards[split]] == [(k, j) for k, _, j in sb]
        assert [p for _, p, _ in shards[split][:20]] == [p for _, p, _ in sb[:20]]
        for name in meta_a["shards"][split]:
            assert (a / split / name).read_bytes() == (b / split / name).read_bytes()
    for split in ("val", "test"):
        for name in ("mcq.csv", "retrieval.csv", "retrieval_neg.csv", "zeroshot.csv", "annotations.jsonl"):
            assert (a / split / name).read_bytes() == (b / split / name).read_bytes()
        for name in ("000000.png", "000007.png", "zs_000003.png"):
            assert (a / split / "images" / name).read_bytes() == (b / split / "images" / name).read_bytes()


def test_different_seed_differs(world, world_seed1, shards):
    (a, meta_a), (c, meta_c) = world, world_seed1
    assert meta_a["held_out_combos"] != meta_c["held_out_combos"]
    sc = read_shards(c / "pretrain")
    assert [j for _, _, j in shards["pretrain"][:20]] != [j for _, _, j in sc[:20]]
    assert shards["pretrain"][0][1] != sc[0][1]
    assert (a / "test" / "mcq.csv").read_bytes() != (c / "test" / "mcq.csv").read_bytes()


def test_context_priors_shape_frequencies(shards):
    counts = {bg: {} for bg in world_gen.BACKGROUNDS}
    for _, _, rec in shards["pretrain"]:
        sc = rec[schema.SCENE]
        for o in sc["objects"]:
            counts[sc["background"]][o["shape"]] = counts[sc["background"]].get(o["shape"], 0) + 1
    night = counts["night"]
    assert night.get("star", 0) + night.get("crescent", 0) > night.get("square", 0) + night.get("pentagon", 0)


def test_colors_visible_on_backgrounds():
    from negft.world import render
    assert render.color_contrast_ok(70.0)


def test_shards_read_with_webdataset(world):
    wds = pytest.importorskip("webdataset")
    out, meta = world
    urls = [str(out / "finetune" / n) for n in meta["shards"]["finetune"]]
    n = 0
    for s in wds.WebDataset(urls, shardshuffle=False).decode("pil"):
        assert s["png"].size == (world_gen.IMAGE_SIZE, world_gen.IMAGE_SIZE)
        assert {schema.CAPTION, schema.NEGCAP, schema.MCQ, schema.OBJECTS, schema.SCENE} <= set(s["json"])
        n += 1
    assert n == world_gen.SIZES["tiny"]["finetune"]
