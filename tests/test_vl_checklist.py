"""VL-CheckList: the reader on a fixture in the released layout (om-ai-lab/VL-CheckList: data/<type>/...json lists of
[image path, {POS, NEG}], images under vg/, swig/), scored by a stand-in model with known scores, tie-aware and
official (with the reference's row cap), the category and group means; odd rows counted; and the world's files."""
import json
from pathlib import Path

import pytest
from PIL import Image

from negft import phrasings
from negft.probes import vl_checklist
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import vl_checklist as writer
from conftest import RandomModel, written_twice
from tests.conftest import planted_context

RIGHT, WRONG, EVEN = [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]     # phrase features against the one image feature [1, 0]
OUTCOMES = {"win": (RIGHT, WRONG), "loss": (WRONG, RIGHT), "tie": (EVEN, EVEN), "empty": (WRONG, RIGHT)}
# file -> (image folder, image path pattern, outcomes in order)
FILES = {"data/Attribute/vg/color.json": ("vg", "VG_100K/{}.jpg", ["win", "win", "tie", "loss"]),
         "data/Attribute/vaw/size.json": ("vg", "VG_100K_2/{}.jpg", ["win", "win", "empty"]),
         "data/Relation/vg/spatial.json": ("vg", "VG_100K/{}.jpg", ["loss", "tie"]),
         "data/Object/Size/swig_size/swig_agent/swig_agent_small.json": ("swig", "jumping_{}.jpg", ["win"])}
ODD = [["VG_100K/1.jpg"], ["VG_100K/1.jpg", {"POS": [], "NEG": ["a"]}], ["VG_100K/1.jpg", {"POS": "red", "NEG": ["a"]}],
       ["VG_100K/999.jpg", {"POS": ["a"], "NEG": ["b"]}]]


def released_fixture(root: Path, world_split: Path) -> tuple[list[str], dict]:
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    images, features, k = [], {}, 0
    for file, (folder, pattern, outcomes) in FILES.items():
        rows = []
        for n, outcome in enumerate(outcomes):
            path = root / folder / pattern.format(n + 1)
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.open(sources[k]).convert("RGB").save(path)
            k += 1
            images.append(str(path))
            pos, neg = ("" if outcome == "empty" else f"{file} {n} pos"), f"{file} {n} neg"
            features[pos], features[neg] = OUTCOMES[outcome]
            rows.append([pattern.format(n + 1), {"POS": [pos, "a second phrase"], "NEG": [neg]}])
        (root / file).parent.mkdir(parents=True, exist_ok=True)
        (root / file).write_text(json.dumps(rows + (ODD if "color" in file else [])))
    (root / "data/Relation/vg/action.json").write_text("[[")
    return images, features


def _ctx(images, features) -> EvalContext:
    return planted_context({p: RIGHT for p in images}, features)


@pytest.fixture(scope="module")
def fixture(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("vl_checklist")
    images, features = released_fixture(root, cache / "world-s0-tiny" / "val")
    return root, images, features


def test_known_scores_per_file_category_and_group(fixture):
    root, images, features = fixture
    dataset = Dataset("vl_checklist", root, "vl_checklist")
    result = vl_checklist.run(_ctx(images, features), dataset)
    m, p = result.metrics, "vl_checklist/vl_checklist"
    assert m[f"{p}/attribute_color_vg"] == pytest.approx(2.5 / 4) and m[f"{p}/attribute_color_vg_official"] == 0.5
    assert m[f"{p}/attribute_size_vaw"] == pytest.approx(2 / 3) == m[f"{p}/attribute_size_vaw_official"]
    assert m[f"{p}/relation_spatial_vg"] == 0.25 and m[f"{p}/relation_spatial_vg_official"] == 0.0
    assert m[f"{p}/object_size_small_swig_agent"] == 1.0
    # categories: the mean of their files (one each here); groups: of their categories; avg: of the groups
    assert m[f"{p}/attribute_color"] == pytest.approx(0.625) and m[f"{p}/relation_spatial"] == 0.25
    assert m[f"{p}/attribute"] == pytest.approx((0.625 + 2 / 3) / 2)
    assert m[f"{p}/attribute_official"] == pytest.approx((0.5 + 2 / 3) / 2)
    assert m[f"{p}/object"] == 1.0 and m[f"{p}/relation_official"] == 0.0
    assert m[f"{p}/avg"] == pytest.approx(((0.625 + 2 / 3) / 2 + 1 + 0.25) / 3)
    assert m[f"{p}/avg_official"] == pytest.approx(((0.5 + 2 / 3) / 2 + 1 + 0) / 3)
    assert set(vl_checklist.texts(dataset)) == set(features)     # the first POS and NEG: the phrases encoded


def test_the_official_rule_reads_the_references_first_rows_only(fixture, monkeypatch):
    root, images, features = fixture
    monkeypatch.setattr(vl_checklist, "OFFICIAL_ROWS", 2)
    result = vl_checklist.run(_ctx(images, features), Dataset("vl_checklist", root, "vl_checklist"))
    p = "vl_checklist/vl_checklist/attribute_color_vg"
    assert result.metrics[f"{p}_official"] == 1.0 and result.metrics[p] == pytest.approx(2.5 / 4)


def test_odd_rows_unreadable_and_absent_files(fixture, tmp_path):
    root, images, features = fixture
    result = vl_checklist.run(_ctx(images, features), Dataset("vl_checklist", root, "vl_checklist"))
    p = "vl_checklist/vl_checklist"
    assert result.metrics[f"{p}/skipped_rows"] == len(ODD)
    msg = result.skipped[f"{p}/attribute_color_vg/rows"]
    assert msg.startswith("4 of 8 rows skipped") and "color.json" in msg
    for reason in ("not [image path, {POS, NEG}]: 1", "not a non-empty list of strings: 2",
                   "image file not found (the reference drops it too): 1"):
        assert reason in msg, reason
    assert "unreadable JSON" in result.skipped[f"{p}/relation_action_vg"]
    assert str(root / "data/Attribute/vg/action.json") in result.skipped[f"{p}/attribute_action_vg"]
    assert "data_manifests/vl_checklist.yaml" in result.skipped[f"{p}/attribute_action_vg"]
    result = vl_checklist.run(_ctx([], {}), Dataset("vl_checklist", tmp_path, "vl_checklist"))
    assert "data not found" in result.skipped[f"{p}"] and not result.metrics


# ------------------------------------------------------------------ the world
def test_world_rows_are_true_and_their_negatives_false(cache):
    root = cache / "world-s0-tiny" / "val"
    records = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()]
    scenes = {int(Path(r["image_path"]).stem): r["scene"] for r in records if "zs_" not in r["image_path"]}
    words = {v: k for k, v in phrasings.PREDICATE_WORDS.items()}
    files = sorted(p.relative_to(root).as_posix() for p in (root / "data").rglob("*.json")
                   if p.relative_to(root).as_posix().startswith(("data/Attribute", "data/Object", "data/Relation")))
    assert set(files) <= set(writer.WRITTEN) <= {f for f, _ in vl_checklist.FILES.values()} and len(files) >= 6
    for file in files:
        for image, texts in json.loads((root / file).read_text()):
            scene = scenes[int(Path(image).stem.removeprefix("world_"))]
            named = {f"{o['color']} {o['shape']}": k for k, o in enumerate(scene["objects"])}
            pos, neg = texts["POS"][0], texts["NEG"][0]
            if "Attribute/vg" in file:
                assert pos in named and neg not in named
            elif "Attribute/vaw" in file:
                sized = {f"{o['size']} {o['shape']}" for o in scene["objects"]}
                assert pos in sized and neg not in sized
            else:
                def holds(text):
                    for w, pred in words.items():
                        a, sep, b = text.partition(f" {w} ")
                        if sep:
                            return a in named and b in named and [named[a], pred, named[b]] in scene["relations"]
                    raise AssertionError(text)
                assert holds(pos) and not holds(neg), (file, pos, neg)
    result = vl_checklist.run(RandomModel(), Dataset("world", root))
    assert not [k for k in result.skipped if k.endswith("/rows")], result.skipped
    assert {f"vl_checklist/world/{m}" for m in ("attribute", "object", "relation", "avg", "attribute_color_vg")} \
        <= set(result.metrics)



def test_the_world_writer_is_deterministic(cache, tmp_path):
    root = cache / "world-s0-tiny" / "val"
    a, b = written_twice(root, tmp_path, writer)
    for file in ("data/Attribute/vg/color.json", "data/Relation/vg/spatial.json"):
        assert (a / file).read_bytes() == (b / file).read_bytes() == (root / file).read_bytes()