"""negft data convert ccneg-train: CoN-CLIP's fine-tuning files (CC-Neg's ccneg_preprocessed.pt, its
distractor_image_mapping.pt, COCO train2017) → relcomp shards → recipe=conclip trained on them end to end."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from negft import models
from negft.commands import cli
from negft.convert import ccneg_train
from negft.probes import ccneg
from negft.world.formats import ccneg_train as example_writer

from conftest import read_shards, train_on_shards

N = 10          # fine-tuning rows: six planted bad, four samples


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return example_writer.write(tmp_path_factory.mktemp("conclip"), N, seed=0)


@pytest.fixture(scope="module")
def converted(example, tmp_path_factory):
    out = tmp_path_factory.mktemp("ccneg_out") / "ccneg_train"
    return out, ccneg_train.convert(example["pt"], example["coco_captions"], example["coco_images"], str(out),
                                    maxcount="3", progress="false")


def _released(example) -> tuple[dict, torch.Tensor, list[dict]]:
    """The three files as CoN-CLIP's loader and torchvision's CocoCaptions read them."""
    data = torch.load(example["pt"], weights_only=True)
    mapping = torch.load(example["mapping"], weights_only=True)
    images = json.loads(Path(example["coco_captions"]).read_text())["images"]
    return data, mapping, sorted(images, key=lambda img: img["id"])


def test_example_is_in_the_released_layout(example):
    data, mapping, coco = _released(example)
    assert set(data) == {"image_paths", "annotations"} and len(data["image_paths"]) == N + ccneg.EVAL_ROWS
    assert len(data["annotations"]) == len(data["image_paths"])
    assert all(p.startswith(f"{ccneg.PREFIX}{example_writer.IMAGES}/") for p in data["image_paths"])
    assert {"json", "sop_data"} == set(data["annotations"][0])
    assert {"caption", "negative-prompt"} == {*data["annotations"][0]["json"], *data["annotations"][0]["sop_data"]} \
        - {"key"}
    assert mapping.dtype == torch.int64 and tuple(mapping.shape) == (N - 1, example_writer.TOP_K)   # one row short
    assert Path(example["pt"]).name == ccneg.FILE and Path(example["mapping"]).name == ccneg_train.MAPPING
    assert Path(example["coco_captions"]).name == "captions_train2017.json" and len(coco) == example_writer.COCO_IMAGES


def test_counts_and_skipped_rows_by_reason(example, converted):
    out, man = converted
    assert man["counts"]["samples"] == example["samples"] == N - 6 and man["counts"]["shards"] == 2
    assert man["skipped"] == example["skipped"]
    assert man["rows"] == {"fine_tuning": N, "evaluation_left_out": ccneg.EVAL_ROWS}
    assert "jaisidhsingh/CoN-CLIP @ 503388a" in man["layout_source"]
    assert "finetuning_datasets.py" in man["layout_source"]
    assert json.loads((out / "manifest.json").read_text())["counts"] == man["counts"]


def test_samples_equal_their_source(example, converted):
    out, _ = converted
    data, mapping, coco = _released(example)
    root, coco_dir = Path(example["root"]), Path(example["coco_images"])
    expected = {}
    for i in range(N):          # the loader's reading of the fine-tuning rows, the unusable ones left out
        path, ann = data["image_paths"][i], data["annotations"][i]
        caption, negated = ann["json"].get("caption"), ann["sop_data"]["negative-prompt"].replace(",", "")
        image = root / path.replace(ccneg.PREFIX, "")
        top1 = int(mapping[i][0]) if i < len(mapping) else -1
        distractor = coco_dir / coco[top1]["file_name"] if 0 <= top1 < len(coco) else None
        if caption and negated.strip() and image.exists() and distractor is not None and distractor.exists():
            expected[f"ccneg{i}"] = (i, path, image, caption, negated, top1, distractor)
    samples = read_shards(out)
    assert list(samples) == list(expected) and set(expected) == {"ccneg0", "ccneg6", "ccneg7", "ccneg8"}
    for key, s in samples.items():
        i, path, image, caption, negated, top1, distractor = expected[key]
        meta = json.loads(s["json"])
        assert set(s) == {"jpg", "json", "neg.jpg"}
        assert s["jpg"] == image.read_bytes() and s["neg.jpg"] == distractor.read_bytes()      # bytes unchanged
        assert meta["caption"] == caption and "," not in negated
        assert meta["relcomp"] == {"caption": caption, "negatives": [{"text": negated, "kind": "negation"}],
                                   "negative_image": "distractor", "negative_image_caption": negated,
                                   "negative_image_negatives": []}
        assert meta["ccneg"] == {"row": i, "image": path, "distractor": {
            "index": top1, "image_id": coco[top1]["id"], "file_name": coco[top1]["file_name"]}}


def test_cli_never_overwrites_and_refuses_what_it_cannot_read(example, tmp_path, capsys):
    args = ["data", "convert", "ccneg-train", example["pt"], example["coco_captions"], example["coco_images"]]
    assert cli.main([*args, f"out={tmp_path / 'a'}", "progress=false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["samples"] == example["samples"] and summary["skipped"] == example["skipped"]
    assert cli.main([*args, f"out={tmp_path / 'a'}", "progress=false"]) == 2
    assert cli.main([*args, f"out={tmp_path / 'b'}", f"mapping={tmp_path / 'none.pt'}"]) == 2
    torch.save({"image_paths": ["a.jpg"], "annotations": [{}]}, tmp_path / ccneg.FILE)      # evaluation rows only
    assert cli.main(["data", "convert", "ccneg-train", str(tmp_path / ccneg.FILE), *args[4:],
                     f"mapping={example['mapping']}", f"out={tmp_path / 'c'}"]) == 2
    assert "no fine-tuning row" in capsys.readouterr().err
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()


def test_conclip_trains_on_the_converted_shards_end_to_end(converted, tmp_path):
    import open_clip
    out, man = converted
    run = tmp_path / "run"
    last = train_on_shards("conclip", "hard", out / man['pattern'], run, 2)[-1]
    assert last["step"] == 2 and last["data"]["hard"]["read"] == 4 and last["data"]["hard"]["skipped"] == {}
    ckpt = run / "checkpoints" / "epoch_1"
    assert models.negft_info(ckpt)["data"] == "real"
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{ckpt}")
    tokens = open_clip.get_tokenizer(f"local-dir:{ckpt}")(["a photo with no dog"])
    assert model.encode_text(tokens).shape[0] == 1
