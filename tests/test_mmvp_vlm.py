"""MMVP-VLM: the reader on fixtures in the released layout (Questions.csv beside "MLLM_VLM Images/<Type>/<id>.jpg"),
scored by a stand-in model with known scores, tie-aware and official; and the world's files."""
import csv
from pathlib import Path

import pytest
from PIL import Image

from negft.probes import mmvp_vlm
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import mmvp_vlm as writer
from test_sugarcrepe import _BagOfWords, holds
from tests.conftest import planted_context

# every pair's first image has feature [1, 0], its second [0, 1]; a statement's feature says which it picks
PICK = {"first": [1.0, 0.0], "second": [0.0, 1.0], "tie": [1.0, 1.0]}
# outcome -> (statement 1 picks, statement 2 picks, negft's pair credit, the reference's)
OUTCOMES = {"right": ("first", "second", 1, 1), "wrong": ("second", "second", 0, 0),
            "tie_first": ("tie", "second", 1 / 2, 0),       # a tie goes to image 2: statement 1 misses
            "tie_second": ("first", "tie", 1 / 2, 1),       # ... and statement 2 hits
            "ties": ("tie", "tie", 1 / 4, 0)}
# Type -> [(first question id, outcome)]: ids out of order and with gaps; the last pair starts at an even id, so
# the reference takes image 2 as its first statement's answer
PLAN = {"Orientation": [(1, "right"), (3, "tie_first"), (7, "tie_second")],
        "Camera Perspective": [(241, "ties"), (243, "wrong")],
        "Color": [(161, "right"), (12, "right")]}
EXPECTED = {"orientation": ((1 + 1 / 2 + 1 / 2) / 3, 2 / 3), "camera_perspective": (1 / 8, 0.0),
            "color": (1.0, 1 / 2)}


def _statement(qid: int) -> str:
    return f"statement number {qid}"


def released_fixture(root: Path, world_split: Path, plan=PLAN) -> tuple[dict, dict]:
    """Questions.csv and its JPEGs (made from world images) in ``root``; returns the stand-in model's image and
    text features."""
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    rows, images, texts = [], {}, {}
    for qtype, pairs in plan.items():
        (root / mmvp_vlm.IMAGES / qtype).mkdir(parents=True, exist_ok=True)
        for qid, outcome in pairs:
            for k, (q, pick) in enumerate(zip((qid, qid + 1), OUTCOMES[outcome][:2])):
                path = root / mmvp_vlm.IMAGES / qtype / f"{q}.jpg"
                Image.open(sources[len(rows) % len(sources)]).convert("RGB").save(path)
                images[str(path)] = [1.0, 0.0] if k == 0 else [0.0, 1.0]
                texts[mmvp_vlm.PROMPT + _statement(q)] = PICK[pick]
                rows.append((q, qtype, _statement(q)))
    with open(root / mmvp_vlm.FILE, "w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(writer.COLUMNS)
        out.writerows(rows)
    return images, texts


def _ctx(images: dict, texts: dict) -> EvalContext:
    return planted_context(images, texts)


@pytest.fixture(scope="module")
def world_split(cache):
    return cache / "world-s0-tiny" / "val"


def test_known_scores_tie_aware_official_and_average(tmp_path, world_split):
    features = released_fixture(tmp_path, world_split)
    dataset = Dataset("mmvp_vlm", tmp_path, "mmvp_vlm")
    result = mmvp_vlm.run(_ctx(*features), dataset)
    m, p = result.metrics, "mmvp_vlm/mmvp_vlm"
    for name, (tie_aware, official) in EXPECTED.items():
        assert m[f"{p}/{name}"] == pytest.approx(tie_aware), name
        assert m[f"{p}/{name}_official"] == pytest.approx(official), name
    assert m[f"{p}/average"] == pytest.approx(sum(v[0] for v in EXPECTED.values()) / 3)
    assert m[f"{p}/average_official"] == pytest.approx(sum(v[1] for v in EXPECTED.values()) / 3)
    assert f"{p}/skipped_rows" not in m and not result.skipped
    assert len(result.records[p]) == 7
    assert set(mmvp_vlm.texts(dataset)) == set(features[1])


def test_odd_rows_skip_their_pair_and_are_counted(tmp_path, world_split):
    images, texts = released_fixture(tmp_path, world_split)
    good = (tmp_path / mmvp_vlm.FILE).read_text()
    odd = ["20,Color", "21,Color,a photo", "x7,Color,seven", "23,Color,eight", "25,Color,", "26,Color,ten",
           f"1,Orientation,{_statement(1)}", f"2,Color,{_statement(2)}",                      # Types differ
           "31,Color,missing image", "32,Color,its partner", "99,Color,alone"]
    (tmp_path / mmvp_vlm.FILE).write_text(good + "\n".join(odd) + "\n")
    result = mmvp_vlm.run(_ctx(images, texts), Dataset("mmvp_vlm", tmp_path, "mmvp_vlm"))
    m, p = result.metrics, "mmvp_vlm/mmvp_vlm"
    assert m[f"{p}/skipped_rows"] == 11
    msg = result.skipped[f"{p}/rows"]
    assert msg.startswith("11 of 25 rows skipped") and "Questions.csv" in msg
    # 25 (an empty statement, scored) and 26 are a pair without images
    for why in ("expected 3 fields, found 2: 1", "Question ID not an integer: 1",
                "the rows of a pair name different Types: 2", "image file not found: 4",
                "last row without a partner: 1", "the other row of its pair cannot be scored: 2"):
        assert why in msg, why
    for name, (tie_aware, official) in EXPECTED.items():                # the good pairs score as before
        assert m[f"{p}/{name}_official"] == pytest.approx(official), name
    missing = mmvp_vlm.run(_ctx({}, {}), Dataset("mmvp_vlm", tmp_path / "none", "mmvp_vlm"))
    assert f"{tmp_path}/none/Questions.csv" in missing.skipped[p] and "data_manifests/mmvp_vlm.yaml" in missing.skipped[p]
    assert not missing.metrics


def test_an_empty_statement_or_type_is_read_as_the_reference_reads_it(tmp_path, world_split):
    """evaluate_vlm.py prompts "a photo of " + "" and scores the pair; an empty Type puts the pair's images in
    "MLLM_VLM Images/" itself (os.path.join drops the empty part). "a photo of " picks the first image."""
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    # (qid, Type, statement, its pick): pair 1/2 right, 3/4 and 5/6 both pick image 1 (wrong), 7/8 right
    rows = [(1, "Color", "", "first"), (2, "Color", "blue", "second"), (3, "Color", "red", "first"),
            (4, "Color", "", "first"), (5, "Color", "", "first"), (6, "Color", "", "first"),
            (7, "", "left", "first"), (8, "", "right", "second")]
    images, texts = {}, {}
    for k, (qid, qtype, statement, pick) in enumerate(rows):
        path = tmp_path / mmvp_vlm.IMAGES / qtype / f"{qid}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.open(sources[k]).convert("RGB").save(path)
        images[str(tmp_path / mmvp_vlm.IMAGES / qtype / f"{qid}.jpg")] = [1.0, 0.0] if qid % 2 else [0.0, 1.0]
        texts[mmvp_vlm.PROMPT + statement] = PICK[pick]
    with open(tmp_path / mmvp_vlm.FILE, "w", newline="") as f:
        out = csv.writer(f, lineterminator="\n")
        out.writerow(writer.COLUMNS)
        out.writerows(r[:3] for r in rows)
    result = mmvp_vlm.run(_ctx(images, texts), Dataset("mmvp_vlm", tmp_path, "mmvp_vlm"))
    m, p = result.metrics, "mmvp_vlm/mmvp_vlm"
    assert m[f"{p}/color_official"] == pytest.approx(1 / 3) and m[f"{p}/color"] == pytest.approx(1 / 3)
    assert m[f"{p}/untyped_official"] == 1.0 and m[f"{p}/average_official"] == pytest.approx((1 / 3 + 1) / 2)
    assert f"{p}/skipped_rows" not in m and not result.skipped
    assert mmvp_vlm.PROMPT in mmvp_vlm.texts(Dataset("mmvp_vlm", tmp_path, "mmvp_vlm"))


def test_the_manifest_serves_the_probe_from_negft_data(tmp_path, world_split, monkeypatch):
    from negft.evaluation import datasets_for
    features = released_fixture(tmp_path / "mmvp_vlm", world_split)
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path))
    (ds,) = [d for d in datasets_for(None) if d.name == "mmvp_vlm"]
    assert ds.probes == ("mmvp_vlm",) and ds.root == tmp_path / "mmvp_vlm"
    assert mmvp_vlm.run(_ctx(*features), ds).metrics["mmvp_vlm/mmvp_vlm/color"] == 1.0


# ------------------------------------------------------------------ the world
def test_world_file_parses_whole_and_scores(world_split):
    with open(world_split / mmvp_vlm.FILE, newline="") as f:
        rows = list(csv.reader(f))
    assert tuple(rows[0]) == writer.COLUMNS
    assert [int(r[0]) for r in rows[1:]] == list(range(1, len(rows)))
    assert {r[1] for r in rows[1:]} == {"Presence", "Spatial", "Color"}
    result = mmvp_vlm.run(_BagOfWords(), Dataset("world", world_split))
    assert not result.skipped and "mmvp_vlm/world/skipped_rows" not in result.metrics
    assert {f"mmvp_vlm/world/{t}{s}" for t in ("presence", "spatial", "color", "average") for s in ("", "_official")} \
        <= set(result.metrics)


def test_world_statements_are_true_of_their_own_image_only(tmp_path):
    from negft.world import generator as world
    held = {tuple(c) for c in world.held_out_combos(0)}
    main = []
    for i in range(16):
        png, rec = world.probe_sample("val", 0, i, held, "tiny")
        rec["image_path"] = f"images/{i:06d}.png"
        (tmp_path / "images").mkdir(exist_ok=True)
        (tmp_path / rec["image_path"]).write_bytes(png)
        for field in ("relcomp", "probe_c"):
            if rec.get(field):
                rec[field]["image_1"] = f"images/{i:06d}_{field}.png"
                (tmp_path / rec[field]["image_1"]).write_bytes(rec[field].pop("png_1"))
        main.append(rec)
    writer.write(tmp_path, main, [], seed=0)
    with open(tmp_path / mmvp_vlm.FILE, newline="") as f:
        rows = list(csv.reader(f))[1:]
    by_type, k = writer.pairs(main), 0
    for qtype in writer.TYPES:
        for images, statements in by_type.get(qtype, []):
            assert [r[1:] for r in rows[k:k + 2]] == [[qtype, s] for s in statements]
            assert (tmp_path / mmvp_vlm.IMAGES / qtype / f"{k + 1}.jpg").is_file()
            k += 2
    assert k == len(rows) > 10
    for rec in main:
        pair, scene = rec.get("relcomp"), rec["scene"]
        if pair:                         # caption 0 true of image 0 only, caption 1 of image 1 only
            objects = pair["objects_1"]
            other = {"objects": objects, "relations": world.relations(objects)}
            for s, t in ((scene, other), (other, scene)):
                assert holds(s, pair["caption_0" if s is scene else "caption_1"])
                assert not holds(t, pair["caption_0" if s is scene else "caption_1"])
        if rec.get("probe_c", {}).get("kind") == "object":     # the shape of caption 1 is absent from image 0
            assert holds(scene, rec["probe_c"]["caption_0"]) and not holds(scene, rec["probe_c"]["caption_1"])
