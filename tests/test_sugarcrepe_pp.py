"""SugarCrepe++: the reader on fixtures in the released layout (Sri-Harsha/scpp data/<split>.json beside images/),
scored by a stand-in model with known scores, tie-aware and official; and the world's files."""
import json
from pathlib import Path

import pytest
from PIL import Image

from negft.probes import sugarcrepe_pp
from negft.probes.base import Dataset, EvalContext
from negft.world.formats import sugarcrepe_pp as writer
from test_sugarcrepe import _BagOfWords, holds
from tests.conftest import planted_context

SPLITS = sugarcrepe_pp.SPLITS
METRICS = ("itt", "tot", "itt_p1", "itt_p2")
# text features; every image's feature is [1, 0, 0], so s(I, t) is a text's first component: a, a2: 1; b, b2, b3:
# 1/√2; c, c2, "": 0. Text-text: a·b = a·b2 = b·c = b2·c2 = 1/√2, b·b2 = 1/2, b·b3 = a·a2 = 1, a·c = a·c2 = c·c2 = 0;
# the empty text "" (the reference tokenizes and scores it) is c: ""·c = 1, ""·b = 1/√2, ""·a = 0
FEATURES = {"a": [1, 0, 0], "a2": [1, 0, 0], "b": [1, 1, 0], "b2": [1, 0, 1], "b3": [1, 1, 0], "c": [0, 1, 0],
            "c2": [0, 0, 1], "": [0, 1, 0]}
# (P1, P2, N) -> {metric: (negft's credit, the reference's)}, worked out by hand from the scores above
ROWS = {
    "clear": (("a", "a2", "c"), {"itt": (1, 1), "tot": (1, 1), "itt_p1": (1, 1), "itt_p2": (1, 1)}),
    # s(I, P2) ties s(I, N); s(P1, P2) ties s(P1, N)
    "one_tie": (("a", "b", "b2"), {"itt": (1 / 2, 0), "tot": (1 / 2, 0), "itt_p1": (1, 1), "itt_p2": (1 / 2, 0)}),
    # all three image scores equal; s(P1, N) = 1 beats s(P1, P2) = 1/2
    "all_tied": (("b", "b2", "b3"), {"itt": (1 / 3, 0), "tot": (0, 0), "itt_p1": (1 / 2, 0), "itt_p2": (1 / 2, 0)}),
    "p1_below": (("c", "a", "b"), {"itt": (0, 0), "tot": (0, 0), "itt_p1": (0, 0), "itt_p2": (1, 1)}),
    # the three text-text scores all 0
    "text_tied": (("c", "c2", "a"), {"itt": (0, 0), "tot": (1 / 3, 0), "itt_p1": (0, 0), "itt_p2": (0, 0)}),
    # P2 empty: s(I, "") = 0 below s(I, N) = 1/√2; s(P1, P2) = 0 below s(P1, N) = 1/√2
    "empty_p2": (("a", "", "b"), {"itt": (0, 0), "tot": (0, 0), "itt_p1": (1, 1), "itt_p2": (0, 0)}),
    # N empty: s(I, N) = 0 ties s(I, P1) = 0; s(P1, N) = 1 beats s(P1, P2) = 0
    "empty_neg": (("c", "a", ""), {"itt": (1 / 2, 0), "tot": (0, 0), "itt_p1": (1 / 2, 0), "itt_p2": (1, 1)}),
}
PLAN = {"replace_att": ["clear", "one_tie", "all_tied"], "replace_obj": ["p1_below", "text_tied"],
        "replace_rel": ["clear"], "swap_att": ["one_tie", "one_tie"], "swap_obj": ["all_tied", "clear", "p1_below"]}


def _ctx(image_paths) -> EvalContext:
    return planted_context({str(p): [1, 0, 0] for p in image_paths}, FEATURES)


def released_fixture(root: Path, world_split: Path, plan=PLAN) -> list[str]:
    """The five split files as released (a list of rows, ids from 0) in ``root/data`` and COCO-named JPEGs made
    from world images in ``root/images``; returns the image paths."""
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "images").mkdir(exist_ok=True)
    sources = sorted((world_split / "images").glob("0000[0-9][0-9].png"))
    images, k = [], 0
    for split, names in plan.items():
        rows = []
        for name in names:
            filename = f"{139 + k:012d}.jpg"
            Image.open(sources[k % len(sources)]).convert("RGB").save(root / "images" / filename)
            images.append(str(root / "images" / filename))
            p1, p2, neg = ROWS[name][0]
            rows.append({"filename": filename, "caption": p1, "caption2": p2, "negative_caption": neg})
            k += 1
        writer.write_split(root / "data" / f"{split}.json", rows)
    return images


def expected(split: str, metric: str, which: int, plan=PLAN) -> float:
    values = [ROWS[name][1][metric][which] for name in plan[split]]
    return sum(values) / len(values)


@pytest.fixture(scope="module")
def world_split(cache):
    return cache / "world-s0-tiny" / "val"


def test_layout_is_the_released_one(tmp_path, world_split):
    released_fixture(tmp_path, world_split)
    text = (tmp_path / "data" / "replace_att.json").read_text()
    assert text.startswith('[\n {\n  "id":0,\n  "filename":"000000000139.jpg",\n  "caption":"a",\n')
    assert text.endswith('\n }\n]')
    assert [list(r) for r in json.loads(text)] == [["id", "filename", "caption", "caption2", "negative_caption"]] * 3


def test_known_scores_tie_aware_and_official(tmp_path, world_split):
    images = released_fixture(tmp_path, world_split)
    dataset = Dataset("sugarcrepe_pp", tmp_path, "sugarcrepe_pp")
    result = sugarcrepe_pp.run(_ctx(images), dataset)
    m, p = result.metrics, "sugarcrepe_pp/sugarcrepe_pp"
    for split in SPLITS:
        for metric in METRICS:
            assert m[f"{p}/{split}_{metric}"] == pytest.approx(expected(split, metric, 0)), (split, metric)
            assert m[f"{p}/{split}_{metric}_official"] == pytest.approx(expected(split, metric, 1)), (split, metric)
    assert m[f"{p}/replace_att_itt"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3)
    assert m[f"{p}/replace_obj_tot"] == pytest.approx(1 / 6) and m[f"{p}/replace_obj_tot_official"] == 0
    assert f"{p}/skipped_rows" not in m and not result.skipped
    assert len(result.records[p]) == sum(map(len, PLAN.values()))
    assert set(sugarcrepe_pp.texts(dataset)) == {t for names in PLAN.values() for n in names for t in ROWS[n][0]}


def test_category_macro_means_are_the_unweighted_means_of_their_splits(tmp_path, world_split):
    images = released_fixture(tmp_path, world_split)
    m = sugarcrepe_pp.run(_ctx(images), Dataset("sugarcrepe_pp", tmp_path, "sugarcrepe_pp")).metrics
    p = "sugarcrepe_pp/sugarcrepe_pp"
    for category, splits in sugarcrepe_pp.CATEGORIES.items():
        for metric in ("itt", "tot"):
            for which, suffix in ((0, ""), (1, "_official")):
                mean = sum(expected(s, metric, which) for s in splits) / len(splits)
                assert m[f"{p}/{category}_{metric}_macro{suffix}"] == pytest.approx(mean), (category, metric, suffix)
    # by hand: the mean of replace_att (1 + 1/2 + 1/3) / 3, replace_obj 0 and replace_rel 1
    assert m[f"{p}/replace_itt_macro"] == pytest.approx(((1 + 1 / 2 + 1 / 3) / 3 + 0 + 1) / 3)


def test_an_empty_caption_is_scored_as_the_reference_scores_it(tmp_path, world_split):
    """The reference (test_Variants_CLIP.py) tokenizes "" and scores the row: so do both rules here. Over the
    three rows, by hand: itt official 1/3 (a skip would give 1), tie-aware (1 + 0 + 1/2) / 3."""
    plan = {"swap_att": ["clear", "empty_p2", "empty_neg"]}
    images = released_fixture(tmp_path, world_split, plan)
    result = sugarcrepe_pp.run(_ctx(images), Dataset("sugarcrepe_pp", tmp_path, "sugarcrepe_pp"))
    m, p = result.metrics, "sugarcrepe_pp/sugarcrepe_pp"
    assert m[f"{p}/swap_att_itt_official"] == pytest.approx(1 / 3)
    assert m[f"{p}/swap_att_itt"] == pytest.approx(1 / 2)
    assert m[f"{p}/swap_att_itt_p1_official"] == pytest.approx(2 / 3)
    assert m[f"{p}/swap_att_itt_p2_official"] == pytest.approx(2 / 3)
    assert m[f"{p}/swap_att_tot_official"] == pytest.approx(1 / 3)
    for metric in METRICS:
        for which, suffix in ((0, ""), (1, "_official")):
            assert m[f"{p}/swap_att_{metric}{suffix}"] == pytest.approx(expected("swap_att", metric, which, plan))
    assert f"{p}/skipped_rows" not in m and f"{p}/swap_att/rows" not in result.skipped
    assert len(result.records[p]) == 3


def test_odd_rows_are_counted_and_odd_files_skipped(tmp_path, world_split):
    """Ids out of order, as strings or absent are not read (the reference does not read them); rows that cannot
    be scored are counted by reason; a file cut short or holding an object is skipped; a missing one too, with its
    path and manifest; the other splits still run."""
    images = released_fixture(tmp_path, world_split)
    path = tmp_path / "data" / "replace_att.json"
    rows = json.loads(path.read_text())
    rows[0]["id"], rows[1]["id"], rows[2]["id"] = 9, "4", None
    good = dict(rows[0])
    rows += [["000000000139.jpg", "a", "a2", "c"],                                  # not an object
             {k: v for k, v in good.items() if k != "caption2"},                   # no caption2
             {**good, "caption2": None}, {**good, "negative_caption": 7},          # not strings
             {**good, "filename": "000000999999.jpg"}]                             # no such image
    path.write_text(json.dumps(rows, indent=1, separators=(",", ":")))
    (tmp_path / "data" / "replace_obj.json").write_text('[{"id":0,"filename":')       # cut short
    (tmp_path / "data" / "replace_rel.json").write_text('{"0": {"filename": "x.jpg"}}')   # SugarCrepe's layout
    (tmp_path / "data" / "swap_obj.json").unlink()
    result = sugarcrepe_pp.run(_ctx(images), Dataset("sugarcrepe_pp", tmp_path, "sugarcrepe_pp"))
    m, p = result.metrics, "sugarcrepe_pp/sugarcrepe_pp"
    assert m[f"{p}/skipped_rows"] == 5
    msg = result.skipped[f"{p}/replace_att/rows"]
    assert msg.startswith("5 of 8 rows skipped") and "replace_att.json" in msg
    assert "image file not found: 1" in msg and "row is not an object: 1" in msg
    assert "'caption2' missing or not a string: 2" in msg and "'negative_caption' missing" in msg
    for split in ("replace_att", "swap_att"):                 # the good rows score as before
        for metric in METRICS:
            assert m[f"{p}/{split}_{metric}_official"] == pytest.approx(expected(split, metric, 1))
    assert "unreadable JSON" in result.skipped[f"{p}/replace_obj"]
    assert "expected a JSON list, found dict" in result.skipped[f"{p}/replace_rel"]
    assert f"{tmp_path}/data/swap_obj.json" in result.skipped[f"{p}/swap_obj"]
    assert "data_manifests/sugarcrepe_pp.yaml" in result.skipped[f"{p}/swap_obj"]
    assert not any(k.startswith((f"{p}/replace_obj", f"{p}/replace_rel", f"{p}/swap_obj")) for k in m)
    empty = sugarcrepe_pp.run(_ctx([]), Dataset("sugarcrepe_pp", tmp_path / "none", "sugarcrepe_pp"))
    assert set(empty.skipped) == {f"{p}/{s}" for s in SPLITS} and not empty.metrics


def test_the_manifest_serves_the_probe_from_negft_data(tmp_path, world_split, monkeypatch):
    from negft.evaluation import datasets_for
    images = released_fixture(tmp_path / "sugarcrepe_pp", world_split)
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path))
    (ds,) = [d for d in datasets_for(None) if d.name == "sugarcrepe_pp"]
    assert ds.probes == ("sugarcrepe_pp",) and ds.root == tmp_path / "sugarcrepe_pp"
    assert sugarcrepe_pp.run(_ctx(images), ds).metrics["sugarcrepe_pp/sugarcrepe_pp/replace_rel_itt"] == 1.0


def test_skipped_rows_are_said_on_the_console_at_the_end_of_eval(tmp_path, world_split):
    """eval.py on a data root holding SugarCrepe++ with two rows its reader cannot score: the console names the
    benchmark, the count and the reasons, as results.md does."""
    from negft import models
    from conftest import run_here
    released_fixture(tmp_path / "data" / "sugarcrepe_pp", world_split, {"replace_rel": ["clear", "p1_below"]})
    path = tmp_path / "data" / "sugarcrepe_pp" / "data" / "replace_rel.json"
    rows = json.loads(path.read_text())
    path.write_text(json.dumps(rows + [{**rows[0], "filename": "000000999999.jpg"}, ["not", "an", "object"]]))
    bundle = models.build("negft-tiny", "")
    ckpt = models.save(bundle.model, tmp_path / "ckpt", bundle.model_cfg, bundle.preprocess_cfg)
    proc = run_here(["eval.py", f"ckpt={ckpt}", "suite=sugarcrepe_pp", "data=real", f"out={tmp_path / 'out'}"],
                    env={"NEGFT_DATA": str(tmp_path / "data")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    start = [i for i, line in enumerate(lines) if line.startswith("[negft] rows skipped")]
    assert len(start) == 1, proc.stdout
    said = lines[start[0]:]
    assert said[0].startswith("[negft] rows skipped (2) in 1 benchmark(s)"), said
    assert "[negft]   sugarcrepe_pp/sugarcrepe_pp: 2 row(s) skipped" in said
    assert any("2 of 4 rows skipped in" in line and "replace_rel.json" in line and "image file not found: 1" in line
               and "row is not an object: 1" in line for line in said), said


def test_the_console_summary_is_silent_without_skipped_rows_and_counts_each_benchmark():
    from negft.evaluation import skipped_rows_summary
    from negft.probes.base import ProbeResult
    quiet = ProbeResult(metrics={"ccneg/ccneg/acc": 0.5}, skipped={"spec/spec": "data not found: /x"})
    assert skipped_rows_summary(quiet) == []
    loud = ProbeResult(metrics={"ccneg/ccneg/skipped_rows": 3.0, "spec/spec/skipped_rows": 1.0},
                       skipped={"ccneg/ccneg/rows": "3 of 9 rows skipped in f.pt (why: 3)",
                                "spec/spec/count_i2t/rows": "1 of 2 rows skipped in g.json (why: 1)"})
    lines = skipped_rows_summary(loud)
    assert lines[0].startswith("[negft] rows skipped (4) in 2 benchmark(s)")
    assert lines[1:] == ["[negft]   ccneg/ccneg: 3 row(s) skipped", "[negft]     3 of 9 rows skipped in f.pt (why: 3)",
                         "[negft]   spec/spec: 1 row(s) skipped", "[negft]     1 of 2 rows skipped in g.json (why: 1)"]


def test_training_says_skipped_rows_after_an_evaluation_once_while_they_stay_the_same(tmp_path, capsys, monkeypatch):
    """The training loop's evaluation (EvalRecorder.record) prints the same summary as eval.py, once while it does
    not change (the same files skip the same rows every epoch), and anew when it does."""
    from negft.config import load_config
    from negft.probes.base import ProbeResult
    from negft.train import recorder

    class _Log:
        def __getattr__(self, name):
            return lambda *a, **k: None

    results = [ProbeResult(metrics={"ccneg/ccneg/acc": 0.5, "ccneg/ccneg/skipped_rows": 3.0},
                           skipped={"ccneg/ccneg/rows": "3 of 9 rows skipped in f.pt (why: 3)"})] * 2
    results.append(ProbeResult(metrics={"ccneg/ccneg/acc": 0.5, "ccneg/ccneg/skipped_rows": 4.0},
                               skipped={"ccneg/ccneg/rows": "4 of 9 rows skipped in f.pt (why: 4)"}))
    rec = recorder.EvalRecorder(load_config(["recipe=negfull"]), tmp_path, None, [], "cpu", _Log(), [])
    monkeypatch.setattr(rec, "_evaluate", lambda model, **caches: results.pop(0))
    printed = []
    for epoch in range(3):
        rec.record(None, epoch, epoch * 10)
        printed.append([line for line in capsys.readouterr().out.splitlines() if "skipped" in line])
    assert printed[0][0].startswith("[negft] rows skipped (3) in 1 benchmark(s)")
    assert printed[0][1:] == ["[negft]   ccneg/ccneg: 3 row(s) skipped", "[negft]     3 of 9 rows skipped in f.pt (why: 3)"]
    assert printed[1] == [] and printed[2][0].startswith("[negft] rows skipped (4)")


# ------------------------------------------------------------------ the world
def test_world_files_parse_whole_with_true_positives_and_false_negatives(world_split):
    scenes = {Path(r["image_path"]).name: r["scene"]
              for r in map(json.loads, (world_split / "annotations.jsonl").read_text().splitlines())}
    for split in SPLITS:
        text = (world_split / "data" / f"{split}.json").read_text()
        rows = json.loads(text)
        assert [r["id"] for r in rows] == list(range(len(rows))) and len(rows) > 20, split
        assert text == json.dumps(rows, indent=1, separators=(",", ":"), ensure_ascii=False)
        for row in rows:
            scene = scenes[row["filename"]]
            assert holds(scene, row["caption"]) and holds(scene, row["caption2"]), (split, row)
            assert not holds(scene, row["negative_caption"]), (split, row)
            assert row["caption2"] != row["caption"]
    result = sugarcrepe_pp.run(_BagOfWords(), Dataset("world", world_split))
    assert not result.skipped and "sugarcrepe_pp/world/skipped_rows" not in result.metrics
    assert {f"sugarcrepe_pp/world/{s}_{m}" for s in SPLITS for m in METRICS} <= set(result.metrics)
