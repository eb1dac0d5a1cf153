"""ARO read as released (VG-Relation, VG-Attribution, COCO-Order, Flickr30k-Order): fixtures in ARO's layout,
stand-in models with known scores, the tie-aware and official rules, ARO's macro filters, skipped files and rows,
and the world's ARO files."""
import json
import re
from pathlib import Path

import pytest
import torch
from PIL import Image

from negft.probes import aro
from negft.probes.base import Dataset, EvalContext

GOOD, BAD, TIE = [1.0, 0.0], [0.0, 1.0], [0.6, 0.8]     # against the image [1, 0]: 1, 0, and one shared score


def _ctx(images: dict, texts: dict) -> EvalContext:
    """A context whose features are known: ``images`` by path or crop key, ``texts`` by text."""
    ctx = EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=50)
    norm = lambda v: torch.nn.functional.normalize(torch.tensor(v, dtype=torch.float), dim=0)   # noqa: E731
    ctx._images.update({k: norm(v) for k, v in images.items()})
    ctx._texts.update({k: norm(v) for k, v in texts.items()})
    return ctx


def _vg_fixture(root: Path, kind: str, rows: list[dict]) -> list[dict]:
    """ARO's layout: <root>/visual_genome_<kind>.json with image_path relative to <root>/images."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    out = []
    for n, r in enumerate(rows):
        name = f"{n:03d}.png"
        Image.new("RGB", (20, 20), (n % 256, 0, 0)).save(root / "images" / name)
        out.append({"image_path": name, "bbox_x": 2, "bbox_y": 3, "bbox_w": 10, "bbox_h": 12, **r})
    (root / aro.VG_FILES[kind]).write_text(json.dumps(out))
    return out


def _crop(root: Path, row: dict) -> str:
    return aro.crop_key(str(root / "images" / row["image_path"]), (2, 3, 12, 15))


def _relation_rows(spec):
    """spec: [(relation, 'good' | 'bad' | 'tie')] -> rows and the text features that give that outcome."""
    rows, texts = [], {}
    for n, (rel, how) in enumerate(spec):
        t, f = f"the cat {n} is {rel} the mat", f"the mat {n} is {rel} the cat"
        rows.append({"relation_name": rel, "true_caption": t, "false_caption": f})
        texts[t], texts[f] = {"good": (GOOD, BAD), "bad": (BAD, GOOD), "tie": (TIE, TIE)}[how]
    return rows, texts


def test_vg_relation_tie_aware_micro_and_official_macro_without_the_symmetric_relations(tmp_path):
    rows, texts = _relation_rows([("on", "good"), ("on", "bad"), ("by", "good"), ("above", "tie")])
    written = _vg_fixture(tmp_path, "vg_relation", rows)
    ctx = _ctx({_crop(tmp_path, r): [1.0, 0.0] for r in written}, texts)
    res = aro.run(ctx, Dataset("vg_relation", tmp_path, "aro_vg_relation"))
    m = res.metrics
    assert m["aro_vg_relation/vg_relation/acc"] == pytest.approx((1 + 0 + 1 + 0.5) / 4)
    # "by" is in ARO's symmetric list: the macro averages "on" (1/2) and "above" (tie: 1/2, ARO's argmax: 0)
    assert m["aro_vg_relation/vg_relation/acc_macro"] == pytest.approx((0.5 + 0.5) / 2)
    assert m["aro_vg_relation/vg_relation/acc_official"] == pytest.approx((0.5 + 0.0) / 2)
    assert "aro_vg_relation/vg_relation/skipped_rows" not in m          # a count, reported when rows were skipped
    assert [r["group"] for r in res.records["aro_vg_relation/vg_relation"]] == ["on", "on", "by", "above"]


def _vector(width: int, seed: int) -> list[float]:
    return torch.randn(width, generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("width", [2, 512])
def test_vg_relation_all_ties_is_chance_tie_aware_and_zero_officially(tmp_path, width):
    """ARO's argmax over [false_caption, true_caption] gives every tie to the false caption; at a model's width
    (512) equal captions still tie exactly (a float32 BLAS product would split them by ~1e-8)."""
    rows, texts = _relation_rows([("on", "tie"), ("under", "tie"), ("holding", "tie")])
    texts = {t: _vector(width, n // 2) for n, t in enumerate(texts)} if width > 2 else texts
    written = _vg_fixture(tmp_path, "vg_relation", rows)
    m = aro.run(_ctx({_crop(tmp_path, r): _vector(width, 99) if width > 2 else [1.0, 0.0] for r in written}, texts),
                Dataset("vg_relation", tmp_path, "aro_vg_relation")).metrics
    assert m["aro_vg_relation/vg_relation/acc"] == pytest.approx(0.5)
    assert m["aro_vg_relation/vg_relation/acc_macro"] == pytest.approx(0.5)
    assert m["aro_vg_relation/vg_relation/acc_official"] == 0.0


def test_vg_attribution_official_macro_keeps_pairs_of_25_rows_or_more(tmp_path):
    rows, texts = [], {}
    for n in range(28):
        pair = ("red", "blue") if n < 25 else ("green", "white")     # 25 right answers, then 3 wrong ones
        t, f = f"the {pair[0]} cat {n} and the {pair[1]} mat", f"the {pair[1]} cat {n} and the {pair[0]} mat"
        rows.append({"attributes": list(pair), "obj1_name": "cat", "obj2_name": "mat", "true_caption": t,
                     "false_caption": f})
        texts[t], texts[f] = (GOOD, BAD) if n < 25 else (BAD, GOOD)
    written = _vg_fixture(tmp_path, "vg_attribution", rows)
    m = aro.run(_ctx({_crop(tmp_path, r): [1.0, 0.0] for r in written}, texts),
                Dataset("vg_attribution", tmp_path, "aro_vg_attribution")).metrics
    assert m["aro_vg_attribution/vg_attribution/acc"] == pytest.approx(25 / 28)
    assert m["aro_vg_attribution/vg_attribution/acc_macro"] == pytest.approx(1.0)      # green_white (3 rows) is dropped
    assert m["aro_vg_attribution/vg_attribution/acc_official"] == pytest.approx(1.0)
    # fewer than 25 rows in every pair: ARO's macro has nothing to average, said so
    rows2 = rows[25:]
    sub = tmp_path / "small"
    written2 = _vg_fixture(sub, "vg_attribution", rows2)
    res = aro.run(_ctx({_crop(sub, r): [1.0, 0.0] for r in written2}, texts), Dataset("vg_attribution", sub))
    assert res.metrics["aro_vg_attribution/vg_attribution/acc"] == 0.0
    assert "25 rows" in res.skipped["aro_vg_attribution/vg_attribution/acc_official"]


def test_missing_files_are_skipped_with_their_path_and_bad_rows_are_counted(tmp_path):
    res = aro.run(_ctx({}, {}), Dataset("vg_relation", tmp_path, "aro_vg_relation"))
    why = res.skipped["aro_vg_relation/vg_relation"]
    assert str(tmp_path / "visual_genome_relation.json") in why and "aro_vg_relation.yaml" in why
    assert not res.metrics
    for name, task in (("coco_order", "coco_karpathy_test.json"), ("flickr30k_order", "flickr30k_test.json")):
        res = aro.run(_ctx({}, {}), Dataset(name, tmp_path, f"aro_{name}"))
        assert str(tmp_path / task) in res.skipped[f"aro_{name}/{name}"]
    # malformed rows are counted by reason; the good row is scored
    rows, texts = _relation_rows([("on", "good")])
    written = _vg_fixture(tmp_path, "vg_relation", rows)
    bad = [{**written[0], "bbox_w": 0}, {**written[0], "bbox_x": "3"}, {**written[0], "image_path": "nope.png"},
           {k: v for k, v in written[0].items() if k != "relation_name"}, ["not", "a", "row"]]
    (tmp_path / "visual_genome_relation.json").write_text(json.dumps(written + bad))
    res = aro.run(_ctx({_crop(tmp_path, written[0]): [1.0, 0.0]}, texts), Dataset("vg_relation", tmp_path))
    assert res.metrics["aro_vg_relation/vg_relation/acc"] == 1.0 and res.metrics["aro_vg_relation/vg_relation/skipped_rows"] == 5
    note = res.skipped["aro_vg_relation/vg_relation/rows"]
    assert "5 of 6 rows" in note and "image file not found: 1" in note and "bbox has no area: 1" in note
    # an unreadable file is skipped with the reason, the other tasks still run
    (tmp_path / "visual_genome_attribution.json").write_text("{not json")
    res = aro.run(_ctx({_crop(tmp_path, written[0]): [1.0, 0.0]}, texts), Dataset("world", tmp_path))
    assert "unreadable JSON" in res.skipped["aro_vg_attribution/world"]
    assert res.metrics["aro_vg_relation/world/acc"] == 1.0


def test_vg_rows_are_scored_on_the_image_cropped_to_the_box(tmp_path, bundle):
    """A real context encodes the crop ``image.crop((x, y, x + w, y + h))``, not the whole image."""
    rows, _ = _relation_rows([("on", "good")])
    written = _vg_fixture(tmp_path, "vg_relation", rows)
    img = Image.new("RGB", (20, 20), (0, 0, 255))
    img.paste((255, 255, 0), (2, 3, 12, 15))
    img.save(tmp_path / "images" / written[0]["image_path"])
    ctx = EvalContext(bundle.model.eval(), bundle.preprocess_val, bundle.tokenizer, "cpu", n_boot=20)
    path = str(tmp_path / "images" / written[0]["image_path"])
    got = aro.encode_crops(ctx, [(path, (2, 3, 12, 15))])
    with torch.no_grad():
        crop = bundle.preprocess_val(Image.new("RGB", (10, 12), (255, 255, 0)))[None]
        want = torch.nn.functional.normalize(bundle.model.encode_image(crop).float(), dim=-1)
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, ctx.encode_images([path]), atol=1e-3)
    assert aro.crop_key(path, (2, 3, 12, 15)) in ctx._images


def _karpathy(root: Path, name: str, captions: list[list[str]], folder: str = "val2014") -> list[str]:
    (root / folder).mkdir(parents=True, exist_ok=True)
    entries = []
    for n, caps in enumerate(captions):
        Image.new("RGB", (8, 8)).save(root / folder / f"{n}.jpg")
        entries.append({"image": f"{folder}/{n}.jpg", "caption": caps})
    (root / name).write_text(json.dumps(entries))
    return [str(root / e["image"]) for e in entries]


def fake_tagger(text):
    """Penn tags for a small vocabulary (nouns, adjectives, verbs); the rest DT / IN."""
    lex = {"dog": "NN", "cat": "NN", "park": "NN", "ball": "NN", "brown": "JJ", "small": "JJ", "red": "JJ",
           "runs": "VBZ", "chases": "VBZ", "is": "VBZ", "green": "JJ"}
    return [(t, lex.get(t.lower(), "DT")) for t in aro.regex_tokenize(text)]


CAPTIONS = [["A brown dog chases a small cat in the park.", "A red ball."],
            ["The small dog runs to the red ball near a brown cat"]]
LONG = [["a brown dog chases a small cat in the green park near the red ball"],       # options all differ
        ["the small cat runs past a brown dog and a red ball in the park"],
        ["a red ball is in the green park and a small dog runs to the brown cat"]]


def test_order_perturbations_as_aro_builds_them(tmp_path, monkeypatch):
    monkeypatch.setattr(aro, "_TAGGER", [fake_tagger, None])
    _karpathy(tmp_path, "coco_karpathy_test.json", CAPTIONS)
    cases, skipped, why = aro.read_order(Dataset("coco_order", tmp_path), "coco_order")
    assert why is None and not skipped and len(cases) == 3
    assert [c["caption_index"] for c in cases] == [0, 1, 0]
    for c in cases:
        o = c["options"]
        assert set(o) == set(aro.ORDER_OPTIONS)
        assert all(sorted(v.split()) == sorted(o["caption"].split()) for v in o.values()), o   # the same words
    o = cases[0]["options"]
    assert o["caption"] == aro.pre_caption(CAPTIONS[0][0]) == "a brown dog chases a small cat in the park"
    tagged = fake_tagger(CAPTIONS[0][0])                 # the shuffles on the tagged tokens (before pre_caption)
    rng = aro.caption_rng(0, 0, 1)
    nouns_adj = aro.shuffle_classes(tagged, (aro.NOUN, aro.ADJ), rng).split()
    others = aro.shuffle_others(tagged, aro.NOUN | aro.ADJ, aro.caption_rng(0, 0, 2)).split()
    assert o["shuffle_nouns_and_adj"] == aro.pre_caption(" ".join(nouns_adj))
    assert o["shuffle_allbut_nouns_and_adj"] == aro.pre_caption(" ".join(others))
    for (w0, t0), w1, w2 in zip(tagged, nouns_adj, others):
        for cls in (aro.NOUN, aro.ADJ):            # nouns trade places with nouns, adjectives with adjectives
            if t0 in cls:
                assert fake_tagger(w1)[0][1] in cls and w2 == w0
        if t0 not in aro.NOUN | aro.ADJ:           # every other token stays put, or moves among the others
            assert w1 == w0 and fake_tagger(w2)[0][1] not in aro.NOUN | aro.ADJ
    tokens = aro.word_tokenize(CAPTIONS[0][0])
    grams = [sorted(aro.pre_caption(" ".join(tokens[i:i + 3])).split()) for i in range(0, len(tokens), 3)]
    within = o["shuffle_within_trigrams"].split()
    assert sorted(within[:3]) == grams[0] and sorted(within[3:6]) == grams[1]
    # seeded: the same file gives the same options
    again = aro._order_cases(tmp_path / "coco_karpathy_test.json")[0][0]
    assert [c["options"] for c in again] == [c["options"] for c in cases]


@pytest.mark.parametrize("width", [2, 768])
def test_order_official_gives_ties_to_the_caption_and_tie_aware_gives_chance(tmp_path, monkeypatch, width):
    monkeypatch.setattr(aro, "_TAGGER", [fake_tagger, None])
    images = _karpathy(tmp_path, "flickr30k_test.json", CAPTIONS, folder="flickr30k-images")
    cases = aro.read_order(Dataset("flickr30k_order", tmp_path), "flickr30k_order")[0]
    # all tied: ARO's argmax == 0 counts every caption right; tie-aware: 1/5 (1/3 over the trigram options)
    tied, image = (_vector(width, 1), _vector(width, 2)) if width > 2 else ([1.0, 0.0], [1.0, 0.0])
    texts = {t: tied for c in cases for t in c["options"].values()}
    m = aro.run(_ctx({p: image for p in images}, texts), Dataset("flickr30k_order", tmp_path)).metrics
    assert m["aro_flickr30k_order/flickr30k_order/acc"] == pytest.approx(1 / 5)
    assert m["aro_flickr30k_order/flickr30k_order/acc_official"] == 1.0
    assert m["aro_flickr30k_order/flickr30k_order/acc_trigrams"] == pytest.approx(1 / 3)
    assert m["aro_flickr30k_order/flickr30k_order/acc_trigrams_official"] == 1.0
    # known scores: the caption wins, loses to a trigram shuffle, ties with it
    sub = tmp_path / "known"
    images = _karpathy(sub, "flickr30k_test.json", LONG, folder="flickr30k-images")
    cases = aro.read_order(Dataset("flickr30k_order", sub), "flickr30k_order")[0]
    texts = {}
    for c, (cap, shuffle) in zip(cases, ((GOOD, BAD), (BAD, GOOD), (TIE, TIE))):
        assert len(set(c["options"].values())) == 5, c["options"]
        texts.update({t: BAD for t in c["options"].values()})
        texts[c["options"]["caption"]], texts[c["options"]["shuffle_trigrams"]] = cap, shuffle
    m = aro.run(_ctx({p: [1.0, 0.0] for p in images}, texts), Dataset("flickr30k_order", sub)).metrics
    assert m["aro_flickr30k_order/flickr30k_order/acc"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert m["aro_flickr30k_order/flickr30k_order/acc_official"] == pytest.approx((1 + 0 + 1) / 3)


def test_order_without_a_tagger_scores_the_trigram_options_and_says_why(tmp_path, monkeypatch):
    monkeypatch.setattr(aro, "_TAGGER", [None, "they need spaCy's en_core_web_sm part-of-speech tagger"])
    images = _karpathy(tmp_path, "coco_karpathy_test.json", LONG)
    cases = aro.read_order(Dataset("coco_order", tmp_path), "coco_order")[0]
    assert set(cases[0]["options"]) == set(aro.TRIGRAM_OPTIONS)
    texts = {t: GOOD if name == "caption" else BAD for c in cases for name, t in c["options"].items()}
    res = aro.run(_ctx({p: [1.0, 0.0] for p in images}, texts), Dataset("coco_order", tmp_path, "aro_coco_order"))
    assert res.metrics["aro_coco_order/coco_order/acc_trigrams"] == 1.0 and "aro_coco_order/coco_order/acc" not in res.metrics
    assert "en_core_web_sm" in res.skipped["aro_coco_order/coco_order/acc"]


def test_a_tagger_that_cannot_load_names_the_command_that_installs_it(monkeypatch):
    """spaCy or its model missing: the reason names the package extra and spaCy's download, as negft data negatives
    does (negft.text.SPACY_INSTALL)."""
    import builtins
    real_import = builtins.__import__

    def no_spacy(name, *args, **kwargs):
        if name == "spacy":
            raise ImportError("No module named 'spacy'")
        return real_import(name, *args, **kwargs)
    monkeypatch.setattr(aro, "_TAGGER", [])
    monkeypatch.setattr(builtins, "__import__", no_spacy)
    tag, why = aro.pos_tagger()
    assert tag is None and "ImportError" in why
    assert "pip install 'negft[negatives]' && python -m spacy download en_core_web_sm" in why


def test_pre_caption_and_the_tokenizer():
    assert aro.pre_caption('A Dog (small) "runs"!  Fast.') == "a dog small runs fast"
    assert aro.pre_caption(" ".join(["w"] * 40)) == " ".join(["w"] * 30)
    assert aro.regex_tokenize("The dog's ball, don't!") == ["The", "dog", "'s", "ball", ",", "do", "n't", "!"]
    assert aro.regex_tokenize("a hot-dog stand.") == ["a", "hot-dog", "stand", "."]


class _BagOfWords:
    """Random image features (one per key) and an order-blind text tower: swapped captions tie exactly."""
    n_boot = 30

    def __init__(self):
        self.gen, self.vocab, self.images = torch.Generator().manual_seed(0), {}, {}

    def encode_images(self, keys):
        for k in keys:
            self.images.setdefault(k, torch.nn.functional.normalize(torch.randn(32, generator=self.gen), dim=0))
        return torch.stack([self.images[k] for k in keys])

    def encode_texts(self, texts):
        out = []
        for t in texts:
            v = torch.zeros(32, dtype=torch.float64)
            for w in sorted(re.findall(r"[a-z]+", t.lower())):     # punctuation ignored
                if w not in self.vocab:
                    self.vocab[w] = torch.randn(32, generator=self.gen, dtype=torch.float64)
                v += self.vocab[w]
            out.append(torch.nn.functional.normalize(v, dim=0).float())
        return torch.stack(out)


def test_the_worlds_aro_files_follow_its_annotations(cache):
    split = cache / "world-s0-tiny" / "val"
    ann = {a["image_path"]: a["scene"] for a in map(json.loads, (split / "annotations.jsonl").open())}
    relation = json.loads((split / "visual_genome_relation.json").read_text())
    attribution = json.loads((split / "visual_genome_attribution.json").read_text())
    assert len(relation) > 30 and len(attribution) > 30
    words = {"to the left of": "left of", "to the right of": "right of", "above": "above", "below": "below"}
    for r in relation:
        assert (split / "images" / r["image_path"]).is_file()
        scene = ann["images/" + r["image_path"]]
        objs = {o["shape"]: k for k, o in enumerate(scene["objects"])}
        subj, obj = r["true_caption"].removeprefix("the ").split(f" is {r['relation_name']} the ")
        assert [objs[subj], words[r["relation_name"]], objs[obj]] in scene["relations"]
        assert r["false_caption"] == f"the {obj} is {r['relation_name']} the {subj}"
        for k in (objs[subj], objs[obj]):
            x0, y0, x1, y1 = scene["objects"][k]["bbox"]
            assert r["bbox_x"] <= x0 and r["bbox_y"] <= y0
            assert x1 <= r["bbox_x"] + r["bbox_w"] and y1 <= r["bbox_y"] + r["bbox_h"]
    for r in attribution:
        scene = ann["images/" + r["image_path"]]
        colour = {o["shape"]: o["color"] for o in scene["objects"]}
        a, b = r["attributes"]
        assert a != b and colour[r["obj1_name"]] == a and colour[r["obj2_name"]] == b
        assert r["true_caption"] == f"the {a} {r['obj1_name']} and the {b} {r['obj2_name']}"
        assert r["false_caption"] == f"the {b} {r['obj1_name']} and the {a} {r['obj2_name']}"
    retrieval = {row.split(",")[0] for row in (split / "retrieval.csv").read_text().splitlines()[1:]}
    coco = json.loads((split / "coco_karpathy_test.json").read_text())
    flickr = json.loads((split / "flickr30k_test.json").read_text())
    images = [e["image"] for e in coco + flickr]
    assert len(images) == len(set(images)) and set(images) == retrieval
    assert all(len(e["caption"]) == 3 and (split / e["image"]).is_file() for e in coco + flickr)


def test_aro_on_the_world_an_order_blind_text_tower_scores_chance(cache):
    """Swapped objects, swapped attributes and shuffled trigrams keep the bag of words: every pair ties, so the
    tie-aware scores are chance and ARO's official ones are 0 (VG: the false caption first) or 1 (order)."""
    m = aro.run(_BagOfWords(), Dataset("world", cache / "world-s0-tiny" / "val")).metrics
    for task in ("vg_relation", "vg_attribution"):
        assert m[f"aro_{task}/world/acc"] == pytest.approx(0.5)
        assert f"aro_{task}/world/skipped_rows" not in m
    assert m["aro_vg_relation/world/acc_official"] == 0.0
    for task in ("coco_order", "flickr30k_order"):
        assert m[f"aro_{task}/world/acc_trigrams"] == pytest.approx(1 / 3)
        assert m[f"aro_{task}/world/acc_trigrams_official"] == 1.0
