"""negft data convert negclip-coco: NegCLIP's train_neg_clip.tsv (its released layout, world images) → relcomp shards
→ the negclip and fscclip recipes trained on them."""
import csv
import json
from pathlib import Path

import pytest

from negft.commands import cli
from negft.convert import negclip_coco
from negft.data.pipeline import Stream, StreamSpec, loader
from negft.data.schema import MAX_NEGATIVES
from negft.world.formats import negclip_coco as example_format

from conftest import read_shards, train_on_shards

N = 24


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return example_format.write(tmp_path_factory.mktemp("negclip") / "release", N, seed=0)


@pytest.fixture(scope="module")
def converted(example, tmp_path_factory):
    out = tmp_path_factory.mktemp("negclip_out") / "negclip_coco"
    return out, negclip_coco.convert(example["tsv"], example["images"], str(out), maxcount="10", progress="false")


def _first_usable(i: int, rows: list[dict]) -> int:
    """The neighbour the converter should take, found from what was planted: the first good row of neg_image."""
    return next(j for j in rows[i]["neg_image"] if 0 <= j < N and j != i and j not in example_format.PLANTED)


def test_example_is_in_the_released_layout(example):
    text = Path(example["tsv"]).read_text()
    assert text.splitlines()[0] == "\ttitle\tfilepath\tneg_caption\tneg_image"      # pandas' unnamed index first
    rows = list(csv.reader(text.splitlines()[1:], delimiter="\t"))
    assert [r[0] for r in rows] == [str(i) for i in range(N)]
    good = rows[0]
    assert good[2] == "coco/train2014/COCO_train2014_000000000100.jpg"
    assert (Path(example["images"]) / good[2]).read_bytes()[:3] == b"\xff\xd8\xff"          # a JPEG
    assert good[3].startswith("['") and good[4].startswith("[") and len(json.loads(good[4])) == 3
    quoted = text.splitlines()[1 + example_format.QUOTED].split("\t")[3]
    assert quoted.startswith('"["') and "world\'s" in quoted        # a double-quoted text in a quoted cell
    assert {len(r["neg_caption"]) for i, r in enumerate(example["rows"]) if i in example["kept"]} == {1, 2, 3, 4, 5}


def test_counts_and_skipped_rows_by_reason(example, converted):
    out, man = converted
    assert man["counts"]["samples"] == example["convert"]["samples"] == N - len(example_format.PLANTED)
    assert man["skipped"] == example["convert"]["skipped"]
    assert set(man["skipped"]) == set(example_format.PLANTED.values())     # every reason planted once
    assert man["rows"] == N and man["rows_trimmed"] == example["convert"]["rows_trimmed"] > 0
    assert man["neighbour_position_used"] == {"0": N - len(example_format.PLANTED) - 1, "1": 1}
    assert man["counts"]["shards"] == 2 and len(read_shards(out)) == man["counts"]["samples"]
    assert "vinid/open_clip @ e680f8e" in man["layout_source"] and "train_neg_clip.tsv" in man["layout_source"]


def test_samples_equal_their_source(example, converted):
    out, _ = converted
    rows, root = example["rows"], Path(example["images"])
    samples = read_shards(out)
    assert list(samples) == [f"{i:07d}" for i in example["kept"]]
    for i in example["kept"]:
        s, row = samples[f"{i:07d}"], rows[i]
        j = _first_usable(i, rows)
        meta = json.loads(s["json"])
        assert set(s) == {"jpg", "json", "neg.jpg"}
        assert s["jpg"] == (root / row["filepath"]).read_bytes()                        # bytes unchanged
        assert s["neg.jpg"] == (root / rows[j]["filepath"]).read_bytes()
        assert meta["caption"] == row["title"]
        assert meta["relcomp"] == {
            "caption": row["title"],
            "negatives": [{"text": t, "kind": "swap"} for t in row["neg_caption"][:MAX_NEGATIVES]],
            "negative_image": "neighbour", "negative_image_caption": rows[j]["title"],
            "negative_image_negatives": rows[j]["neg_caption"]}
        assert meta["negclip"] == {"row": i, "filepath": row["filepath"], "neg_image": row["neg_image"], "neighbour": j}
    assert json.loads(samples["0000000"]["json"])["negclip"]["neighbour"] == rows[0]["neg_image"][1]   # row 1's gone


def test_shards_load_through_the_itm_stream(converted, bundle):
    out, man = converted
    stream = Stream(StreamSpec([str(out / s) for s in man["shards"]], "itm", "relcomp", batch_size=4),
                    bundle.preprocess_val, bundle.tokenizer, seed=0, shuffle_buffer=1)
    items = list(loader(stream, workers=0))
    batches = [x for x in items if "images" in x]
    assert len(batches) == man["counts"]["samples"] // 4 and sum(int(x["skipped"]) for x in items) == 0
    assert all(bool(x["has_negative_image"].all()) for x in batches)


def test_cli_prefix_and_refusals(example, tmp_path, capsys):
    assert cli.main(["data", "convert", "negclip-coco", example["tsv"], example["images"], f"out={tmp_path / 'a'}",
                     "progress=false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["samples"] == example["convert"]["samples"] and summary["out"] == str(tmp_path / "a")
    # FSC-CLIP's folders: filepath's "coco/" replaced by the image folder
    assert cli.main(["data", "convert", "negclip-coco", example["tsv"], str(Path(example["images"]) / "coco"),
                     "prefix=coco/", f"out={tmp_path / 'b'}", "progress=false"]) == 0
    assert json.loads((tmp_path / "b" / "manifest.json").read_text())["counts"] == summary["counts"]
    # never overwrites; a missing file or another header is an error, not a traceback
    assert cli.main(["data", "convert", "negclip-coco", example["tsv"], example["images"], f"out={tmp_path / 'a'}",
                     "progress=false"]) == 2
    assert cli.main(["data", "convert", "negclip-coco", str(tmp_path / "nope.tsv"), example["images"],
                     f"out={tmp_path / 'c'}"]) == 2
    (tmp_path / "other.tsv").write_text("title\tfilepath\n")
    assert cli.main(["data", "convert", "negclip-coco", str(tmp_path / "other.tsv"), example["images"],
                     f"out={tmp_path / 'd'}"]) == 2
    assert not (tmp_path / "c").exists() and not (tmp_path / "d").exists()


@pytest.mark.parametrize("recipe", ["negclip", "fscclip"])
def test_recipe_trains_on_the_shards_and_open_clip_loads_it(recipe, converted, tmp_path):
    import open_clip
    out, man = converted
    run = tmp_path / "run"
    # FSC-CLIP redraws its hard captions each epoch with spaCy on real data (its recipe); these shards carry
    # NegCLIP's own, which the recipe reads with the redraw off (spaCy is an optional extra)
    extra = ("streams.hard.redraw_negatives=none",) if recipe == "fscclip" else ()
    ledger = train_on_shards(recipe, "hard", out / man['pattern'], run, 4,
                             env={"NEGFT_CACHE": str(tmp_path / "cache")}, extra=extra)
    assert ledger[-1]["epoch"] == 1 and ledger[-1]["step"] == 2
    ckpt = run / "checkpoints" / "epoch_1"
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{ckpt}")
    tokens = open_clip.get_tokenizer(f"local-dir:{ckpt}")(["a red star to the left of a blue circle"])
    assert model.encode_text(tokens).shape[0] == 1
