"""SPEC: the reader on fixtures in the released layout (wjpoom/SPEC <subset>/image2text.json, text2image.json and
the subset's images), scored by a stand-in model with known scores, tie-aware and official; and the world's
files."""
import json
import shutil
from pathlib import Path

import pytest
import torch

from negft.probes import spec
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import spec as writer
from tests.conftest import planted_context

# image features: A and C [1, 0], B [0, 1]; text features: TA [1, 0], TB [0, 1], TT1 and TT2 [1, 1]
IMAGES = {"images/a.png": [1.0, 0.0], "images/b.png": [0.0, 1.0], "images/c.png": [1.0, 0.0]}
TEXTS = {"TA": [1.0, 0.0], "TB": [0.0, 1.0], "TT1": [1.0, 1.0], "TT2": [1.0, 1.0]}
A, B, C = IMAGES

# absolute_size image2text: (row, tie-aware credit, official hit); None: left out of that rule
I2T = [({"query": A, "keys": ["TA", "TB"], "label": 0}, 1.0, 1.0),
       ({"query": A, "keys": ["TB", "TA"], "label": 0}, 0.0, 0.0),
       ({"query": A, "keys": ["TT1", "TT2"], "label": 1}, 0.5, 0.0),          # a tie: argmax takes index 0
       ({"query": A, "keys": ["TT1", "TT2", "TB"], "label": 0}, 0.5, 1.0),    # three candidates in one subset
       ({"query": A, "keys": ["TA"], "label": 5}, None, 0.0),                 # a label naming no candidate
       ({"query": "images/missing.png", "keys": ["TA", "TB"], "label": 0}, None, None),
       ({"query": A, "keys": "TA", "label": 0}, None, None),
       ({"query": A, "keys": ["TA", "TB"], "label": "0"}, None, None),
       (["images/a.png", ["TA"], 0], None, None)]
T2I = [({"query": "TA", "keys": [A, B], "label": 0}, 1.0, 1.0),
       ({"query": "TA", "keys": [A, C], "label": 1}, 0.5, 0.0)]               # A and C tie
COUNT = {"i2t": [{"query": B, "keys": ["TB", "TA", "TT1"], "label": 0}],
         "t2i": [{"query": "TB", "keys": [A, B, C], "label": 1}]}


def released_fixture(root: Path, world_split: Path) -> None:
    """absolute_size and count as released, images copied from the world's."""
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    for subset, i2t, t2i in (("absolute_size", [r for r, _, _ in I2T], [r for r, _, _ in T2I]),
                             ("count", COUNT["i2t"], COUNT["t2i"])):
        (root / subset / "images").mkdir(parents=True)
        for k, name in enumerate(IMAGES):
            shutil.copyfile(sources[k], root / subset / name)
        (root / subset / "image2text.json").write_text(json.dumps(i2t, indent=2))
        (root / subset / "text2image.json").write_text(json.dumps(t2i, indent=2))


def _ctx(root: Path) -> EvalContext:
    return planted_context({str(root / s / p): v for s in spec.SUBSETS for p, v in IMAGES.items()}, TEXTS)


@pytest.fixture(scope="module")
def fixture_result(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("spec")
    released_fixture(root, cache / "world-s0-tiny" / "val")
    return root, spec.run(_ctx(root), Dataset("spec", root, "spec"))


def _mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values)


def test_known_scores_tie_aware_official_and_the_mean_over_subsets(fixture_result):
    root, result = fixture_result
    m, p = result.metrics, "spec/spec"
    assert m[f"{p}/absolute_size_i2t"] == pytest.approx(_mean([c for _, c, _ in I2T])) == pytest.approx(0.5)
    assert m[f"{p}/absolute_size_i2t_official"] == pytest.approx(_mean([o for _, _, o in I2T])) == pytest.approx(0.4)
    assert m[f"{p}/absolute_size_t2i"] == 0.75 and m[f"{p}/absolute_size_t2i_official"] == 0.5
    assert m[f"{p}/count_i2t"] == 1.0 and m[f"{p}/count_t2i_official"] == 1.0
    # the unweighted mean of the subsets present, as eval.py's "average all subset"
    assert m[f"{p}/i2t"] == pytest.approx(0.75) and m[f"{p}/i2t_official"] == pytest.approx(0.7)
    assert m[f"{p}/t2i"] == pytest.approx(0.875) and m[f"{p}/t2i_official"] == pytest.approx(0.75)
    assert set(spec.texts(Dataset("spec", root, "spec"))) == set(TEXTS)


def test_skipped_rows_counted_by_reason_and_missing_subsets_named(fixture_result):
    root, result = fixture_result
    p = "spec/spec"
    assert result.metrics[f"{p}/skipped_rows"] == 5
    why = result.skipped[f"{p}/absolute_size_i2t/rows"]
    assert why.startswith("5 of 9 rows skipped") and "image2text.json" in why
    for reason in ("image file not found: 1", "'keys' not a non-empty list of strings: 1",
                   "'label' not an integer: 1", "row is not an object: 1",
                   "label names no candidate (a miss under the reference's rule): 1"):
        assert reason in why, reason
    missing = result.skipped[f"{p}/existence_t2i"]
    assert str(root / "existence" / "text2image.json") in missing and "data_manifests/spec.yaml" in missing


def test_an_empty_caption_is_scored_as_the_reference_scores_it(tmp_path, cache):
    """SPEC's code tokenizes "" (an I2T candidate, a T2I query) and scores the row: so do both rules here. An image
    path "" names no file (the reference stops at it): skipped. "" has TB's feature [0, 1]."""
    sources = sorted((cache / "world-s0-tiny" / "val" / "images").glob("0000[0-9][0-9].png"))
    (tmp_path / "existence" / "images").mkdir(parents=True)
    for k, name in enumerate(IMAGES):
        shutil.copyfile(sources[k], tmp_path / "existence" / name)
    i2t = [{"query": A, "keys": ["", "TA"], "label": 1},         # s = 0, 1: right
           {"query": B, "keys": ["TA", ""], "label": 0},         # s = 0, 1: wrong
           {"query": B, "keys": ["", "TB"], "label": 1},         # a tie: 1/2; argmax takes index 0, a miss
           {"query": "", "keys": ["TA"], "label": 0}]            # no image
    t2i = [{"query": "", "keys": [A, B], "label": 1},            # s = 0, 1: right
           {"query": "", "keys": [B, C], "label": 1}]            # s = 1, 0: wrong
    (tmp_path / "existence" / "image2text.json").write_text(json.dumps(i2t))
    (tmp_path / "existence" / "text2image.json").write_text(json.dumps(t2i))
    ctx = _ctx(tmp_path)
    ctx._texts[""] = torch.tensor([0.0, 1.0])
    result = spec.run(ctx, Dataset("spec", tmp_path, "spec"))
    m, p = result.metrics, "spec/spec"
    assert m[f"{p}/existence_i2t_official"] == pytest.approx(1 / 3) and m[f"{p}/existence_i2t"] == pytest.approx(0.5)
    assert m[f"{p}/existence_t2i_official"] == 0.5 and m[f"{p}/existence_t2i"] == 0.5
    assert m[f"{p}/skipped_rows"] == 1
    assert result.skipped[f"{p}/existence_i2t/rows"].startswith("1 of 4 rows skipped")
    assert "image file not found: 1" in result.skipped[f"{p}/existence_i2t/rows"]


def test_unreadable_file_and_an_absent_release(tmp_path, cache):
    released_fixture(tmp_path, cache / "world-s0-tiny" / "val")
    (tmp_path / "count" / "text2image.json").write_text('{"query": ')
    result = spec.run(_ctx(tmp_path), Dataset("spec", tmp_path, "spec"))
    assert "unreadable JSON" in result.skipped["spec/spec/count_t2i"] and "spec/spec/count_i2t" in result.metrics
    from negft.probes import PROBES
    absent = PROBES["spec"](_ctx(tmp_path), Dataset("spec", tmp_path / "none", "spec"))
    assert not absent.metrics and "absolute_size" in absent.skipped["spec/spec"]


def test_the_manifest_serves_the_probe_from_negft_data(tmp_path, cache, monkeypatch):
    from negft.evaluation import datasets_for
    released_fixture(tmp_path / "spec", cache / "world-s0-tiny" / "val")
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path))
    (ds,) = [d for d in datasets_for(None) if d.name == "spec"]
    assert ds.probes == ("spec",) and ds.root == tmp_path / "spec"
    assert spec.run(_ctx(ds.root), ds).metrics["spec/spec/count_t2i"] == 1.0


# ------------------------------------------------------------------ the world
def _true(subset: str, caption: str, objects: list[dict]) -> bool:
    """Is the world's SPEC caption true of the objects drawn?"""
    from negft.world.generator import relations
    a = objects[0]
    if subset == "absolute_size":
        return caption.split()[1] == a["size"]
    if subset == "relative_size":
        pa, pb = objects[0]["_px"], objects[1]["_px"]
        return {"larger than": pa > pb, "smaller than": pa < pb, "the same size as": pa == pb}[
            next(r for r in writer.RELATIVE_SIZE if r in caption)]
    if subset == "absolute_spatial":
        step = (64 - a["_px"]) // 2
        place = caption.split(" at the ")[1].removesuffix(" of the image")
        return writer.PLACES[place] == (a["bbox"][0] // step, a["bbox"][1] // step)
    if subset == "relative_spatial":
        for words, pred in (("to the left of", "left of"), ("to the right of", "right of"), ("above", "above"),
                            ("below", "below")):
            if f" {words} " in caption:
                objs = [{**o, "x": o["bbox"][0], "y": o["bbox"][1]} for o in objects]
                return [0, pred, 1] in relations(objs)
    if subset == "existence":
        shape = caption.split()[-1]
        return (" no " in caption) != any(o["shape"] == shape for o in objects)
    if subset == "count":
        return writer.NUMBERS.index(caption.split()[0]) + 1 == len(objects)
    raise AssertionError(subset)


def test_world_groups_each_caption_true_of_its_image_only(cache):
    root = cache / "world-s0-tiny" / "val"
    scenes = [json.loads(line)["scene"] for line in (root / "annotations.jsonl").read_text().splitlines()
              if not Path(json.loads(line)["image_path"]).name.startswith("zs_")][:writer.GROUPS]
    for subset in spec.SUBSETS:
        i2t = json.loads((root / subset / "image2text.json").read_text())
        t2i = json.loads((root / subset / "text2image.json").read_text())
        assert len(i2t) == len(t2i) >= writer.GROUPS
        for row in i2t + t2i:
            images = [row["query"]] if isinstance(row["query"], str) and row["query"].endswith(".png") else row["keys"]
            assert all((root / subset / p).is_file() for p in images)
        for scene in scenes:
            group = writer.groups(scene["objects"][0], writer._partner(scene))[subset]
            for k, (caption, _) in enumerate(group):
                assert [_true(subset, caption, objs) for _, objs in group] == [j == k for j in range(len(group))], \
                    (subset, caption)
        written = {row["query"] for row in t2i}
        assert all(c in written for scene in scenes
                   for c, _ in writer.groups(scene["objects"][0], writer._partner(scene))[subset])


class _Constant:
    """A stand-in model that gives every image and every text the same feature: every candidate ties."""
    n_boot = 20

    def encode_images(self, paths):
        return torch.ones(len(paths), 4) / 2

    def encode_texts(self, texts):
        return torch.ones(len(texts), 4) / 2


def test_world_files_parse_whole_and_a_constant_model_scores_chance_and_first_wins(cache):
    root = cache / "world-s0-tiny" / "val"
    result = spec.run(_Constant(), Dataset("world", root))
    m = result.metrics
    assert not result.skipped and "spec/world/skipped_rows" not in m
    sizes = {"absolute_size": 2, "relative_size": 3, "absolute_spatial": 9, "relative_spatial": 4, "existence": 2,
             "count": 4}
    for subset, k in sizes.items():
        for direction in ("i2t", "t2i"):
            assert m[f"spec/world/{subset}_{direction}"] == pytest.approx(1 / k)
            assert m[f"spec/world/{subset}_{direction}_official"] == pytest.approx(1 / k)   # label 0: 1 row in k
    assert m["spec/world/i2t"] == pytest.approx(sum(1 / k for k in sizes.values()) / len(sizes))


def test_the_world_writer_is_deterministic(cache, tmp_path):
    root = cache / "world-s0-tiny" / "val"
    main = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()
            if not Path(json.loads(line)["image_path"]).name.startswith("zs_")][:3]
    for out in (tmp_path / "a" / "val", tmp_path / "b" / "val"):
        out.mkdir(parents=True)
        writer.write(out, main, [], seed=0)
    files = sorted(p.relative_to(tmp_path / "a" / "val") for p in (tmp_path / "a" / "val").rglob("*") if p.is_file())
    assert len(files) == 6 * 2 + 3 * sum(len(g) for g in writer.groups(main[0]["scene"]["objects"][0],
                                                                        writer._partner(main[0]["scene"])).values())
    for f in files:
        assert (tmp_path / "a" / "val" / f).read_bytes() == (tmp_path / "b" / "val" / f).read_bytes()
