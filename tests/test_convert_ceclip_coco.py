"""negft data convert ceclip-coco: CE-CLIP's generated COCO data (processed_dataset<i>.npy, typed hard captions) +
train2014 → relcomp shards → recipe=ceclip trained on them end to end."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from negft import models
from negft.commands import cli
from negft.convert import ceclip_coco
from negft.data.schema import CECLIP_TYPES
from negft.losses import ceclip_slots
from negft.world.formats import ceclip_coco as example_writer

from conftest import read_shards, train_on_shards

N = 12          # rows over two files: six planted bad, six samples
KEYS = ["image_id", "id", "caption", "relation_aug_caption", "adj_aug_caption", "noun_aug_caption",
        "verb_aug_caption", "valid_caption"]


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return example_writer.write(tmp_path_factory.mktemp("ceclip"), N, seed=0)


@pytest.fixture(scope="module")
def converted(example, tmp_path_factory):
    out = tmp_path_factory.mktemp("ceclip_out") / "ceclip_coco"
    return out, ceclip_coco.convert(example["npy"], example["images"], str(out), maxcount="4", progress="false")


def _released(example) -> list[tuple[str, list]]:
    """(file name, rows) as CE-CLIP's NpyDataset reads them: np.load(allow_pickle=True).tolist() of each file."""
    files = sorted(Path(example["npy"]).glob("*.npy"))
    return [(f.name, np.load(f, allow_pickle=True).tolist()) for f in files]


def test_example_is_in_the_released_layout(example):
    released = _released(example)
    assert [name for name, _ in released] == ["processed_dataset0.npy", "processed_dataset1.npy"]
    assert Path(example["npy"]).parts[-2:] == ("generated_data", "coco_train")
    rows = [r for _, rs in released for r in rs]
    assert len(rows) == N and rows == [r for rs in example["files"].values() for r in rs]
    full = [r for r in rows if isinstance(r, dict) and len(r) == len(KEYS)]
    assert len(full) >= N - 3 and all(list(r) == KEYS for r in full)        # dataset.py's key order
    for r in full:
        mask = [int(r[k] != "###") for k in KEYS if "caption" in k and k != "valid_caption"]
        assert r["valid_caption"] == mask and len(mask) == 5
    assert rows[0]["relation_aug_caption"] == "###" and rows[0]["valid_caption"] == [1, 0, 1, 1, 1]
    image = Path(example["images"]) / "train2014" / f"COCO_train2014_{rows[0]['image_id']:012d}.jpg"
    assert image.is_file() and image.read_bytes()[:2] == b"\xff\xd8"


def test_counts_skipped_rows_and_left_out_captions(example, converted):
    out, man = converted
    assert man["counts"]["samples"] == example["samples"] == N - 6 and man["counts"]["shards"] == 2
    assert man["skipped"] == example["skipped"] and len(example["skipped"]) == 6
    assert man["left_out"] == example["left_out"]
    assert man["rows"] == {name: len(rows) for name, rows in example["files"].items()}
    assert "lezhang7/Enhance-FineGrained @ ef87eb7" in man["layout_source"] and "0ff8cbf" in man["layout_source"]
    assert json.loads((out / "manifest.json").read_text())["counts"] == man["counts"]


def test_samples_equal_their_source(example, converted):
    out, _ = converted
    expected = {}
    for name, rows in _released(example):          # the loader's reading, the unusable rows left out
        for i, r in enumerate(rows):
            image = Path(example["images"]) / "train2014" / f"COCO_train2014_{r['image_id']:012d}.jpg" \
                if isinstance(r, dict) and isinstance(r.get("image_id"), int) else None
            if image is None or not r["caption"] or not image.exists() or "noun_aug_caption" not in r:
                continue
            texts = [r[k] for k in KEYS[3:7]]       # relation, adjective, noun, verb: the collate's order
            negatives = [{"text": t, "kind": kind} for t, kind in zip(texts, CECLIP_TYPES)
                         if t.strip() and t != "###" and t != r["caption"]]
            if negatives:
                expected[f"{name[:-4]}_{i:06d}"] = (name, i, r, image, negatives)
    samples = read_shards(out)
    assert list(samples) == list(expected) and len(expected) == N - 6
    for key, s in samples.items():
        name, i, r, image, negatives = expected[key]
        meta = json.loads(s["json"])
        assert set(s) == {"jpg", "json"} and s["jpg"] == image.read_bytes()          # bytes unchanged
        assert meta["caption"] == r["caption"]
        assert meta["relcomp"] == {"caption": r["caption"], "negatives": negatives, "negative_image": None}
        assert meta["ceclip"] == {"file": name, "row": i, "id": r["id"], "image_id": r["image_id"]}
    noun_missing = json.loads(samples["processed_dataset1_000001"]["json"])      # row 7: its noun a ###
    assert [n["kind"] for n in noun_missing["relcomp"]["negatives"]] == ["relation", "adjective", "verb"]
    assert ceclip_slots([noun_missing]).tolist() == [[0, 1, 3, 2]]    # the verb in its own slot, the noun padding


class _Code:
    def __reduce__(self):
        return os.system, ("touch ran",)


def test_a_file_whose_pickle_holds_code_is_refused_unrun(example, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "coco_train"
    folder.mkdir()
    rows = example["files"]["processed_dataset0.npy"]
    with open(folder / "processed_dataset0.npy", "wb") as f:
        np.save(f, [*rows, _Code()])
    assert cli.main(["data", "convert", "ceclip-coco", str(folder), example["images"], f"out={tmp_path / 'a'}"]) == 2
    assert "global posix.system refused" in capsys.readouterr().err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "a").exists()


def test_cli_never_overwrites_and_needs_its_inputs(example, tmp_path, capsys):
    args = ["data", "convert", "ceclip-coco", example["npy"], example["images"]]
    assert cli.main([*args, f"out={tmp_path / 'a'}", "progress=false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["samples"] == example["samples"] and summary["skipped"] == example["skipped"]
    assert cli.main([*args, f"out={tmp_path / 'a'}", "progress=false"]) == 2
    one = Path(example["npy"]) / "processed_dataset1.npy"          # one file of the folder, as the loader allows
    assert cli.main([*args[:3], str(one), example["images"], f"out={tmp_path / 'b'}", "progress=false"]) == 0
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["rows"] == {one.name: N // 2}
    assert cli.main([*args[:3], str(tmp_path), example["images"], f"out={tmp_path / 'c'}"]) == 2   # no .npy
    assert not (tmp_path / "c").exists()


def test_ceclip_trains_on_the_converted_shards_end_to_end(converted, tmp_path):
    import open_clip
    out, man = converted
    run = tmp_path / "run"
    last = train_on_shards("ceclip", "hard", out / man['pattern'], run, 3)[-1]
    assert last["step"] == 2 and last["data"]["hard"]["read"] == 6 and last["data"]["hard"]["skipped"] == {}
    ckpt = run / "checkpoints" / "epoch_1"
    assert models.negft_info(ckpt)["data"] == "real"
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{ckpt}")
    tokens = open_clip.get_tokenizer(f"local-dir:{ckpt}")(["a red heart left of a blue star"])
    assert model.encode_text(tokens).shape[0] == 1
