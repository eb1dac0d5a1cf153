"""negft data convert tripletclip-data: TripletCLIP's webdataset shards (image, caption, generated negative image,
hard caption) → relcomp shards → recipe=tripletclip trained on them end to end."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from negft import models
from negft.commands import cli
from negft.convert import tripletclip_data
from negft.world.formats import tripletclip_data as example_writer

from conftest import read_shards, train_on_shards

N = 10          # samples: six planted bad, four kept; one more kept from the cut shard


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return example_writer.write(tmp_path_factory.mktemp("tripletclip"), N, seed=0, per_shard=4)


@pytest.fixture(scope="module")
def converted(example, tmp_path_factory):
    out = tmp_path_factory.mktemp("tripletclip_out") / "tripletclip_data"
    return out, tripletclip_data.convert(example["folder"], str(out), maxcount="3", progress="false")


def test_example_is_in_the_released_layout(example):
    """webdataset, as the authors' loader opens the folder, groups the example into the samples written: those
    with all four members come out of its to_tuple (the cut shard's first; none of the two planted without one)."""
    import webdataset as wds
    folder = Path(example["folder"])
    assert sorted(p.name for p in folder.iterdir()) == [f"shard-{s}.tar" for s in range(example["shards"])]
    urls = str(folder / f"shard-{{0..{example['shards'] - 1}}}.tar")
    members = ("image", "caption", "neg_image", "neg_caption")
    loaded = wds.WebDataset(urls, shardshuffle=False, handler=wds.ignore_and_continue).to_tuple(
        *members, "__key__", handler=wds.ignore_and_continue)
    whole = [key for key, m in example["written"].items() if set(m) == set(members)]
    assert [t[-1] for t in loaded] == whole and len(whole) == N - 2 + 1
    for *data, key in loaded:
        assert data == [example["written"][key][m] for m in members]


def test_counts_and_skipped_samples_by_reason(example, converted):
    out, man = converted
    assert man["counts"] == {"samples": len(example["kept"]), "shards": 2} and len(example["kept"]) == N - 6 + 1
    assert man["skipped"] == example["skipped"]
    assert man["released_shards"] == example["shards"]
    assert "tripletclip/TripletCLIP @ abbf81c" in man["layout_source"] and "data.py" in man["layout_source"]
    assert json.loads((out / "manifest.json").read_text())["counts"] == man["counts"]


def test_samples_equal_their_source(example, converted):
    out, _ = converted
    samples = read_shards(out)
    assert list(samples) == example["kept"]
    for key, s in samples.items():
        written = example["written"][key]
        caption, hard = written["caption"].decode(), written["neg_caption"].decode()
        meta = json.loads(s["json"])
        assert set(s) == {"jpg", "json", "neg.png"}
        assert s["jpg"] == written["image"] and s["neg.png"] == written["neg_image"]       # bytes unchanged
        assert meta["caption"] == caption
        assert meta["relcomp"] == {"caption": caption, "negatives": [{"text": hard, "kind": "negative"}],
                                   "negative_image": "generated", "negative_image_caption": hard,
                                   "negative_image_negatives": [caption]}
        assert meta["tripletclip"] == {"shard": example["shard_of"][key], "key": key}


def test_cli_never_overwrites_and_refuses_a_folder_without_shards(example, tmp_path, capsys):
    args = ["data", "convert", "tripletclip-data", example["folder"]]
    assert cli.main([*args, f"out={tmp_path / 'a'}", "progress=false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["samples"] == len(example["kept"]) and summary["skipped"] == example["skipped"]
    assert cli.main([*args, f"out={tmp_path / 'a'}", "progress=false"]) == 2
    (tmp_path / "empty").mkdir()
    assert cli.main(["data", "convert", "tripletclip-data", str(tmp_path / "empty"), f"out={tmp_path / 'b'}"]) == 2
    assert "shard-{0..750}.tar" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_tripletclip_trains_on_the_converted_shards_end_to_end(converted, tmp_path):
    import open_clip
    out, man = converted
    run = tmp_path / "run"
    last = train_on_shards("tripletclip", "hard", out / man['pattern'], run, 2)[-1]
    assert last["step"] == 2 and last["data"]["hard"]["read"] == 4 and last["data"]["hard"]["skipped"] == {}
    ckpt = run / "checkpoints" / "epoch_1"
    assert models.negft_info(ckpt)["data"] == "real"
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{ckpt}")
    tokens = open_clip.get_tokenizer(f"local-dir:{ckpt}")(["a picture of a red square above a blue circle"])
    assert model.encode_text(tokens).shape[0] == 1
