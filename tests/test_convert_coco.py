"""negft data convert coco: COCO's captions / instances layout → the control shards (original captions)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from negft.commands import cli
from negft.convert import coco
from negft.world.formats import coco as coco_example
from negft.data.pipeline import Stream, StreamSpec, loader

from conftest import read_shards

N = 24


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return coco_example.write_coco_example(tmp_path_factory.mktemp("coco"), N, seed=0)


@pytest.fixture(scope="module")
def converted(example, tmp_path_factory):
    out = tmp_path_factory.mktemp("coco_out") / "control"
    return out, coco.convert(example["captions"], example["instances"], example["images"], str(out),
                             maxcount="10", progress="false")


def test_example_is_in_cocos_layout(example):
    cap = json.loads(Path(example["captions"]).read_text())
    inst = json.loads(Path(example["instances"]).read_text())
    assert Path(example["captions"]).name == "captions_train2017.json"
    assert Path(example["images"]).name == "train2017"
    assert {"info", "licenses", "images", "annotations"} <= set(cap)
    assert {"info", "licenses", "images", "annotations", "categories"} <= set(inst)
    img = cap["images"][0]
    assert {"id", "file_name", "width", "height"} <= set(img) and img["file_name"] == f"{img['id']:012d}.jpg"
    assert set(cap["annotations"][0]) == {"id", "image_id", "caption"}
    assert {"id", "image_id", "category_id", "bbox", "area", "iscrowd", "segmentation"} <= set(inst["annotations"][0])
    assert set(inst["categories"][0]) == {"id", "name", "supercategory"}
    assert (Path(example["images"]) / img["file_name"]).read_bytes()[:3] == b"\xff\xd8\xff"     # a JPEG


def test_counts_and_skipped_rows_by_reason(example, converted):
    out, man = converted
    assert man["out"] == str(out)
    assert man["counts"]["samples"] == example["convert"]["samples"] == N - 2
    assert man["skipped"] == example["convert"]["skipped"]
    assert man["images_without_instances"] == example["convert"]["images_without_instances"]
    assert man["counts"]["shards"] == 3 and len(read_shards(out)) == N - 2
    assert "cocodataset/cocoapi" in man["layout_source"] and "coco.py" in man["layout_source"]
    assert json.loads((out / "manifest.json").read_text())["counts"] == man["counts"]


def test_samples_equal_their_source(example, converted):
    out, _ = converted
    cap = json.loads(Path(example["captions"]).read_text())
    inst = json.loads(Path(example["instances"]).read_text())
    names = {c["id"]: c["name"] for c in inst["categories"]}
    first: dict = {}
    for a in cap["annotations"]:                          # file order, empty captions skipped
        if a["caption"].strip():
            first.setdefault(a["image_id"], []).append(a["caption"])
    labels: dict = {}
    for a in inst["annotations"]:
        labels.setdefault(a["image_id"], set()).add(names[a["category_id"]])
    samples = read_shards(out)
    by_id = {i["id"]: i for i in cap["images"]}
    assert list(samples) == [Path(i["file_name"]).stem for i in cap["images"]
                             if i["id"] in first and (Path(example["images"]) / i["file_name"]).exists()]
    for key, s in samples.items():
        meta = json.loads(s["json"])
        img = by_id[meta["image_id"]]
        assert key == Path(img["file_name"]).stem
        assert s["jpg"] == (Path(example["images"]) / img["file_name"]).read_bytes()      # bytes unchanged
        assert meta["caption"] == first[img["id"]][0] and meta["captions"] == first[img["id"]]
        assert meta["objects"] == {"positive": sorted(labels.get(img["id"], ())), "negative": []}


def test_without_instances_no_objects(example, tmp_path):
    man = coco.convert(example["captions"], "", example["images"], str(tmp_path / "o"), progress="false")
    assert man["counts"]["samples"] == N - 2
    assert "objects" not in man["fields"] and man["fields"]["caption"] == N - 2
    assert coco.UNKNOWN_INSTANCE_IMAGE not in man["skipped"]


def test_shards_load_through_the_pipeline(converted, bundle):
    out, man = converted
    urls = [str(out / s) for s in man["shards"]]
    stream = Stream(StreamSpec(urls, "contrastive", "caption", batch_size=2), bundle.preprocess_val,
                    bundle.tokenizer, seed=0, shuffle_buffer=1)
    stream.set_epoch(1)
    items = list(loader(stream, workers=0))
    assert sum(x["images"].shape[0] for x in items if "images" in x) == man["counts"]["samples"]
    assert sum(int(x["skipped"]) for x in items) == 0


def test_cli(example, tmp_path, capsys):
    assert cli.main(["data", "convert", "coco", example["captions"], example["instances"], example["images"],
                     f"out={tmp_path / 'a'}", "progress=false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["samples"] == N - 2 and summary["out"] == str(tmp_path / "a")
    # instances omitted: by keyword
    assert cli.main(["data", "convert", "coco", example["captions"], "instances=", f"images={example['images']}",
                     f"out={tmp_path / 'b'}", "progress=false"]) == 0
    assert "objects" not in json.loads((tmp_path / "b" / "manifest.json").read_text())["fields"]
    # never overwrites; a missing file is an error, not a traceback
    assert cli.main(["data", "convert", "coco", example["captions"], example["instances"], example["images"],
                     f"out={tmp_path / 'a'}", "progress=false"]) == 2
    assert cli.main(["data", "convert", "coco", str(tmp_path / "nope.json"), "", example["images"],
                     f"out={tmp_path / 'c'}"]) == 2
