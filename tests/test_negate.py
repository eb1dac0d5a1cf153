"""negft data negate: NegCap + NegMCQ built offline from captions and object labels (NegBench's recipe)."""
from __future__ import annotations

import csv
import hashlib
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from negft.commands import cli
from negft import phrasings
from negft.convert.negate import Cooccurrence, affirmative_part, negate, parse_objects
from negft.data.pipeline import Stream, StreamSpec, loader
from negft.text import has_negation
from negft.world.formats import coco as coco_example

from conftest import read_shards

N = 60
VAL_FRACTION = "0.3"


def read_samples(folder: Path) -> list[tuple[str, dict, dict]]:
    """(key, json, {ext: bytes}) for every sample of a shard folder, in shard order."""
    return [(k, json.loads(v["json"]), v) for k, v in read_shards(folder).items()]


def shard_digests(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.glob("*/shard-*.tar"))}


def texts(meta: dict) -> list[str]:
    return [*meta["negcap"], *meta["mcq"]["options"]]


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    return coco_example.write_coco_example(tmp_path_factory.mktemp("coco"), N, seed=0)


@pytest.fixture(scope="module")
def labels(example):
    """image_id -> set of category names, straight from the instances file."""
    inst = json.loads(Path(example["instances"]).read_text())
    names = {c["id"]: c["name"] for c in inst["categories"]}
    out: dict = {}
    for a in inst["annotations"]:
        out.setdefault(a["image_id"], set()).add(names[a["category_id"]])
    return out


def _negate(example, out, seed="0", **kw):
    return negate(example["captions"], example["images"], str(out), labels=example["instances"], seed=seed,
                  val_fraction=VAL_FRACTION, progress="false", maxcount="16", **kw)


@pytest.fixture(scope="module")
def built(example, tmp_path_factory):
    out = tmp_path_factory.mktemp("neg") / "negfull"
    return out, _negate(example, out)


def test_counts_splits_and_skipped_rows(example, built):
    out, man = built
    assert man["out"] == str(out)
    assert man["counts"]["samples"] == example["negate"]["samples"] == N - 3
    assert man["counts"]["train"] + man["counts"]["val"] == N - 3
    assert 0 < man["counts"]["val"] < man["counts"]["train"]
    assert man["skipped"] == example["negate"]["skipped"]
    for split in ("train", "val"):
        written = json.loads((out / split / "manifest.json").read_text())
        assert written["counts"]["samples"] == man["counts"][split] == len(read_samples(out / split))
        assert written["split"] == split and written["format"] == "negate"
        assert "cocodataset/cocoapi" in written["layout_source"]


def test_negated_objects_are_absent_and_captions_name_them(built, labels):
    out, _ = built
    for split in ("train", "val"):
        for key, meta, _ in read_samples(out / split):
            present = labels[meta["image_id"]]
            assert sorted(present) == meta["objects"]["positive"]
            negative = meta["objects"]["negative"]
            assert len(negative) == len(set(negative)) == 3 and not set(negative) & present
            assert len(meta["negcap"]) == 3
            for text, obj in zip(meta["negcap"], negative):
                assert obj in text and has_negation(text)
            assert meta["caption"] == meta["captions"][0]


def test_every_mcq_has_exactly_one_true_option(built, labels):
    out, _ = built
    seen = Counter()
    for split in ("train", "val"):
        for key, meta, _ in read_samples(out / split):
            present, mcq = labels[meta["image_id"]], meta["mcq"]
            assert len(mcq["options"]) == 4 and len(set(mcq["options"])) == 4
            truth = []
            for kind, (aff, neg) in zip(mcq["option_templates"], mcq["option_objects"]):
                assert (aff is not None) == (kind in ("positive", "hybrid"))
                assert (neg is not None) == (kind in ("negative", "hybrid"))
                truth.append((aff is None or aff in present) and (neg is None or neg not in present))
            assert truth.count(True) == 1 and truth.index(True) == mcq["answer"]
            assert mcq["option_templates"][mcq["answer"]] == mcq["answer_template"]
            seen[mcq["answer_template"]] += 1
    assert set(seen) == {"positive", "negative", "hybrid"}
    assert len({m["mcq"]["answer"] for _, m, _ in read_samples(out / "train")}) > 1     # options shuffled


def test_held_out_phrasings_only_in_val(built):
    out, _ = built
    neg_markers, mcq_markers = phrasings.HELD_OUT_MARKERS["negate"], phrasings.HELD_OUT_MARKERS["mcq"]
    markers = neg_markers + mcq_markers
    for _, meta, _ in read_samples(out / "train"):
        assert not any(m in t for t in texts(meta) for m in markers)
    for _, meta, _ in read_samples(out / "val"):
        assert all(any(m in t for m in neg_markers) for t in meta["negcap"])
        assert all(any(m in t for m in mcq_markers) for t in meta["mcq"]["options"])


def test_same_seed_same_bytes_other_seed_other_bytes(example, built, tmp_path):
    out, _ = built
    again = tmp_path / "again"
    _negate(example, again)
    assert shard_digests(again) == shard_digests(out) and shard_digests(out)
    other = tmp_path / "other"
    _negate(example, other, seed="1")
    assert shard_digests(other) != shard_digests(out)
    a = {k: m for k, m, _ in read_samples(out / "train")}
    b = {k: m for k, m, _ in read_samples(other / "train")}
    common = set(a) & set(b)
    assert common and any(a[k]["negcap"] != b[k]["negcap"] for k in common)


def test_images_are_copied_unchanged(example, built):
    out, _ = built
    cap = json.loads(Path(example["captions"]).read_text())
    files = {i["id"]: i["file_name"] for i in cap["images"]}
    for _, meta, members in read_samples(out / "train")[:10]:
        assert members["jpg"] == (Path(example["images"]) / files[meta["image_id"]]).read_bytes()


@pytest.mark.parametrize("task,field", [("contrastive", "caption"), ("contrastive", "negcap"), ("mcq", "mcq")])
def test_shards_load_through_the_pipeline(built, bundle, task, field):
    out, man = built
    urls = [str(out / "train" / s) for s in man["train"]["shards"]]
    stream = Stream(StreamSpec(urls, task, field, batch_size=4), bundle.preprocess_val, bundle.tokenizer,
                    seed=0, shuffle_buffer=1)
    stream.set_epoch(1)
    items = list(loader(stream, workers=0))
    assert sum(x["images"].shape[0] for x in items if "images" in x) == man["counts"]["train"] // 4 * 4
    assert sum(int(x["skipped"]) for x in items) == 0
    if task == "mcq":
        assert items[0]["options"].shape[:2] == (4, 4)


# ------------------------------------------------------------------ CSV input and the co-occurrence model
def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (200, 30, 30)).save(buf, format="PNG")
    return buf.getvalue()


def _write_csv(path: Path, rows: list[dict], columns=("filepath", "caption", "objects")):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(columns))
        w.writeheader()
        w.writerows(rows)


FILLERS = [f"filler{k}" for k in range(8)]


@pytest.fixture(scope="module")
def cooc_csv(tmp_path_factory):
    """kite always comes with string in 60 images, boat with water in 60 others, fillers alone; then 40
    images with a kite and no string."""
    root = tmp_path_factory.mktemp("csv")
    png, rows = _png(), []

    def add(name, caption, objects):
        (root / name).write_bytes(png)
        rows.append({"filepath": name, "caption": caption, "objects": json.dumps(objects)})
    for i in range(60):
        add(f"ks{i}.png", "a kite on a string", ["kite", "string"])
        add(f"bw{i}.png", "a boat on the water", ["boat", "water"])
    for i, f in enumerate(FILLERS * 8):
        add(f"f{i}.png", f"a {f}", [f])
    for i in range(40):
        add(f"k{i}.png", "a kite in the sky", ["kite"])
    _write_csv(root / "captions.csv", rows)
    return root


def test_absent_objects_follow_cooccurrence(cooc_csv, tmp_path):
    man = negate(str(cooc_csv / "captions.csv"), str(cooc_csv), str(tmp_path / "o"), val_fraction="0",
                 progress="false")
    assert man["counts"] == {"samples": 120 + 64 + 40, "train": 224, "val": 0}
    kite_only = [m for k, m, _ in read_samples(tmp_path / "o" / "train") if k.startswith("k") and k[1:].isdigit()]
    assert len(kite_only) == 40
    negated = Counter(o for m in kite_only for o in m["objects"]["negative"])
    first = Counter(m["objects"]["negative"][0] for m in kite_only)
    # string co-occurs with kite, boat (as frequent) never does: string is the first (most plausible)
    # absence nearly always, boat only fills the later draws from the smoothing (the marginal)
    assert negated["string"] >= 36 and first["string"] >= 34 and first["boat"] <= 2
    assert negated["string"] > 1.5 * negated["boat"]
    assert all("kite" not in m["objects"]["negative"] for m in kite_only)


def test_cooccurrence_sampler_draws_its_weights():
    sets = [["a", "b"]] * 30 + [["a", "c"]] * 10 + [["d"]] * 20 + [["e", "b"]] * 5
    model = Cooccurrence(sets, smoothing=2.0)
    present = [model.index["a"]]
    w = model.weights(present)
    assert w[model.index["a"]] == 0 and w.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(0)
    draws = Counter(model.sample(present, 1, rng)[0] for _ in range(20000))
    for i, p in enumerate(w):
        assert draws[i] / 20000 == pytest.approx(p, abs=0.015)
    assert w[model.index["b"]] > w[model.index["c"]] > w[model.index["e"]]
    # every label but the present ones, when asked for all of them (the exact fallback)
    assert sorted(model.sample(present, 4, rng)) == sorted(set(range(5)) - set(present))


def test_csv_reader_groups_rows_and_counts_skips(tmp_path):
    png = _png()
    for name in ("a.png", "b.png", "c.png", "d.png", "e.png", "g.png"):
        (tmp_path / name).write_bytes(png)
    (tmp_path / "f.gif").write_bytes(b"GIF89a")
    vocab = ["cat", "dog", "car", "tree", "bird"]
    rows = [
        {"filepath": "a.png", "caption": "A cat on a sofa.", "extracted_objects": "['cat']"},     # NegBench style
        {"filepath": "a.png", "caption": "a sofa with a cat", "extracted_objects": "['cat']"},
        {"filepath": "b.png", "caption": "a dog and a car", "extracted_objects": "dog; car"},
        {"filepath": "c.png", "caption": "", "extracted_objects": '["tree"]'},                  # empty caption
        {"filepath": "c.png", "caption": "a tree", "extracted_objects": '["tree"]'},
        {"filepath": "d.png", "caption": "a bird", "extracted_objects": "[bird"},                # unparsable
        {"filepath": "e.png", "caption": "nothing labelled", "extracted_objects": ""},           # no labels
        {"filepath": "f.gif", "caption": "a gif", "extracted_objects": "['cat']"},               # type
        {"filepath": "missing.png", "caption": "gone", "extracted_objects": "['cat']"},          # missing
        {"filepath": "g.png", "caption": "everything", "extracted_objects": json.dumps(vocab[:4])},  # 1 absent
        {"filepath": str(tmp_path / "b.png"), "caption": "absolute path", "extracted_objects": "['bird']"},
    ]
    _write_csv(tmp_path / "caps.csv", rows, ("filepath", "caption", "extracted_objects"))
    man = negate(str(tmp_path / "caps.csv"), str(tmp_path), str(tmp_path / "o"), val_fraction="0", progress="false")
    assert man["skipped"] == {"empty caption": 1, "unparsable objects cell": 1, "no object labels": 1,
                              "image type not jpg/png": 1, "missing image": 1,
                              "fewer than 2 possible absent objects": 1}
    assert man["counts"]["samples"] == 4
    got = {k: m for k, m, _ in read_samples(tmp_path / "o" / "train")}
    assert got["a"]["captions"] == ["A cat on a sofa.", "a sofa with a cat"]
    assert got["a"]["caption"] == "A cat on a sofa."
    assert got["b"]["objects"]["positive"] == ["car", "dog"]
    assert got["c"]["captions"] == ["a tree"]
    # a labels CSV replaces the objects column
    _write_csv(tmp_path / "labels.csv", [{"filepath": "a.png", "objects": '["dog"]'},
                                         {"filepath": "b.png", "objects": '["cat", "tree"]'},
                                         {"filepath": "c.png", "objects": '["car"]'}], ("filepath", "objects"))
    man = negate(str(tmp_path / "caps.csv"), str(tmp_path), str(tmp_path / "o2"),
                 labels=str(tmp_path / "labels.csv"), val_fraction="0", progress="false")
    got = {k: m for k, m, _ in read_samples(tmp_path / "o2" / "train")}
    assert got["a"]["objects"]["positive"] == ["dog"] and set(got) == {"a", "b", "c"}


def test_text_helpers():
    assert affirmative_part("A man riding a wave.  ") == "a man riding a wave"
    assert affirmative_part("TV on a table.") == "TV on a table" and affirmative_part("I see a dog") == "I see a dog"
    assert phrasings.negate_text("a man riding a wave", "dog", template="{pos}, but no {n}") == "A man riding a wave, but no dog"
    assert phrasings.negate_text("two cats", "umbrella", template="{pos} without {an}") == "Two cats without an umbrella"
    assert parse_objects("['Traffic  Light', 'dog']") == ["dog", "traffic light"]
    assert parse_objects('["a", 1]') is None and parse_objects("") == []


def test_cli(example, tmp_path, capsys):
    assert cli.main(["data", "negate", example["captions"], example["images"], f"out={tmp_path / 'n'}",
                     f"labels={example['instances']}", "seed=3", "val_fraction=0.2", "progress=false"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["counts"]["samples"] == N - 3 and summary["out"] == str(tmp_path / "n")
    # COCO captions without labels: a clear error
    assert cli.main(["data", "negate", example["captions"], example["images"], f"out={tmp_path / 'm'}"]) == 2
