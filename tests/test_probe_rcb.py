"""Probe-R / Probe-C / Probe-B and the VLU (Stroop) probes read as released: fixtures in the release's layouts
(world images saved under the release's file names), stand-in models whose scores are known, official vs
tie-aware rules, the all-ties fixture, bad rows and missing files, the probes on the tiny world, and no probe
reading the world's own annotation or text code."""
import csv
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image

from negft.data import layout_rcb
from negft.data import layout_vlu as LV
from negft.data.schema import list_cell
from negft.probes import probe_b, probe_c, probe_r, vlu
from negft.probes.base import Dataset, EvalContext

REPO = Path(__file__).resolve().parent.parent


class Stub(EvalContext):
    """Known features: images by path, texts by string (unknown texts: ``default``); scale 100 (no model)."""

    def __init__(self, images: dict, texts: dict, default=None, image_default=None):
        super().__init__(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=20)
        self.img, self.txt, self.default, self.image_default = images, texts, default, image_default
        self.seen_images, self.seen_texts = [], []

    def _vec(self, table, key, default):
        v = table.get(key, default)
        if v is None:
            raise KeyError(key)
        return F.normalize(torch.tensor(v, dtype=torch.float32), dim=0)

    def encode_images(self, paths):
        self.seen_images += list(paths)
        return torch.stack([self._vec(self.img, str(p), self.image_default) for p in paths])

    def encode_texts(self, texts):
        self.seen_texts += list(texts)
        return torch.stack([self._vec(self.txt, t, self.default) for t in texts])


def flat(dim=4):
    """Every image and text one vector: all scores tie."""
    v = [1.0] + [0.0] * (dim - 1)
    return Stub({}, {}, default=v, image_default=v)


@pytest.fixture(scope="module")
def world_png(cache):
    return sorted((cache / "world-s0-tiny" / "val" / "images").glob("0000*.png"))


def save_jpg(src: Path, dst: Path) -> str:
    dst.parent.mkdir(parents=True, exist_ok=True)
    Image.open(src).convert("RGB").save(dst, "JPEG")
    return str(dst)


# ------------------------------------------------------------------ Probe-R


def write_probe_r_fixture(root: Path, pngs) -> dict:
    """relation_eval_subject.json / _object.json as released (VG ids as keys, int id lists), 5 groups; images
    saved as <id>.jpg. Returns the image paths by id."""
    folder = root / layout_rcb.VG_IMAGES
    paths = {i: save_jpg(pngs[k], folder / f"{i}.jpg") for k, i in enumerate((2317469, 2370468, 2317470, 11, 12, 13))}

    def group(pos, neg_subject, pred, obj, positives):
        return {"positive_image_ids": positives, "negative_image_ids": [999], "positive_prompt": pos,
                "negative_prompt": neg_subject, "negative_object": "x", "positive_object": obj,
                "negative_predicate_prompt": pred}

    subject = {
        "2317469": group("snow covering ground", "cracker covering ground", "snow flying ground", "snow", [11, 12]),
        "2370468": group("building outside window", "guard outside window", "building eating window", "building", [13]),
        "2317470": group("tie one", "tie two", "tie three", "tie", [404]),          # positives not found
        "5": group("no image", "x", "y", "z", []),                                  # anchor image missing
        "6": {"positive_image_ids": [], "negative_prompt": "x"},                   # prompts missing
    }
    obj = {"2317469": group("snow covering ground", "snow covering cracker", "snow flying ground", "ground", [])}
    for switch, data in (("subject", subject), ("object", obj)):
        (root / layout_rcb.probe_r_file(switch)).parent.mkdir(parents=True, exist_ok=True)
        (root / layout_rcb.probe_r_file(switch)).write_text(json.dumps(data))
    return paths


def test_probe_r_reads_the_release_and_scores_official_and_tie_aware(tmp_path, world_png):
    p = write_probe_r_fixture(tmp_path, world_png)
    e1, e2, e3 = [1, 0, 0], [0, 1, 0], [0, 0, 1]
    images = {p[2317469]: e1, p[2370468]: e1, p[2317470]: e3, p[11]: e3, p[12]: e3, p[13]: e1}
    texts = {"snow covering ground": e1, "cracker covering ground": e2, "snow flying ground": e2,   # right wins
             "building outside window": e2, "guard outside window": e1,                         # subject swap wins
             "building eating window": e2,                                                       # predicate tie
             "tie one": e1, "tie two": e1, "tie three": e1,                                      # anchor e3: ties
             "A photo of snow.": e3, "A photo of building.": e3,    # subject-only: snow wins, building ties
             "snow covering cracker": e2}
    res = probe_r.run(Stub(images, texts), Dataset("fx", tmp_path))
    m = res.metrics
    assert m["probe_r_subject/fx/acc"] == pytest.approx((1 + 0 + 0.5) / 3)
    assert m["probe_r_subject/fx/acc_official"] == pytest.approx(1 / 3)          # a tie is wrong
    assert m["probe_r_subject/fx/confidence"] == pytest.approx((1 + 0 + 0.5) / 3, abs=1e-6)
    assert m["probe_r_predicate/fx/acc"] == pytest.approx((1 + 0.5 + 0.5) / 3)
    assert m["probe_r_predicate/fx/acc_official"] == pytest.approx(1 / 3)
    # subject-only images: the mean logit over group 1's two images (snow wins), group 2's one (a tie)
    assert m["probe_r_subject_only/fx/acc"] == pytest.approx(0.75)
    assert m["probe_r_subject_only/fx/acc_official"] == pytest.approx(0.5)
    assert m["probe_r_subject_only/fx/skipped_rows"] == 1.0
    assert m["probe_r_object/fx/acc"] == 1.0 == m["probe_r_object/fx/acc_official"]
    assert m["probe_r_subject/fx/skipped_rows"] == 2.0
    assert "anchor image not found: 1" in res.skipped["probe_r_subject/fx/rows"]
    assert "'positive_prompt' missing" in res.skipped["probe_r_subject/fx/rows"]
    # the declared texts are the encoded ones
    ctx = Stub(images, texts)
    probe_r.run(ctx, Dataset("fx", tmp_path))
    assert set(probe_r._texts(Dataset("fx", tmp_path))) == set(ctx.seen_texts)


def test_probe_r_missing_and_unreadable_files_are_skipped_with_their_paths(tmp_path):
    res = probe_r.run(flat(), Dataset("fx", tmp_path, "probe_rcb"))
    assert not res.metrics
    for key in ("probe_r_subject", "probe_r_object", "probe_r_predicate", "probe_r_subject_only"):
        assert "relation_eval_" in res.skipped[f"{key}/fx"]
        assert "data_manifests/probe_rcb.yaml" in res.skipped[f"{key}/fx"]
    path = tmp_path / layout_rcb.probe_r_file("subject")
    path.parent.mkdir(parents=True)
    path.write_text("{not json")
    res = probe_r.run(flat(), Dataset("fx", tmp_path))
    assert "unreadable JSON" in res.skipped["probe_r_subject/fx"] and not res.metrics


# ------------------------------------------------------------------ Probe-C


def _caption(s0: float, s1: float) -> list[float]:
    """A unit caption vector with cosines s0, s1 to the image vectors e1, e2."""
    return [s0, s1, float(np.sqrt(1 - s0 ** 2 - s1 ** 2))]


def write_probe_c_fixture(root: Path, pngs) -> dict:
    folder = root / layout_rcb.COCO_IMAGES
    ids = (42, 371046, 74, 240637, 43, 514990)
    paths = {i: save_jpg(pngs[k], folder / layout_rcb.coco_name(i)) for k, i in enumerate(ids)}

    def pair(i1, p1, i2, p2, c1="small", c2="large"):
        return {"img1_prompt": p1, "img1_id": str(i1), "img1_composition": c1, "img1_object": "dog",
                "img2_id": i2, "img2_prompt": p2, "img2_composition": c2, "img2_object": "dog"}

    composition = [pair(42, "A photo of a small dog.", 371046, "A photo of a large dog."),     # right both ways
                   pair(74, "A photo of a white dog.", 240637, "A photo of a black dog."),     # all tie
                   {"img1_prompt": "A photo of a red dog.", "img1_id": "42"},                  # img2 missing
                   pair(42, "x", 77777, "y")]                                                  # image not found
    objects = [pair(43, "A photo of a small boy.", 514990, "A photo of a small cat.", "small", "small")]
    for kind, data in (("composition", composition), ("object", objects)):
        (root / layout_rcb.PROBE_C_FILES[kind]).parent.mkdir(parents=True, exist_ok=True)
        (root / layout_rcb.PROBE_C_FILES[kind]).write_text(json.dumps(data))
    return paths


def test_probe_c_reads_the_release_and_scores_winoground_official_and_tie_aware(tmp_path, world_png):
    p = write_probe_c_fixture(tmp_path, world_png)
    e1, e2 = [1, 0, 0], [0, 1, 0]
    images = {p[42]: e1, p[371046]: e2, p[74]: e1, p[240637]: e1, p[43]: e1, p[514990]: e2}
    texts = {"A photo of a small dog.": e1, "A photo of a large dog.": e2,
             "A photo of a white dog.": e1, "A photo of a black dog.": e1,
             # text right (0.5 > 0.1, 0.9 > 0.8), image wrong (0.5 < 0.8)
             "A photo of a small boy.": _caption(0.5, 0.8), "A photo of a small cat.": _caption(0.1, 0.9)}
    res = probe_c.run(Stub(images, texts), Dataset("fx", tmp_path))
    m = res.metrics
    assert m["probe_c/fx/text_composition"] == pytest.approx((1 + 0.25) / 2)
    assert m["probe_c/fx/image_composition"] == pytest.approx((1 + 0.25) / 2)
    assert m["probe_c/fx/group_composition"] == pytest.approx((1 + 1 / 6) / 2)
    for score in ("text", "image", "group"):
        assert m[f"probe_c/fx/{score}_composition_official"] == pytest.approx(0.5)   # the tie fails
    assert m["probe_c/fx/text_object"] == 1.0 == m["probe_c/fx/text_object_official"]
    assert m["probe_c/fx/image_object"] == 0.0 == m["probe_c/fx/group_object_official"]
    assert m["probe_c/fx/text"] == pytest.approx((1 + 0.25 + 1) / 3)
    assert m["probe_c/fx/text_official"] == pytest.approx(2 / 3)
    assert m["probe_c/fx/confidence_composition"] == pytest.approx((1 + 0.5) / 2, abs=1e-6)
    assert m["probe_c/fx/skipped_rows"] == 2.0
    assert "data_compositional_switch.json: image not found: 1" in res.skipped["probe_c/fx/rows"]
    missing = probe_c.run(flat(), Dataset("fx", tmp_path / "none", "probe_rcb"))
    assert not missing.metrics
    assert "data_compositional_switch.json" in missing.skipped["probe_c/fx/composition"]
    assert "data_object_switch.json" in missing.skipped["probe_c/fx/object"]


# ------------------------------------------------------------------ Probe-B


def write_probe_b_fixture(root: Path, pngs, fills=("black", "gray")) -> dict:
    """MR: image 42 (ant, bee) with fillers black and gray (noise and scene absent); R: image 42's ant with
    the bee as other object, and an 'apple' row the release leaves out. Returns the image paths by role."""
    (root / layout_rcb.CONTEXT_DIR).mkdir(parents=True)
    with open(root / layout_rcb.PROMPT_CLASSES, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["class", "prompt"])
        w.writerows([["ant", "A photo of a ant."], ["bee", "A photo of a bee."], ["cat", "A photo of a cat."],
                     ["apple", "A photo of a apple."]])
    ann = lambda c: [{"segmentation": [[1, 2, 3, 4]], "area": 1.0, "iscrowd": 0, "image_id": 42,
                      "bbox": [0, 0, 1, 1], "category_id": 1, "id": 1}]
    (root / layout_rcb.PROBE_B_MR_FILE).write_text(json.dumps([
        {"annotations": {"ant": ann("ant"), "bee": ann("bee")}, "image": layout_rcb.coco_name(42), "image_id": 42},
        {"annotations": {"ant": ann("ant")}, "image": layout_rcb.coco_name(77), "image_id": 77},       # no image at all
        {"annotations": {}, "image": layout_rcb.coco_name(42), "image_id": 42}]))                      # no label
    (root / layout_rcb.PROBE_B_R_FILE).write_text(json.dumps([
        {"image_id": 42, "object": "ant", "other_objects": ["bee"], "path": layout_rcb.one_object_name("ant", 42)},
        {"image_id": 42, "object": "apple", "other_objects": ["bee"], "path": layout_rcb.one_object_name("apple", 42)}]))
    paths = {"x0": save_jpg(pngs[0], root / layout_rcb.COCO_IMAGES / layout_rcb.coco_name(42))}
    for k, fill in enumerate(fills):
        paths[f"{fill}_patch"] = save_jpg(pngs[1 + k], root / layout_rcb.patch_dir(fill) / layout_rcb.coco_name(42))
        paths[f"{fill}_bg"] = save_jpg(pngs[3 + k], root / layout_rcb.background_removed_dir(fill) / layout_rcb.coco_name(42))
        paths[f"{fill}_one"] = save_jpg(pngs[5 + k], root / layout_rcb.one_object_dir(fill) / layout_rcb.one_object_name("ant", 42))
    return paths


PROMPTS_B = {"A photo of a ant.": [1, 0, 0, 0], "A photo of a bee.": [0, 1, 0, 0], "A photo of a cat.": [0, 0, 1, 0],
             "A photo of a apple.": [0, 0, 0, 1]}


def test_probe_b_reads_the_release_and_scores_ap_gamma_confidence(tmp_path, world_png):
    p = write_probe_b_fixture(tmp_path, world_png)
    feats = {p["x0"]: [1, 1, 0, 0],
             p["black_patch"]: [1, 1, 0, 0], p["black_bg"]: [1, 0, 0.9, 0],    # ant, cat, then bee = apple
             p["gray_patch"]: [1, 1, 0, 0], p["gray_bg"]: [1, 1, 1, 1],        # all equal: AP 2/3, official 7/12
             p["black_one"]: [1, 0, 0, 0], p["gray_one"]: [0, 0, 1, 0]}        # ant first / cat first
    res = probe_b.run(Stub(feats, PROMPTS_B), Dataset("fx", tmp_path, "probe_rcb"))
    m = res.metrics
    mr = "probe_b_mr/fx"
    assert m[f"{mr}/map"] == 1.0 and m[f"{mr}/map_official"] == pytest.approx(1.0)   # x0: ant = bee on top
    # black: ant first, bee tied with apple at 3-4 (negft: precision 2/4 there; the release ranks apple, then bee)
    assert m[f"{mr}/gamma_black"] == pytest.approx((1 + 2 / 4) / 2)
    assert m[f"{mr}/gamma_black_official"] == pytest.approx((1 + 2 / 4) / 2)
    assert m[f"{mr}/gamma_gray"] == pytest.approx(2 / 4)              # all four tie: share of labels
    # the release's order for four equal scores is apple, cat, bee, ant: bee at 3 (1/3), ant at 4 (2/4)
    assert m[f"{mr}/gamma_gray_official"] == pytest.approx((1 / 3 + 2 / 4) / 2, abs=1e-6)
    assert m[f"{mr}/skipped_rows"] == 4.0          # 2 fillers x (no image, no label)
    assert "original image not found: 2" in res.skipped[f"{mr}/rows"]
    assert "'annotations' missing or empty: 2" in res.skipped[f"{mr}/rows"]
    for fill in ("noise", "scene"):
        assert layout_rcb.patch_dir(fill) in res.skipped[f"{mr}/{fill}"]
    expect = np.mean([torch.softmax(100 * F.normalize(torch.tensor(v, dtype=torch.float), dim=0)
                                    @ torch.eye(4), 0)[:2].mean().item() for v in ([1, 1, 0, 0],)]) - np.mean(
        [torch.softmax(100 * F.normalize(torch.tensor(v, dtype=torch.float), dim=0) @ torch.eye(4), 0)[:2].mean().item()
         for v in ([1, 0, 0.9, 0], [1, 1, 1, 1])])
    assert m[f"{mr}/dconf"] == pytest.approx(expect, abs=1e-6)
    r = "probe_b_r/fx"
    # R: x0 is the background-removed image with every object (black: [1, 0, 0.9, 0]; gray: all equal); the bee
    # (another object) and the apple are not scored: classes ant and cat remain
    assert m[f"{r}/skipped_rows"] == 2.0 and "'apple'" in res.skipped[f"{r}/rows"]
    assert m[f"{r}/acc"] == pytest.approx((1 + 0.5) / 2)             # gray: ant ties cat
    assert m[f"{r}/acc_official"] == 1.0                              # np.argmax: the first (ant) wins the tie
    assert m[f"{r}/acc_removed"] == pytest.approx(0.5) == m[f"{r}/acc_removed_official"]
    assert m[f"{r}/map_removed"] == pytest.approx((1 + 0.5) / 2)
    assert f"{r}/gamma_official" in m and f"{r}/dconf" in m
    assert set(probe_b._texts(Dataset("fx", tmp_path))) == set(PROMPTS_B)


def test_probe_b_missing_files_are_skipped_with_their_paths(tmp_path):
    res = probe_b.run(flat(), Dataset("fx", tmp_path, "probe_rcb"))
    assert not res.metrics
    assert "background_context_dataset.json" in res.skipped["probe_b_mr/fx"]
    assert "object_context_dataset.json" in res.skipped["probe_b_r/fx"]


def test_release_average_precision_is_the_release_code_row_by_row():
    """The vectorised rule against the release's own one-row computation (eval_context_understanding.py)."""
    def release(target, output):        # the release's function, transcribed
        indices = output.argsort()[::-1]
        total_count_ = np.cumsum(np.ones((len(output), 1)))
        target_ = target[indices]
        ind = target_ == 1
        pos_count_ = np.cumsum(ind)
        total = pos_count_[-1]
        pos_count_[np.logical_not(ind)] = 0
        pp = pos_count_ / total_count_
        return np.sum(pp) / (total + 1e-8)
    rng = np.random.default_rng(0)
    out = rng.integers(0, 4, (50, 12)).astype(np.float32)      # many ties
    tgt = (rng.random((50, 12)) < 0.3).astype(np.float32)
    tgt[:, 0] = 1
    got = probe_b.release_average_precision(tgt, out)
    assert got == pytest.approx([release(t, o) for t, o in zip(tgt, out)])


# ------------------------------------------------------------------ all ties, the right answer first


def test_all_ties_with_the_right_answer_first_tie_aware_is_chance_official_is_the_releases_rule(tmp_path, world_png):
    write_probe_r_fixture(tmp_path, world_png)
    write_probe_c_fixture(tmp_path, world_png)
    write_probe_b_fixture(tmp_path, world_png)
    ds = Dataset("fx", tmp_path)
    m = probe_r.run(flat(), ds).metrics
    for key in ("probe_r_subject", "probe_r_predicate", "probe_r_object", "probe_r_subject_only"):
        assert m[f"{key}/fx/acc"] == 0.5 and m[f"{key}/fx/acc_official"] == 0.0
        assert m[f"{key}/fx/confidence"] == pytest.approx(0.5)
    m = probe_c.run(flat(), ds).metrics
    assert (m["probe_c/fx/text"], m["probe_c/fx/image"], m["probe_c/fx/group"]) == pytest.approx((1 / 4, 1 / 4, 1 / 6))
    assert m["probe_c/fx/text_official"] == m["probe_c/fx/image_official"] == m["probe_c/fx/group_official"] == 0.0
    m = probe_b.run(flat(), ds).metrics
    assert m["probe_b_mr/fx/map"] == pytest.approx(2 / 4)                 # share of the labelled classes
    assert m["probe_b_mr/fx/map_official"] == pytest.approx((1 / 3 + 2 / 4) / 2, abs=1e-6)   # labels sit early
    assert m["probe_b_r/fx/acc"] == pytest.approx(1 / 2)                  # ant or cat
    assert m["probe_b_r/fx/acc_official"] == 1.0                          # the object (ant) comes first
    # VLU: gt always the first option
    write_vlu_fixture(tmp_path, gt_first=True)
    m = vlu.run(flat(64), ds).metrics
    assert m["vlu_shape/fx/acc"] == pytest.approx(1 / 3) and m["vlu_shape/fx/acc_official"] == 1.0
    assert m["vlu_color/fx/acc_mean"] == pytest.approx(1 / 3) and m["vlu_color/fx/acc_mean_official"] == 1.0


# ------------------------------------------------------------------ VLU


SHAPEIT = [("wheel", "circle"), ("pyramid", "triangle"), ("door", "rectangle")]


def write_vlu_fixture(root: Path, gt_first: bool = False) -> None:
    """ShapeIt as released (QUOTE_ALL, a str(list) of options), its config with two prompts, colours in the
    same layout, Brysbaert's ratings file (tab-separated) with a verb, a bigram and a bad rating."""
    (root / "datasets").mkdir(exist_ok=True)
    (root / "configs").mkdir(exist_ok=True)
    for path, rows, options in ((LV.SHAPE_CSV, SHAPEIT, ["triangle", "rectangle", "circle"]),
                                (LV.COLOR_CSV, [("banana", "yellow"), ("sky", "blue"), ("grass", "green")],
                                 ["yellow", "blue", "green"])):
        with open(root / path, "w", newline="") as f:
            w = csv.writer(f, quoting=csv.QUOTE_ALL)
            w.writerow(["word", "gt", "options"])
            for word, gt in rows:
                opts = [gt] + [o for o in options if o != gt] if gt_first else options
                w.writerow([word, gt, str(opts)])
            w.writerow(["broken", "circle", "not a list"])
    (root / LV.SHAPE_CONFIG).write_text(json.dumps({"setup_params": {"task": "choice"},
                                                   "prompts": ["a photo of a MASK shaped WORD", "a MASK WORD"]}))
    words = {"chair": 4.9, "table": 4.8, "idea": 1.5, "hope": 1.2, "stone": 4.7, "truth": 1.6}
    lines = ["\t".join(LV.CONCRETENESS_COLUMNS)]
    lines += [f"{w}\t0\t{c}\t1.0\t0\t30\t1.0\t100\tNoun" for w, c in words.items()]
    lines += ["run\t0\t3.0\t1.0\t0\t30\t1.0\t100\tVerb", "ice cube\t1\t5.0\t1.0\t0\t30\t1.0\t10\tNoun",
              "blob\t0\tn/a\t1.0\t0\t30\t1.0\t10\tNoun"]
    (root / LV.CONCRETENESS).write_text("\n".join(lines) + "\n")


def test_vlu_reads_shapeit_config_and_brysbaert_as_released(tmp_path):
    write_vlu_fixture(tmp_path)
    ctx = flat(64)
    res = vlu.run(ctx, Dataset("fx", tmp_path))
    m = res.metrics
    assert m["vlu_shape/fx/skipped_rows"] == 1.0 and "options not a list" in res.skipped["vlu_shape/fx/rows"]
    assert [r["prompt"] for r in res.records["vlu_shape/fx"]] == ["a photo of a MASK shaped WORD", "a MASK WORD"]
    assert len(res.records["vlu_color/fx"]) == len(vlu.COLOR_PROMPTS)          # no config: the paper's prompts
    # the repository's substitution: negft's slot '*', the official slot ''
    assert "a photo of a * shaped wheel" in ctx.seen_texts and "a photo of a  shaped wheel" in ctx.seen_texts
    assert "a photo of a circle shaped wheel" in ctx.seen_texts
    assert m["vlu_concreteness/fx/skipped_rows"] == 1.0                        # the bad rating
    assert "I see the idea" in ctx.seen_texts and "I see the run" not in ctx.seen_texts
    assert "I see the ice cube" not in ctx.seen_texts
    assert "vlu_shape_adj/fx" in res.skipped and "shape_association_adj.csv" in res.skipped["vlu_shape_adj/fx"]
    assert set(vlu._texts(Dataset("fx", tmp_path))) == set(ctx.seen_texts)


# ------------------------------------------------------------------ the world


def test_world_writes_every_released_file_and_the_probes_read_only_them(cache):
    root = cache / "world-s0-tiny" / "val"
    for rel in (layout_rcb.probe_r_file("subject"), layout_rcb.probe_r_file("object"), *layout_rcb.PROBE_C_FILES.values(), layout_rcb.PROBE_B_MR_FILE,
                layout_rcb.PROBE_B_R_FILE, layout_rcb.PROMPT_CLASSES, LV.SHAPE_CSV, LV.SHAPE_CONFIG, LV.COLOR_CSV):
        assert (root / rel).is_file(), rel
    from negft import models
    torch.manual_seed(0)
    b = models.build("negft-tiny", "")
    ctx = EvalContext(b.model.eval(), b.preprocess_val, b.tokenizer, "cpu", n_boot=20)
    ds = Dataset("world", root)
    metrics, skipped = {}, {}
    for probe in (probe_r, probe_c, probe_b, vlu):
        res = probe.run(ctx, ds)
        metrics.update(res.metrics)
        skipped.update(res.skipped)
    assert set(skipped) == {"vlu_shape_adj/world", "vlu_concreteness/world"}
    for key in ("probe_r_predicate/world/acc", "probe_r_subject/world/acc_official", "probe_r_object/world/confidence",
                "probe_r_subject_only/world/acc", "probe_c/world/group_official", "probe_c/world/text_composition",
                "probe_b_mr/world/gamma_scene_official", "probe_b_r/world/acc_removed", "vlu_shape/world/acc",
                "vlu_color/world/acc_mean_official"):
        assert key in metrics, key
    for key, v in metrics.items():
        if key.endswith("skipped_rows"):
            assert v == 0.0, key
        elif "/gamma" not in key and "/dconf" not in key:
            assert 0.0 <= v <= 1.0, (key, v)
    # linked images are encoded under the world's own paths, shared with the other probes
    assert all(str(root / "images") in p for p in ctx._images)


def _scenes(root: Path) -> dict:
    return {json.loads(line)["image_path"]: json.loads(line)["scene"]
            for line in (root / "annotations.jsonl").read_text().splitlines()}


def test_world_probe_r_file_follows_the_annotations(cache):
    from negft.world.generator import relations
    from negft.world.formats.probe_rcb import relation_prompt
    root = cache / "world-s0-tiny" / "val"
    scenes = _scenes(root)
    rel = lambda p: os.path.relpath(os.path.realpath(p), os.path.realpath(root))
    truths = lambda objs: {relation_prompt(objs[i]["shape"], q, objs[j]["shape"]) for i, q, j in relations(objs)}
    for switch in layout_rcb.PROBE_R_SWITCHES:
        data = json.loads((root / layout_rcb.probe_r_file(switch)).read_text())
        assert len(data) == sum(bool(s["relations"]) for s in scenes.values())
        for image_id, row in data.items():
            objs = scenes[rel(root / layout_rcb.VG_IMAGES / f"{image_id}.png")]["objects"]
            true = truths(objs)
            assert row["positive_prompt"] in true
            assert row["negative_prompt"] not in true and row["negative_predicate_prompt"] not in true
            assert row["negative_object"] not in {o["shape"] for o in objs}
            for key, shape in (("positive_image_ids", row["positive_object"]),
                               ("negative_image_ids", row["negative_object"])):
                assert 0 < len(row[key]) <= 10
                for i in row[key]:
                    alone = scenes[rel(root / layout_rcb.VG_IMAGES / f"{i}.png")]["objects"]
                    assert [o["shape"] for o in alone] == [shape]


def test_world_probe_c_and_probe_b_files_follow_the_annotations(cache):
    root = cache / "world-s0-tiny" / "val"
    scenes = _scenes(root)
    rel = lambda p: os.path.relpath(os.path.realpath(p), os.path.realpath(root))
    pixels = lambda p: np.asarray(Image.open(p).convert("RGB"), dtype=np.int16)
    kinds = set()
    for kind, path in layout_rcb.PROBE_C_FILES.items():
        for pair in json.loads((root / path).read_text()):
            kinds.add(kind)
            objs = scenes[rel(root / layout_rcb.COCO_IMAGES / layout_rcb.coco_name(pair["img1_id"]).replace(".jpg", ".png"))]["objects"]
            true_0 = {o[w] + " " + o["shape"] for o in objs for w in ("size", "color")}
            assert f"{pair['img1_composition']} {pair['img1_object']}" in true_0
            assert f"{pair['img2_composition']} {pair['img2_object']}" not in true_0
            assert (pair["img1_object"] == pair["img2_object"]) == (kind == "composition")
    assert kinds == {"composition", "object"}
    png = lambda name: name.replace(".jpg", ".png")
    classes = [r["class"] for r in csv.DictReader(open(root / layout_rcb.PROMPT_CLASSES))]
    background = json.loads((root / layout_rcb.PROBE_B_MR_FILE).read_text())
    for a in background:
        objs = scenes[rel(root / layout_rcb.COCO_IMAGES / png(a["image"]))]["objects"]
        assert sorted(a["annotations"]) == sorted(o["shape"] for o in objs) and set(a["annotations"]) <= set(classes)
    for a in json.loads((root / layout_rcb.PROBE_B_R_FILE).read_text()):
        objs = scenes[rel(root / layout_rcb.COCO_IMAGES / png(layout_rcb.coco_name(a["image_id"])))]["objects"]
        assert sorted([a["object"], *a["other_objects"]]) == sorted(o["shape"] for o in objs)
        for fill in layout_rcb.PROBE_B_FILLERS:
            every = pixels(root / layout_rcb.background_removed_dir(fill) / png(layout_rcb.coco_name(a["image_id"])))
            one = pixels(root / layout_rcb.one_object_dir(fill) / png(a["path"]))
            for o in objs:    # the kept object is drawn alike in both; the others only where all are kept
                x0, y0, x1, y1 = o["bbox"]
                same = np.array_equal(every[y0:y1, x0:x1], one[y0:y1, x0:x1])
                assert same == (o["shape"] == a["object"]), (a, fill, o)


def test_world_vlu_files_are_shapeit_style_from_the_context_priors(cache):
    from negft.world.generator import CONTEXT_PRIORS
    from negft.world.render import SHAPES
    root = cache / "world-s0-tiny" / "val"
    rows = list(csv.DictReader(open(root / LV.SHAPE_CSV)))
    assert rows and all(r["options"].startswith("['") for r in rows)
    prompts = json.loads((root / LV.SHAPE_CONFIG).read_text())["prompts"]
    assert all("MASK" in p and "WORD" in p for p in prompts)
    from negft.phrasings import BACKGROUND_PHRASES
    bg_of = {p: bg for bg, phrases in BACKGROUND_PHRASES.items() for p in phrases}
    for r in rows:
        weights = dict(zip(SHAPES, CONTEXT_PRIORS[bg_of[r["word"]]]))
        options = list_cell(r["options"])
        assert weights[r["gt"]] == max(weights.values()) and r["gt"] in options
        assert all(weights[o] < weights[r["gt"]] for o in options if o != r["gt"])     # one right option


# ------------------------------------------------------------------ no world code in the probes


PROBE_MODULES = sorted(p.name for p in (REPO / "negft" / "probes").glob("*.py"))


@pytest.mark.parametrize("module", PROBE_MODULES)
def test_no_probe_module_reads_the_worlds_annotation_or_text_code(module):
    """Probes read released files only: no import of the world (negft.world) or its phrasings (negft.phrasings),
    and no annotations.jsonl or world.json (docstrings and comments may name them)."""
    source = (REPO / "negft" / "probes" / module).read_text()
    code = re.sub(r'"""[\s\S]*?"""', "", source)
    code = "\n".join(line.split("#")[0] for line in code.splitlines())
    found = re.findall(r"negft\.world\b|negft\.phrasings|from negft import [^\n]*\b(?:world|phrasings)\b|"
                       r"annotations\.jsonl|world\.json", code)
    assert not found, (module, found)
