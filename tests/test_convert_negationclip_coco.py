"""negft data convert negationclip-coco: NegationCLIP's rewritten COCO captions → NegCap shards, and the negationclip
recipe trained on them end to end."""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from negft.commands import cli
from negft.convert import negationclip_coco as nc
from negft.world.formats.negationclip_coco import write_negationclip_example

from conftest import read_shards, train_on_shards

N = 12


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return write_negationclip_example(tmp_path_factory.mktemp("negationclip"), N, seed=0)


@pytest.fixture(scope="module")
def release(example):
    return json.loads(Path(example["captions"]).read_text())


@pytest.fixture(scope="module")
def converted(example, tmp_path_factory):
    out = tmp_path_factory.mktemp("negationclip_out") / "negationclip_coco"
    return out, nc.convert(example["captions"], example["images"], str(out), maxcount="4", progress="false")


def _reference_validation_rows(n: int) -> set[int]:
    """clip_finetune.py's own steps: the global generator seeded, a Python list shuffled in place."""
    state = np.random.get_state()
    try:
        np.random.seed(42)
        indices = list(range(n))
        np.random.shuffle(indices)
    finally:
        np.random.set_state(state)
    return set(indices[:int(np.floor(0.2 * n))])


def test_example_is_in_the_released_layout(example, release):
    path = Path(example["captions"])
    assert path.parent.name == "annotations" and path.name == "negationclip_captions_train2014.json"
    assert path.read_text().startswith('{\n    "info"')                     # json.dump(..., indent=4)
    assert list(release) == ["info", "licenses", "images", "annotations"]
    img = release["images"][0]
    assert {"id", "file_name", "width", "height", "coco_url"} <= set(img)
    assert img["file_name"] == f"COCO_train2014_{img['id']:012d}.jpg" and Path(example["images"]).name == "train2014"
    assert (Path(example["images"]) / img["file_name"]).read_bytes()[:3] == b"\xff\xd8\xff"      # a JPEG
    assert list(release["annotations"][0])[:3] == ["image_id", "id", "caption"]
    assert sum(set(a) == {"image_id", "id", "caption", "updated_caption"} for a in release["annotations"]) \
        == len(release["annotations"]) - 1                                    # one planted without the rewrite
    assert len(example["rows"]) == len(release["annotations"])


def test_validation_rows_are_the_references():
    assert nc.validation_rows(10, 0.2) == {8, 1}
    for n in (1, 5, 37, 1000):
        assert nc.validation_rows(n, 0.2) == _reference_validation_rows(n)
    assert nc.validation_rows(1000, 0.0) == set()


def test_counts_and_skipped_rows_by_reason(example, converted):
    out, man = converted
    left_out = nc.validation_rows(len(example["rows"]), 0.2)
    kept = [reason for row, reason in enumerate(example["rows"]) if row not in left_out]
    assert man["counts"]["samples"] == kept.count(None) and len(read_shards(out)) == kept.count(None)
    assert man["skipped"] == dict(Counter(r for r in kept if r))
    assert man["validation_rows"] == len(left_out) == math.floor(0.2 * len(example["rows"]))
    assert man["annotations"] == len(example["rows"]) and man["images_listed"] == N
    assert man["counts"]["shards"] == math.ceil(kept.count(None) / 4)
    assert "parkquasar/NegationCLIP @ 6f858ee" in man["layout_source"]
    assert man["fields"] == {"annotation": kept.count(None), "caption": kept.count(None), "image_id": kept.count(None),
                             "negcap": kept.count(None)}


def test_samples_equal_their_source(example, release, converted):
    out, _ = converted
    names = {i["id"]: i["file_name"] for i in release["images"]}
    left_out = nc.validation_rows(len(example["rows"]), 0.2)
    rows = [row for row, reason in enumerate(example["rows"]) if reason is None and row not in left_out]
    samples = read_shards(out)
    assert list(samples) == [f"{Path(names[release['annotations'][r]['image_id']]).stem}_{r}" for r in rows]
    for row, s in zip(rows, samples.values()):
        ann = release["annotations"][row]
        assert s["jpg"] == (Path(example["images"]) / names[ann["image_id"]]).read_bytes()     # bytes unchanged
        assert json.loads(s["json"]) == {"caption": ann["caption"], "negcap": [ann["updated_caption"]],
                                         "image_id": ann["image_id"], "annotation": {"row": row, "id": ann["id"]}}


def test_val_split_0_converts_every_row(example, tmp_path):
    man = nc.convert(example["captions"], example["images"], str(tmp_path / "all"), val_split="0", progress="false")
    assert man["counts"]["samples"] == example["rows"].count(None) and man["validation_rows"] == 0
    assert man["skipped"] == dict(Counter(r for r in example["rows"] if r))
    with pytest.raises(ValueError, match="val_split"):
        nc.convert(example["captions"], example["images"], str(tmp_path / "bad"), val_split="1")


def test_cli(example, tmp_path, capsys):
    assert cli.main(["data", "convert", "negationclip-coco", example["captions"], example["images"],
                     f"out={tmp_path / 'a'}", "progress=false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["out"] == str(tmp_path / "a") and summary["counts"]["samples"] > 0
    # never overwrites; a missing file or a file of another layout is an error, not a traceback
    assert cli.main(["data", "convert", "negationclip-coco", example["captions"], example["images"],
                     f"out={tmp_path / 'a'}", "progress=false"]) == 2
    assert cli.main(["data", "convert", "negationclip-coco", str(tmp_path / "nope.json"), example["images"],
                     f"out={tmp_path / 'b'}"]) == 2
    (tmp_path / "list.json").write_text("[]")
    assert cli.main(["data", "convert", "negationclip-coco", str(tmp_path / "list.json"), example["images"],
                     f"out={tmp_path / 'c'}"]) == 2
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_negationclip_recipe_trains_on_the_shards(converted, tmp_path):
    """recipe=negationclip, data=real, its stream on the converted shards: 2 steps, then the checkpoint in plain
    open_clip."""
    import open_clip
    import torch
    out, man = converted
    run = tmp_path / "run"
    ledger = train_on_shards("negationclip", "negcap", out / man['pattern'], run, 4)
    assert ledger[-1]["epoch"] == 1 and ledger[-1]["step"] == 2
    ckpt = run / "checkpoints" / "epoch_1"
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{ckpt}")
    tokens = open_clip.get_tokenizer(f"local-dir:{ckpt}")(["a photo with no dog"])
    with torch.no_grad():
        assert model.encode_text(tokens).shape[0] == 1
