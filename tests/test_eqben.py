"""EqBen: the reader on a fixture in EqBen-mini's released layout (all_select.json of {image0, image1, caption0,
caption1}, images/<sub-dataset>/..., YouCook2 frames as BGR .npy), scored by a stand-in model with known scores,
tie-aware and official (EqBen's cal_wino_score: strict, a tie fails), odd rows counted; the .npy opener; the
world's files."""
import json

import numpy as np
import pytest
import torch
from PIL import Image

from negft.probes import SUITES, DEFAULT_SUITE, eqben
from negft.probes.base import Dataset, EvalContext, open_image
from negft.world.formats import eqben as writer
from conftest import RandomModel, written_twice
from tests.conftest import planted_context

X, Y = [1.0, 0.0], [0.0, 1.0]
# name -> (image0, image1, caption0, caption1, features of image0, image1, caption0, caption1)
EXAMPLES = {
    "clear": ("eqbensd/a0.jpg", "eqbensd/a1.jpg", "a0", "a1", X, Y, X, Y),
    # the two frames tie for both captions: each caption's image comparison is a tie
    "image_tie": ("eqbenyoucook2/v/b0.npy", "eqbenyoucook2/v/b1.npy", "b0", "b1", X, X, X, Y),
    # an empty caption (scored) ties the other caption on both images
    "text_tie": ("eqbengebc/c0.jpg", "eqbengebc/c1.jpg", "", "c1", X, Y, X, X),
    "constant": ("eqbenkubric_cnt/d0.jpg", "eqbenkubric_cnt/d1.jpg", "d0", "d1", X, X, X, X),
    "other_folder": ("misc/e0.jpg", "misc/e1.jpg", "e0", "e1", X, Y, X, Y),
}
ODD = [5, {"image0": "eqbensd/a0.jpg", "caption0": "x", "caption1": "y"},
       {"image0": "eqbensd/a0.jpg", "image1": "eqbensd/a1.jpg", "caption0": "x", "caption1": 3},
       {"image0": "eqbensd/a0.jpg", "image1": "eqbensd/gone.jpg", "caption0": "x", "caption1": "y"},
       {"image0": "eqbenyoucook2/float.npy", "image1": "eqbenyoucook2/v/b1.npy", "caption0": "x", "caption1": "y"},
       {"image0": "eqbenyoucook2/gray.npy", "image1": "eqbenyoucook2/v/b1.npy", "caption0": "x", "caption1": "y"}]


def released_fixture(root):
    images, texts = {}, {}
    for image0, image1, caption0, caption1, *features in EXAMPLES.values():
        for name, feature in zip((image0, image1), features[:2]):
            path = root / "images" / name
            path.parent.mkdir(parents=True, exist_ok=True)
            if name.endswith(".npy"):
                np.save(path, np.zeros((4, 4, 3), np.uint8))
            else:
                Image.new("RGB", (4, 4)).save(path)
            images[str(path)] = feature
        texts.update({caption0: features[2], caption1: features[3]})
    np.save(root / "images" / "eqbenyoucook2" / "float.npy", np.zeros((4, 4, 3), np.float32))
    np.save(root / "images" / "eqbenyoucook2" / "gray.npy", np.zeros((4, 4), np.uint8))
    rows = [{"image0": e[0], "image1": e[1], "caption0": e[2], "caption1": e[3]} for e in EXAMPLES.values()]
    (root / "all_select.json").write_text(json.dumps(rows[:2] + ODD + rows[2:]))
    return images, texts


def _ctx(images, texts) -> EvalContext:
    return planted_context(images, texts)


@pytest.fixture(scope="module")
def fixture_result(tmp_path_factory):
    root = tmp_path_factory.mktemp("eqben")
    images, texts = released_fixture(root)
    dataset = Dataset("eqben", root, "eqben")
    return eqben.run(_ctx(images, texts), dataset), eqben.texts(dataset), texts


def test_overall_scores_tie_aware_and_official(fixture_result):
    result, declared, texts = fixture_result
    m, p = result.metrics, "eqben/eqben"
    # official (strict >): only "clear" and "other_folder" pass anything, and they pass all three
    assert m[f"{p}/text_official"] == m[f"{p}/image_official"] == m[f"{p}/group_official"] == pytest.approx(2 / 5)
    # ties broken at random: two independent tied comparisons 1/4; all four equal: text, image 1/4, group 1/6
    assert m[f"{p}/text"] == pytest.approx((1 + 0 + 0.25 + 0.25 + 1) / 5)
    assert m[f"{p}/image"] == pytest.approx((1 + 0.25 + 0 + 0.25 + 1) / 5)
    assert m[f"{p}/group"] == pytest.approx((1 + 0 + 0 + 1 / 6 + 1) / 5)
    assert set(declared) == set(texts) and "" in declared


def test_scores_per_sub_dataset_by_the_first_folder(fixture_result):
    m, p = fixture_result[0].metrics, "eqben/eqben"
    assert m[f"{p}/group_eqbensd_official"] == 1.0 == m[f"{p}/group_eqbensd"]
    assert m[f"{p}/image_eqbenyoucook2"] == 0.25 and m[f"{p}/image_eqbenyoucook2_official"] == 0.0
    assert m[f"{p}/text_eqbenyoucook2"] == 0.0
    assert m[f"{p}/text_eqbengebc"] == 0.25 and m[f"{p}/text_eqbengebc_official"] == 0.0
    assert m[f"{p}/group_eqbenkubric_cnt"] == pytest.approx(1 / 6)
    assert not any("misc" in k for k in m)          # a folder EqBen does not name counts overall only


def test_odd_rows_are_counted_by_reason(fixture_result, tmp_path):
    result, p = fixture_result[0], "eqben/eqben"
    assert result.metrics[f"{p}/skipped_rows"] == 6
    msg = result.skipped[f"{p}/rows"]
    for reason in ("example is not an object: 1", "'image1' missing or not a non-empty string: 1",
                   "'caption1' missing or not a string: 1", "image file not found: 1",
                   ".npy frame not an (H, W, 3) uint8 array: 2"):
        assert reason in msg, reason
    ctx = EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=10)
    result = eqben.run(ctx, Dataset("eqben", tmp_path, "eqben"))
    assert "data not found" in result.skipped[p] and "data_manifests/eqben.yaml" in result.skipped[p]
    (tmp_path / "all_select.json").write_text("{}")
    assert "expected a JSON list" in eqben.run(ctx, Dataset("eqben", tmp_path, "eqben")).skipped[p]


def test_npy_frames_open_as_bgr_arrays(tmp_path):
    bgr = np.zeros((2, 3, 3), np.uint8)
    bgr[..., 0], bgr[..., 2] = 200, 10                       # blue 200, red 10 in BGR order
    np.save(tmp_path / "f.npy", bgr)
    image = open_image(str(tmp_path / "f.npy"))
    assert image.mode == "RGB" and image.size == (3, 2) and image.getpixel((0, 0)) == (10, 0, 200)
    assert open_image(f"{tmp_path / 'f.npy'}#crop=0,0,1,1").size == (1, 1)
    np.save(tmp_path / "g.npy", np.zeros((2, 3), np.uint8))
    with pytest.raises(ValueError, match="g.npy.*uint8"):
        open_image(str(tmp_path / "g.npy"))


def test_eqben_runs_in_composition_not_each_epoch():
    assert "eqben" in SUITES["composition"] and "eqben" not in DEFAULT_SUITE


# ------------------------------------------------------------------ the world
def test_world_pairs_in_the_released_layout(cache):
    root = cache / "world-s0-tiny" / "val"
    rows = json.loads((root / eqben.FILE).read_text())
    assert rows and all(set(r) == {"image0", "image1", "caption0", "caption1"} for r in rows)
    assert {r["image0"].split("/")[0] for r in rows} == set(eqben.SUBSETS[:min(len(rows), len(eqben.SUBSETS))])
    npy = [r for r in rows if r["image0"].startswith(writer.NPY_SUBSET)]
    assert npy and all(r["image1"].endswith(".npy") for r in npy)
    frame = open_image(str(root / "images" / npy[0]["image0"]))
    assert frame.mode == "RGB" and frame.size == (np.load(root / "images" / npy[0]["image0"]).shape[1],) * 2
    assert all(r["caption0"] != r["caption1"] for r in rows)
    result = eqben.run(RandomModel(), Dataset("world", root))
    assert not result.skipped, result.skipped
    assert {f"eqben/world/{m}{s}" for m in ("text", "image", "group") for s in ("", "_official")} <= \
        set(result.metrics)



def test_the_world_writer_is_deterministic(cache, tmp_path):
    root = cache / "world-s0-tiny" / "val"
    a, b = written_twice(root, tmp_path, writer, records_limit=250, ignore=eqben.SUBSETS)
    assert (a / writer.FILE).read_bytes() == (b / writer.FILE).read_bytes() == (root / writer.FILE).read_bytes()