"""ImageCoDe: the reader on a fixture in the released layout (McGill-NLP/imagecode: valid_data.json of {set: {image
index: description}}, image-sets/<set>/img<N>.jpg with video frame numbers), scored by a stand-in model with known
scores, tie-aware and official (the first of tied images), odd rows counted; and the world's files."""
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from negft.probes import imagecode
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import imagecode as writer
from conftest import RandomModel, written_twice
from tests.conftest import planted_context

VIDEO, STATIC = "MSR-VTT-videoTrainValVideo_video7-shot1_0", "open-images-3_0a1b2c3d"
FRAMES = {VIDEO: (0, 3, 7, 12, 100), STATIC: (0, 1, 2, 3)}     # "img100" sorts before "img12" as text
HIGH, LOW = [1.0, 0.0], [0.0, 1.0]                             # image features against the description [1, 0]
# set -> image features in frame order; descriptions: index -> (text, negft's credit, the reference's hit)
SETS = {VIDEO: [LOW, HIGH, LOW, LOW, HIGH], STATIC: [HIGH, LOW, LOW, LOW]}
DESCRIBED = {VIDEO: {"1": ("frame 3 and frame 100 tie", 0.5, 1.0), "2": ("a miss", 0.0, 0.0)},
             STATIC: {"0": ("a hit", 1.0, 1.0), "3": ("", 0.0, 0.0)}}        # an empty description is scored
ODD = {"open-images-9_ffffffff": {"0": "no such folder"}, VIDEO: {"5": "past the set", "x": "not a number"},
       STATIC: {"1": 7}}


def released_fixture(root: Path, world_split: Path) -> tuple[list[str], dict]:
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    images, k = [], 0
    for folder, frames in FRAMES.items():
        (root / "image-sets" / folder).mkdir(parents=True)
        for n, feature in zip(frames, SETS[folder]):
            path = root / "image-sets" / folder / f"img{n}.jpg"
            Image.open(sources[k]).convert("RGB").save(path)
            k += 1
            images.append((str(path), feature))
    data = {folder: {i: text for i, (text, _, _) in d.items()} for folder, d in DESCRIBED.items()}
    for folder, d in ODD.items():
        data.setdefault(folder, {}).update(d)
    (root / "valid_data.json").write_text(json.dumps(data))
    return images, {text: [1.0, 0.0] for d in DESCRIBED.values() for text, _, _ in d.values()}


def _ctx(images, features) -> EvalContext:
    return planted_context(dict(images), features)


@pytest.fixture(scope="module")
def fixture_result(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("imagecode")
    images, features = released_fixture(root, cache / "world-s0-tiny" / "val")
    dataset = Dataset("imagecode", root, "imagecode")
    return root, imagecode.run(_ctx(images, features), dataset), imagecode.texts(dataset), features


def test_known_scores_tie_aware_and_official(fixture_result):
    _, result, declared, features = fixture_result
    m, p = result.metrics, "imagecode/imagecode"
    # the tie between frames 3 and 100 is shared by negft; the first of them (frame 3, described) wins officially
    assert m[f"{p}/videos"] == 0.25 and m[f"{p}/videos_official"] == 0.5
    assert m[f"{p}/static"] == 0.5 == m[f"{p}/static_official"]
    assert m[f"{p}/acc"] == pytest.approx(1.5 / 4) and m[f"{p}/acc_official"] == 0.5
    scores = {(r["set"], r["target"]): r["scores"] for r in result.records[p]}[VIDEO, 1]
    assert scores[1] == scores[4] == max(scores)
    assert set(declared) == set(features)


def test_the_official_rule_breaks_a_tie_by_frame_number_not_by_name(fixture_result):
    """img100 is the fifth image (frames 0, 3, 7, 12, 100), not the second as text order would have it."""
    assert [Path(p).name for p in imagecode.set_images(str(fixture_result[0] / "image-sets" / VIDEO))] == \
        ["img0.jpg", "img3.jpg", "img7.jpg", "img12.jpg", "img100.jpg"]


def test_odd_rows_are_counted_by_reason(fixture_result, tmp_path):
    root, result, _, _ = fixture_result
    p = "imagecode/imagecode"
    assert result.metrics[f"{p}/skipped_rows"] == 4
    msg = result.skipped[f"{p}/rows"]
    for reason in ("set folder absent or without img<N>.jpg files: 1", "description is not a string: 1",
                   "image index not an integer naming an image of the set: 2"):
        assert reason in msg, reason
    ctx = EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=10)
    result = imagecode.run(ctx, Dataset("imagecode", tmp_path, "imagecode"))
    assert "data not found" in result.skipped[p] and "data_manifests/imagecode.yaml" in result.skipped[p]
    (tmp_path / "valid_data.json").write_text("[1, 2]")
    assert "expected a JSON object" in imagecode.run(ctx, Dataset("imagecode", tmp_path, "imagecode")).skipped[p]


# ------------------------------------------------------------------ the world
def test_world_descriptions_are_true_of_their_image_only(cache):
    root = cache / "world-s0-tiny" / "val"
    records = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()
               if "zs_" not in line]
    data = json.loads((root / "valid_data.json").read_text())
    assert any("open-images" in k for k in data) and any("open-images" not in k for k in data)
    for folder, described in data.items():
        k = next(i for i in range(len(records)) if writer.folder_name(i) == folder)
        scenes = [r["scene"] for r in records[k * writer.SET_SIZE:(k + 1) * writer.SET_SIZE]]
        assert len(imagecode.set_images(str(root / "image-sets" / folder))) == writer.SET_SIZE
        for index, text in described.items():
            assert [writer.true_of(s, text) for s in scenes] == [i == int(index) for i in range(len(scenes))]
    result = imagecode.run(RandomModel(), Dataset("world", root))
    assert not result.skipped, result.skipped
    assert {f"imagecode/world/{m}" for m in ("videos", "static", "acc")} <= set(result.metrics)



def test_the_world_writer_is_deterministic(cache, tmp_path):
    root = cache / "world-s0-tiny" / "val"
    a, b = written_twice(root, tmp_path, writer)
    assert (a / writer.FILE).read_bytes() == (b / writer.FILE).read_bytes() == (root / writer.FILE).read_bytes()