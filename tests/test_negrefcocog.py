"""NegRefCOCOg: the reader on a fixture in the released layout (parkquasar/NegationCLIP NegRefCOCOg.json + COCO
train2014 images), scored by a stand-in model with known crop scores, tie-aware and official; and the world's file."""
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from negft.probes import negrefcocog
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import negrefcocog as writer
from tests.conftest import planted_context

HIT, MISS, EVEN = [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]       # crop features against the phrase feature [1, 0]
A, B, C = [2, 3, 20, 10], [30, 30, 14.5, 14.5], [40, 2, 10, 10]
# (bbox_list, ref_bbox, features of the boxes' crops) -> (negft's credit or None when left out, official)
ROWS = [([A, B], A, [HIT, MISS], 1.0, 1.0),
        ([A, B], A, [MISS, HIT], 0.0, 0.0),
        ([A, B], A, [EVEN, EVEN], 0.5, 1.0),        # a tie: the reference takes the first box, the right one
        ([B, A], A, [EVEN, EVEN], 0.5, 0.0),        # a tie with the right box second
        ([A, A], A, [HIT, HIT], 1.0, 1.0),          # the right box listed twice: either pick is right
        ([B, C], A, [HIT, MISS], None, 0.0),        # the right box not listed: out of acc, wrong in acc_official
        ([B, A], B, [HIT, EVEN], 1.0, 1.0),         # these two with the phrase "", which the reference tokenizes
        ([A, B], B, [EVEN, EVEN], 0.5, 0.0)]        # and scores: a tie, the first box is the wrong one
EMPTY = {6, 7}                                      # rows whose phrase is ""
ODD = [["not", "an", "object"],
       {"image": "COCO_train2014_000000000001.jpg", "phrase": None, "ref_bbox": A, "bbox_list": [A]},
       {"image": "COCO_train2014_000000000001.jpg", "phrase": "a cat", "ref_bbox": A, "bbox_list": [[1, 2, 3]]},
       {"image": "COCO_train2014_000000000001.jpg", "phrase": "a cat", "ref_bbox": A, "bbox_list": [A, [1, 1, 0, 4]]},
       {"image": "COCO_train2014_000000000001.jpg", "phrase": "a cat", "ref_bbox": A, "bbox_list": []},
       {"image": "COCO_train2014_000000999999.jpg", "phrase": "a cat", "ref_bbox": A, "bbox_list": [A, B]}]


def released_fixture(root: Path, world_split: Path) -> tuple[dict, dict]:
    """NegRefCOCOg.json (indented by 4, as released) in ``root`` and COCO-named JPEGs made from world images in
    ``root/train2014``; returns (crop key -> feature, phrase -> feature)."""
    (root / "train2014").mkdir(parents=True)
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    crops, phrases, rows = {}, {}, []
    for k, (boxes, ref, features, _, _) in enumerate(ROWS):
        name = f"COCO_train2014_{1 + 7 * k:012d}.jpg"
        Image.open(sources[k]).convert("RGB").save(root / "train2014" / name)
        for box, feature in zip(boxes, features):
            crops[negrefcocog.crop(str(root / "train2014" / name), box)] = feature
        phrase = "" if k in EMPTY else f"the shape that is not red, number {k}"
        phrases[phrase] = HIT
        rows.append({"image": name, "phrase": phrase, "ref_bbox": ref, "bbox_list": boxes})
    (root / negrefcocog.FILE).write_text(json.dumps(rows + ODD, indent=4))
    return crops, phrases


def _ctx(crops, phrases) -> EvalContext:
    return planted_context(crops, phrases)


@pytest.fixture(scope="module")
def fixture_run(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("negrefcocog")
    crops, phrases = released_fixture(root, cache / "world-s0-tiny" / "val")
    dataset = Dataset("negrefcocog", root, "negrefcocog")          # the manifest's images: train2014
    return root, negrefcocog.run(_ctx(crops, phrases), dataset), set(negrefcocog.texts(dataset)), set(phrases)


def test_known_scores_tie_aware_and_official(fixture_run):
    root, result, declared, phrases = fixture_run
    m, p = result.metrics, "negrefcocog/negrefcocog"
    credits = [r[3] for r in ROWS if r[3] is not None]
    assert m[f"{p}/acc"] == pytest.approx(sum(credits) / len(credits)) == pytest.approx(4.5 / 7)
    # the two rows with an empty phrase count (1 and 0), as in the reference; skipped they would leave 3 / 6
    assert m[f"{p}/acc_official"] == pytest.approx(sum(r[4] for r in ROWS) / len(ROWS)) == pytest.approx(4 / 8)
    assert result.skipped[f"{p}/acc"].startswith("1 of 8 rows left out of acc")
    assert [r["phrase"] for r in result.records[p]][6:] == ["", ""]
    assert [r["right"] for r in result.records[p]][4] == [True, True]
    assert declared == phrases


def test_odd_rows_are_counted_by_reason(fixture_run):
    root, result, _, _ = fixture_run
    m, p = result.metrics, "negrefcocog/negrefcocog"
    assert m[f"{p}/skipped_rows"] == len(ODD)
    msg = result.skipped[f"{p}/rows"]
    assert msg.startswith(f"6 of 14 rows skipped in {root / negrefcocog.FILE}")
    for reason in ("row is not an object: 1", "'phrase' missing or not a string: 1",
                   "a box is not [x, y, w, h] of finite numbers with an area: 2", "'bbox_list' missing or empty: 1",
                   "image file not found: 1"):
        assert reason in msg, reason


def test_absent_and_unreadable_files_skip_with_the_reason(tmp_path):
    from negft import probes
    absent = probes.PROBES["negrefcocog"](_ctx({}, {}), Dataset("negrefcocog", tmp_path, "negrefcocog"))
    msg = absent.skipped["negrefcocog/negrefcocog"]
    assert f"{tmp_path / negrefcocog.FILE}" in msg and "data_manifests/negrefcocog.yaml" in msg
    (tmp_path / negrefcocog.FILE).write_text('[{"image": ')
    broken = negrefcocog.run(_ctx({}, {}), Dataset("negrefcocog", tmp_path, "negrefcocog"))
    assert "unreadable JSON" in broken.skipped["negrefcocog/negrefcocog"] and not broken.metrics


def _holds(obj: dict, phrase: str) -> bool:
    """Is 'a shape that is not <value>' true of the object?"""
    value = phrase.removeprefix("a shape that is not ")
    return value not in (obj["color"], obj["size"], obj["fill"])


def test_world_file_parses_whole_and_each_phrase_is_true_of_its_box_only(cache, tmp_path):
    root = cache / "world-s0-tiny" / "val"
    scenes = {json.loads(line)["image_path"]: json.loads(line)["scene"]
              for line in (root / "annotations.jsonl").read_text().splitlines()}
    rows = json.loads((root / writer.FILE).read_text())
    assert len(rows) > 10
    for row in rows:
        objects = scenes[row["image"]]["objects"]
        assert row["bbox_list"][0] == row["ref_bbox"] and len(row["bbox_list"]) == len(objects) > 1
        true_of = [writer.xywh(o) for o in objects if _holds(o, row["phrase"])]
        assert true_of == [row["ref_bbox"]], row
    result = negrefcocog.run(_ConstantModel(), Dataset("world", root))
    assert not result.skipped and "negrefcocog/world/skipped_rows" not in result.metrics
    # every crop scores the same: ties shared among the boxes, the reference's argmax takes the first, the right one
    assert result.metrics["negrefcocog/world/acc_official"] == 1.0
    assert result.metrics["negrefcocog/world/acc"] == pytest.approx(sum(1 / len(r["bbox_list"]) for r in rows)
                                                                    / len(rows))


class _ConstantModel:
    n_boot = 20

    def encode_images(self, keys):
        return torch.ones(len(keys), 4) / 2

    def encode_texts(self, texts):
        return torch.ones(len(texts), 4) / 2


def test_the_world_writer_is_deterministic(cache, tmp_path):
    root = cache / "world-s0-tiny" / "val"
    records = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()
               if "zs_" not in line]
    for out in (tmp_path / "a", tmp_path / "b"):
        (out / "val").mkdir(parents=True)
        writer.write(out / "val", records, [], seed=0)
        assert (out / "val" / writer.FILE).read_bytes() == (root / writer.FILE).read_bytes()
