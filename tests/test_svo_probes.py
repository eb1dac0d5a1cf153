"""SVO-Probes: the reader on a fixture in the released layout (google-deepmind/svo_probes: svo_probes.csv with its
ten columns, images by id), scored by a stand-in model with known scores, tie-aware and official, odd rows
counted by reason; and the world's files."""
import csv
import json
from pathlib import Path

import pytest
import torch
from PIL import Image

from negft.probes import svo_probes
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import svo_probes as writer
from negft.world.generator import relations
from conftest import RandomModel, written_twice
from tests.conftest import planted_context

HEADER = ["sentence", "pos_triplet", "neg_triplet", "pos_url", "neg_url", "pos_image_id", "neg_image_id",
          "subj_neg", "verb_neg", "obj_neg"]
# image id -> its feature against the one sentence feature [1, 0]: a high, a low and a middle score
FEATURES = {101: [1.0, 0.0], 102: [0.0, 1.0], 103: [1.0, 1.0], 104: [1.0, 1.0]}
# (sentence, positive id, negative id, flags subj, verb, obj) -> negft's credit, the strict rule's
ROWS = [("a man rides a horse", 101, 102, "True", "False", "False"),       # win: 1, 1
        ("a man feeds a horse", 102, 101, "False", "True", "False"),       # loss: 0, 0
        ("a man rides a bike", 103, 104, "False", "False", "True"),        # exact tie: ½, 0
        ("a girl rides a bike", 101, 103, "False", "TRUE", "false"),       # win (pandas' spellings): 1, 1
        ("", 101, 102, "True", "False", "False"),                           # empty: NaN for pandas
        ("a dog runs", 101, 102, "True", "True", "False"),                  # two flags
        ("a dog sits", 101, 102, "False", "False", "False"),                # none
        ("a cat sits", 101, 999, "True", "False", "False"),                 # no image 999
        ("a cat runs", "x7", 102, "True", "False", "False"),                # id not an integer
        ("a cat eats", 101, 102, "yes", "False", "False")]                  # flag not a bool
N_ODD = 6


def released_fixture(root: Path, world_split: Path) -> None:
    (root / "svo_images").mkdir(parents=True)
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    for k, image_id in enumerate(FEATURES):
        Image.open(sources[k]).convert("RGB").save(root / "svo_images" / f"{image_id}.jpg")
    with open(root / "svo_probes.csv", "w", newline="") as f:
        out = csv.writer(f)
        out.writerow(HEADER)
        for sentence, pos, neg, *flags in ROWS:
            out.writerow([sentence, "s,v,o", "s,v,o2", f"http://x/{pos}.jpg", f"http://x/{neg}.jpg", pos, neg,
                          *flags])


def _ctx(root: Path) -> EvalContext:
    return planted_context({svo_probes.image_path(str(root), i): v for i, v in FEATURES.items()},
                           {r[0]: [1.0, 0.0] for r in ROWS})


@pytest.fixture(scope="module")
def fixture_result(cache, tmp_path_factory):
    root = tmp_path_factory.mktemp("svo")
    released_fixture(root, cache / "world-s0-tiny" / "val")
    dataset = Dataset("svo_probes", root, "svo_probes")
    return root, svo_probes.run(_ctx(root), dataset), svo_probes.texts(dataset)


def test_known_scores_tie_aware_and_official(fixture_result):
    _, result, declared = fixture_result
    m, p = result.metrics, "svo_probes/svo_probes"
    assert m[f"{p}/subj_neg"] == 1.0 and m[f"{p}/subj_neg_official"] == 1.0
    assert m[f"{p}/verb_neg"] == 0.5 and m[f"{p}/verb_neg_official"] == 0.5      # a loss and a win (TRUE)
    assert m[f"{p}/obj_neg"] == 0.5 and m[f"{p}/obj_neg_official"] == 0.0       # the exact tie
    assert m[f"{p}/acc"] == pytest.approx(2.5 / 4) and m[f"{p}/acc_official"] == pytest.approx(2 / 4)
    assert set(declared) == {r[0] for r in ROWS[:4]}           # the probe declares exactly the texts it encodes


def test_odd_rows_are_counted_by_reason(fixture_result):
    root, result, _ = fixture_result
    p = "svo_probes/svo_probes"
    assert result.metrics[f"{p}/skipped_rows"] == N_ODD
    msg = result.skipped[f"{p}/rows"]
    assert msg.startswith(f"{N_ODD} of {len(ROWS)} rows skipped") and "svo_probes.csv" in msg
    for reason in ("sentence missing or empty", "is True (the notebook's selection): 2",
                   "image file not found: 1", "an image id is not an integer: 1", "not True / False: 1"):
        assert reason in msg, reason


def test_absent_csv_and_missing_columns_are_skipped_with_the_reason(tmp_path):
    ctx = EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=10)
    result = svo_probes.run(ctx, Dataset("svo_probes", tmp_path, "svo_probes"))
    assert "data not found" in result.skipped["svo_probes/svo_probes"]
    assert "data_manifests/svo_probes.yaml" in result.skipped["svo_probes/svo_probes"]
    (tmp_path / "svo_probes.csv").write_text("sentence,pos_image_id\nx,1\n")
    result = svo_probes.run(ctx, Dataset("svo_probes", tmp_path, "svo_probes"))
    assert "no column neg_image_id, subj_neg, verb_neg, obj_neg" in result.skipped["svo_probes/svo_probes"]
    assert not result.metrics
    (tmp_path / "svo_probes.csv").write_bytes(b"sentence,pos_image_id\n\xff\xfe,1\n")
    result = svo_probes.run(ctx, Dataset("svo_probes", tmp_path, "svo_probes"))
    assert "not a readable UTF-8 CSV (UnicodeDecodeError" in result.skipped["svo_probes/svo_probes"]
    assert svo_probes.texts(Dataset("svo_probes", tmp_path, "svo_probes")) == []


# ------------------------------------------------------------------ the world
def _holds(objects, rels, triplet: str) -> bool:
    a, pred, b = triplet.split(",")
    return writer.holds(objects, rels, a, pred, b)


def test_world_rows_are_true_of_the_positive_and_false_of_the_negative(cache):
    root = cache / "world-s0-tiny" / "val"
    records = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()]
    scenes = {}
    for r in records:
        if "zs_" in r["image_path"]:
            continue
        index = int(Path(r["image_path"]).stem)
        scenes[index] = r["scene"]["objects"]
        if r.get("relcomp"):
            scenes[index + writer.PAIR_OFFSET] = r["relcomp"]["objects_1"]
    rows = list(csv.DictReader(open(root / "svo_probes.csv")))
    assert {(r["subj_neg"], r["verb_neg"], r["obj_neg"]) for r in rows} == {
        ("True", "False", "False"), ("False", "True", "False"), ("False", "False", "True")}
    pairs = [(r["sentence"].lower(), r[k]) for r in rows for k in ("pos_image_id", "neg_image_id")]
    assert len(pairs) == len(set(pairs))             # the notebook keeps one score per (sentence, image)
    for r in rows:
        pos, neg = scenes[int(r["pos_image_id"])], scenes[int(r["neg_image_id"])]
        assert _holds(pos, relations(pos), r["pos_triplet"]), r
        assert not _holds(neg, relations(neg), r["pos_triplet"]), r
        assert _holds(neg, relations(neg), r["neg_triplet"]), r
        assert writer.sentence(*r["pos_triplet"].split(",")) == r["sentence"]
    result = svo_probes.run(RandomModel(), Dataset("world", root))
    assert not result.skipped, result.skipped
    assert {f"svo_probes/world/{k}" for k in ("subj_neg", "verb_neg", "obj_neg", "acc")} <= set(result.metrics)



def test_the_world_writer_is_deterministic(cache, tmp_path):
    root = cache / "world-s0-tiny" / "val"
    a, b = written_twice(root, tmp_path, writer)
    assert (a / writer.FILE).read_bytes() == (b / writer.FILE).read_bytes() == (root / writer.FILE).read_bytes()