"""Winoground: the reader on fixtures in the released layout (facebook/winoground examples.jsonl + images/*.png),
scored by stand-in models with known scores, tie-aware and official; and the world's examples.jsonl."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from negft.world import generator as world
from negft.world.formats import winoground as writer
from negft.probes import winoground
from negft.probes.base import Dataset, EvalContext

# image features and caption features: s(caption, image) is their dot product
IMAGE = {"i0": [1.0, 0.0], "i1": [0.0, 1.0], "same": [1.0, 1.0]}
CAPTION = {"c0": [1.0, 0.0], "c1": [0.0, 1.0], "same": [1.0, 1.0],
           "c0 leans to image 1": [0.6, 0.8]}


def _unit(v):
    return torch.nn.functional.normalize(torch.tensor(v, dtype=torch.float), dim=0)


def released_fixture(root: Path, world_split: Path, examples: list[tuple]) -> EvalContext:
    """``examples.jsonl`` and ``images/ex_<id>_img_<k>.png`` (world images) in ``root``, as released; each example
    is (caption_0, caption_1, image feature 0, image feature 1, collapsed_tag[, secondary_tag, num_main_preds]),
    by default "" and 1. Returns a stand-in context."""
    (root / "images").mkdir(parents=True, exist_ok=True)
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    rows, ctx = [], EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=50)
    for i, (c0, c1, f0, f1, tag, *more) in enumerate(examples):
        secondary, preds = more or ("", 1)
        stems = [f"ex_{i}_img_{k}" for k in (0, 1)]
        for k, (stem, feature) in enumerate(zip(stems, (f0, f1))):
            shutil.copy(sources[(2 * i + k) % len(sources)], root / "images" / f"{stem}.png")
            ctx._images[str(root / "images" / f"{stem}.png")] = _unit(IMAGE[feature])
        rows.append({"id": i, "caption_0": c0, "caption_1": c1, "tag": "Noun", "secondary_tag": secondary,
                     "num_main_preds": preds, "collapsed_tag": tag, "image_0": stems[0], "image_1": stems[1]})
    writer.write_examples(root / "examples.jsonl", rows)
    ctx._texts.update({t: _unit(v) for t, v in CAPTION.items()})
    return ctx


EXAMPLES = [("c0", "c1", "i0", "i1", "Object"),                   # all four right: text, image, group 1
            ("c0 leans to image 1", "c1", "i0", "i1", "Object"),  # text right, image wrong (see below)
            ("c1", "c0", "i0", "i1", "Relation"),                 # every pairing wrong: 0, 0, 0
            ("same", "same", "i0", "i1", "Both")]                 # captions identical: every text comparison ties


def test_layout_is_the_released_one(tmp_path, cache):
    released_fixture(tmp_path, cache / "world-s0-tiny" / "val", EXAMPLES)
    lines = (tmp_path / "examples.jsonl").read_text().splitlines()
    assert len(lines) == 4
    row = json.loads(lines[0])
    assert set(row) == {"id", "caption_0", "caption_1", "image_0", "image_1", "tag", "secondary_tag",
                        "num_main_preds", "collapsed_tag"}
    assert row["image_0"] == "ex_0_img_0" and (tmp_path / "images" / "ex_0_img_0.png").is_file()


def test_known_scores_tie_aware_official_and_by_tag(tmp_path, cache):
    ctx = released_fixture(tmp_path, cache / "world-s0-tiny" / "val", EXAMPLES)
    result = winoground.run(ctx, Dataset("winoground", tmp_path, "winoground"))
    m, p = result.metrics, "winoground/winoground"
    # example 2: s(c0', i0) = 0.6 > s(c1, i0) = 0 and s(c1, i1) = 1 > s(c0', i1) = 0.8: text right; but
    # s(c0', i0) = 0.6 < s(c0', i1) = 0.8: image wrong, group wrong
    # example 4: s(same, i0) = s(same, i1) for both captions: text and image each 1/4, group 1/6 in expectation
    assert m[f"{p}/text"] == pytest.approx((1 + 1 + 0 + 0.25) / 4)
    assert m[f"{p}/image"] == pytest.approx((1 + 0 + 0 + 0.25) / 4)
    assert m[f"{p}/group"] == pytest.approx((1 + 0 + 0 + 1 / 6) / 4)
    assert m[f"{p}/text_official"] == 0.5 and m[f"{p}/image_official"] == m[f"{p}/group_official"] == 0.25
    assert m[f"{p}/text_object"] == 1.0 and m[f"{p}/group_object"] == 0.5 and m[f"{p}/group_relation"] == 0.0
    assert m[f"{p}/group_both"] == pytest.approx(1 / 6) and m[f"{p}/group_both_official"] == 0.0
    assert f"{p}/skipped_rows" not in m and not result.skipped
    assert [r["id"] for r in result.records[p]] == [0, 1, 2, 3]
    assert set(winoground.texts(Dataset("winoground", tmp_path))) == {"c0", "c1", "same", "c0 leans to image 1"}


# secondary_tag as the release writes it: ", "-separated, "" for none (facebook/winoground examples.jsonl)
TAGGED = [("c0", "c1", "i0", "i1", "Object", "Symbolic", 1),                # right: 1, 1, 1
          ("c1", "c0", "i0", "i1", "Relation", "Symbolic", 2),              # wrong: 0, 0, 0
          ("c0", "c1", "i0", "i1", "Relation", "Symbolic, Series", 2),      # right, in no visual subset
          ("c0", "c1", "i0", "i1", "Object", "Morpheme-Level", 1),          # right
          ("same", "same", "i0", "i1", "Both", "", 1)]                      # text ties: 1/4, 1/4, 1/6; official 0


def test_secondary_tags_and_main_predicates_break_down_as_compute_statistics_filters(tmp_path, cache):
    """filter_examples({"secondary_tag": "Symbolic"}) keeps the examples whose field equals "Symbolic": one tagged
    "Symbolic, Series" is in neither subset; filter_examples({"num_main_preds": 2}) the examples with 2."""
    ctx = released_fixture(tmp_path, cache / "world-s0-tiny" / "val", TAGGED)
    result = winoground.run(ctx, Dataset("winoground", tmp_path, "winoground"))
    m, p = result.metrics, "winoground/winoground"
    for name in ("text", "image", "group"):
        for suffix in ("", "_official"):
            assert m[f"{p}/{name}_symbolic{suffix}"] == 0.5                 # examples 0 and 1 only
            assert m[f"{p}/{name}_morpheme_level{suffix}"] == 1.0
            assert m[f"{p}/{name}_preds2{suffix}"] == 0.5                   # examples 1 and 2
    assert not any("series" in k for k in m)                               # only ever alongside Symbolic
    assert m[f"{p}/text_preds1"] == pytest.approx((1 + 1 + 0.25) / 3)
    assert m[f"{p}/group_preds1"] == pytest.approx((1 + 1 + 1 / 6) / 3)
    assert m[f"{p}/group_preds1_official"] == pytest.approx(2 / 3)
    assert m[f"{p}/text_object"] == 1.0 and m[f"{p}/text_relation"] == 0.5      # collapsed_tag as before
    assert not result.skipped
    records = {r["id"]: r for r in result.records[p]}
    assert records[2]["secondary_tag"] == ["symbolic", "series"] and records[2]["num_main_preds"] == 2
    assert records[4]["secondary_tag"] == []


def test_malformed_tag_fields_are_counted_and_their_examples_still_scored(tmp_path, cache):
    ctx = released_fixture(tmp_path, cache / "world-s0-tiny" / "val", [
        ("c0", "c1", "i0", "i1", "Object", "Symbolic", 1),
        ("c0", "c1", "i0", "i1", "Object", ["Symbolic"], "2"),      # a list; a string
        ("c1", "c0", "i0", "i1", "Object", "--", 0),                # no tag in it; not positive
        ("c1", "c0", "i0", "i1", 7, None, True)])                   # a number; null; a boolean
    lines = (tmp_path / "examples.jsonl").read_text().splitlines()
    row = json.loads(lines[0])
    del row["secondary_tag"], row["num_main_preds"], row["collapsed_tag"]
    lines.append(json.dumps({**row, "id": 4}))                      # all three missing
    (tmp_path / "examples.jsonl").write_text("\n".join(lines) + "\n")
    result = winoground.run(ctx, Dataset("winoground", tmp_path, "winoground"))
    m, p = result.metrics, "winoground/winoground"
    assert m[f"{p}/group_official"] == pytest.approx(3 / 5)          # every example scored overall
    assert m[f"{p}/group_symbolic"] == 1.0 and m[f"{p}/group_preds1"] == 1.0    # the well-formed example only
    assert m[f"{p}/group_object"] == pytest.approx(2 / 3)              # examples 0-2 (not the 7, not the missing)
    assert f"{p}/skipped_rows" not in m
    msg = result.skipped[f"{p}/tags"]
    for reason in ("secondary_tag not a string: 2", "secondary_tag names no tag: 1", "secondary_tag missing: 1",
                   "num_main_preds not a positive integer: 3", "num_main_preds missing: 1",
                   "collapsed_tag not a string: 1", "collapsed_tag missing: 1"):
        assert reason in msg, (reason, msg)


def test_all_ties_give_winogrounds_chance_levels_and_official_zero(tmp_path, cache):
    """The right caption always first (caption_0 goes with image_0) and all four scores equal: negft's rule
    gives Winoground's chance levels 1/4, 1/4, 1/6; the strict rule of its statistics code gives 0."""
    ctx = released_fixture(tmp_path, cache / "world-s0-tiny" / "val",
                           [("same", "same", "same", "same", "Object")] * 5)
    m = winoground.run(ctx, Dataset("winoground", tmp_path, "winoground")).metrics
    assert m["winoground/winoground/text"] == pytest.approx(0.25)
    assert m["winoground/winoground/image"] == pytest.approx(0.25)
    assert m["winoground/winoground/group"] == pytest.approx(1 / 6)
    for name in ("text", "image", "group"):
        assert m[f"winoground/winoground/{name}_official"] == 0.0


def test_missing_file_is_skipped_with_its_path(tmp_path):
    result = winoground.run(EvalContext(torch.nn.Linear(1, 1), None, None, "cpu"),
                            Dataset("winoground", tmp_path / "nowhere", "winoground"))
    msg = result.skipped["winoground/winoground"]
    assert "nowhere/examples.jsonl" in msg and "data_manifests/winoground.yaml" in msg
    assert not result.metrics
    assert winoground.texts(Dataset("winoground", tmp_path / "nowhere")) == []


def test_malformed_lines_are_counted_and_the_rest_scored(tmp_path, cache):
    ctx = released_fixture(tmp_path, cache / "world-s0-tiny" / "val", EXAMPLES[:1])
    with open(tmp_path / "examples.jsonl", "a") as f:
        f.write("{not json\n")
        f.write(json.dumps({"id": 8, "caption_0": "c0", "image_0": "ex_0_img_0", "image_1": "ex_0_img_1"}) + "\n")
        f.write(json.dumps({"id": 9, "caption_0": "c0", "caption_1": "c1", "image_0": "ex_0_img_0",
                            "image_1": "ex_99_img_1"}) + "\n")
        f.write("\n")
    result = winoground.run(ctx, Dataset("winoground", tmp_path, "winoground"))
    assert result.metrics["winoground/winoground/skipped_rows"] == 3
    assert result.metrics["winoground/winoground/group"] == 1.0
    msg = result.skipped["winoground/winoground/rows"]
    assert msg.startswith("3 of 4 lines skipped") and "line is not JSON: 1" in msg and "image file not found: 1" in msg


def test_the_manifest_serves_the_probe_from_negft_data(tmp_path, cache, monkeypatch):
    from negft.evaluation import datasets_for
    ctx = released_fixture(tmp_path / "winoground", cache / "world-s0-tiny" / "val", EXAMPLES)
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path))
    (ds,) = [d for d in datasets_for(None) if d.name == "winoground"]
    assert ds.probes == ("winoground",) and ds.root == tmp_path / "winoground"
    assert winoground.run(ctx, ds).metrics["winoground/winoground/text_official"] == 0.5


# ------------------------------------------------------------------ the world
def test_world_pairs_follow_the_annotations_and_an_order_blind_model_is_at_chance(cache):
    from test_sugarcrepe import _BagOfWords, holds    # the world's caption grammar, an order-blind stand-in
    root = cache / "world-s0-tiny" / "val"
    ann = {json.loads(line)["image_path"]: json.loads(line)
           for line in (root / "annotations.jsonl").read_text().splitlines()}
    rows = [json.loads(line) for line in (root / "examples.jsonl").read_text().splitlines()]
    pairs = sum(1 for a in ann.values() if a.get("relcomp"))
    assert len(rows) == pairs > 0 and [r["id"] for r in rows] == list(range(pairs))
    assert {r["collapsed_tag"] for r in rows} == {"Object", "Relation"}
    assert all(r["secondary_tag"] == "" and r["num_main_preds"] == 1 for r in rows)     # released types
    for r in rows:
        assert all((root / "images" / f"{r[k]}.png").is_file() for k in ("image_0", "image_1"))
        rec = ann[f"images/{r['image_0']}.png"]
        scene_0 = rec["scene"]
        objects_1 = rec["relcomp"]["objects_1"]
        scene_1 = {"objects": objects_1, "relations": world.relations(objects_1)}
        assert sorted(r["caption_0"].lower().split()) == sorted(r["caption_1"].lower().split())   # same words
        assert r["caption_0"] != r["caption_1"]
        assert holds(scene_0, r["caption_0"]) and not holds(scene_1, r["caption_0"]), r
        assert holds(scene_1, r["caption_1"]) and not holds(scene_0, r["caption_1"]), r
    m = winoground.run(_BagOfWords(), Dataset("world", root)).metrics
    # the captions tie on every image: text 1/4 by the random tie-break, and no caption can pick its image
    assert m["winoground/world/text"] == pytest.approx(0.25) and m["winoground/world/text_official"] == 0.0
    assert m["winoground/world/image"] == 0.0 and m["winoground/world/group"] == 0.0
    assert "winoground/world/group_object" in m and "winoground/world/group_relation" in m
    assert m["winoground/world/text_preds1"] == m["winoground/world/text"]      # one main predicate each
