"""CLIP_benchmark's webdataset suite (classnames.txt, templates, <split>/nshards.txt + shards, one folder per
dataset) as the zeroshot probe reads it: found under the data root, scored with stand-in features whose scores are
known (CLIP_benchmark's acc1 / acc5 / mean_per_class_recall and image / text retrieval recall@k as `_official`,
negft's tie-aware numbers beside them), and its odd samples skipped and counted where CLIP_benchmark stops.
The same files' numbers from `clip_benchmark eval` 1.6.2 itself: bench/parity/clip_benchmark_wds.md."""
import re

import pytest
import torch
import torch.nn.functional as F

from negft.evaluation import datasets_for
from negft.probes.base import EvalContext
from negft.probes.clip_benchmark_wds import dataset_name, load
from negft.world.formats.clip_benchmark_wds import write_clip_benchmark_example

D = 40
SHAPES, COLORS, CAPTIONS = 0, 12, 20          # where each dataset's basis vectors start


def _unit(*weights):
    v = torch.zeros(D)
    for i, w in weights:
        v[i] += w
    return F.normalize(v, dim=0)


@pytest.fixture(scope="module")
def suite(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    written = write_clip_benchmark_example(root / "clip_benchmark", n=24, broken=True)
    found = {d.name: d for d in datasets_for(None, data_root=root) if d.manifest == "clip_benchmark_wds"}
    return root, written, found


def _ctx():
    return EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=20)


def test_every_dataset_folder_under_the_root_is_found_by_its_name(suite):
    _, _, found = suite
    assert sorted(found) == ["world_captions", "world_colors", "world_shapes"]
    assert all(d.probes == ("zeroshot",) for d in found.values())
    assert dataset_name("wds_vtab-cifar10") == "vtab_cifar10" and dataset_name("wds_imagenet1k") == "imagenet1k"


def test_classification_official_and_tie_aware_numbers(suite):
    """Shapes: 12 classes, 2 images each; image 0 (class 0) points at class 1; image 1 (class 1) ties classes 0 and 1
    (official: the lower index wins, so a miss); the others point at their class."""
    from negft.probes.zeroshot import run
    _, written, found = suite
    data = load(found["world_shapes"])
    assert data["labels"] == written["wds_world_shapes"]["labels"] == [i % 12 for i in range(24)]
    assert data["prompts"][:2] == ["a photo of a circle.", "a picture of a circle."] and not data["skipped"]
    ctx = _ctx()
    for c in range(12):
        for p in data["prompts"][c * 5:(c + 1) * 5]:
            ctx._texts[p] = _unit((SHAPES + c, 1))
    for i, (key, y) in enumerate(zip(data["images"], data["labels"])):
        ctx._images[key] = (_unit((SHAPES + 1, 1)) if i == 0 else _unit((SHAPES, 1), (SHAPES + 1, 1)) if i == 1
                            else _unit((SHAPES + y, 1)))
    m = run(ctx, found["world_shapes"]).metrics
    assert m["zeroshot/world_shapes/top1_official"] == pytest.approx(22 / 24)
    assert m["zeroshot/world_shapes/top1"] == pytest.approx(22.5 / 24)
    assert m["zeroshot/world_shapes/top5_official"] == 1.0
    assert m["zeroshot/world_shapes/top5"] == pytest.approx((23 + 4 / 11) / 24)   # image 0: 1 above, 11 tied at 0
    assert m["zeroshot/world_shapes/mean_per_class_recall_official"] == pytest.approx((0.5 + 0.5 + 10) / 12)
    assert m["zeroshot/world_shapes/mean_per_class_recall"] == pytest.approx((0.5 + 0.75 + 10) / 12)
    assert "zeroshot/world_shapes/skipped_rows" not in m


def test_odd_and_broken_samples_counted_as_clip_benchmark_counts_or_skips_them(suite):
    """Colours: every image points at its class, but the last label (8) names no class: CLIP_benchmark counts it a
    miss and a class of its own in the balanced accuracy; negft leaves it out. The three samples CLIP_benchmark stops
    on (no image, a label that is no int, no label) are skipped and counted."""
    from negft.probes.zeroshot import run
    _, written, found = suite
    data = load(found["world_colors"])
    labels = written["wds_world_colors"]["labels"]
    assert data["labels"] == labels and labels[-1] == 8 and data["total"] == 27
    assert sum(data["skipped"].values()) == 3
    ctx = _ctx()
    for c in range(8):
        for p in data["prompts"][c * 3:(c + 1) * 3]:
            ctx._texts[p] = _unit((COLORS + c, 1))
    for key, y in zip(data["images"], labels):
        ctx._images[key] = _unit((COLORS + min(y, 7), 1))
    res = run(ctx, found["world_colors"])
    m = res.metrics
    present = len(set(labels))
    assert m["zeroshot/world_colors/top1_official"] == pytest.approx(23 / 24)
    assert m["zeroshot/world_colors/mean_per_class_recall_official"] == pytest.approx((present - 1) / present)
    assert m["zeroshot/world_colors/top1"] == 1.0
    assert m["zeroshot/world_colors/mean_per_class_recall"] == pytest.approx(1.0)
    assert m["zeroshot/world_colors/skipped_rows"] == 4
    assert "3 of 27 rows skipped" in res.skipped["zeroshot/world_colors/rows"]
    assert "no cls" in res.skipped["zeroshot/world_colors/rows"]
    assert "1 of 24 samples" in res.skipped["zeroshot/world_colors/labels"]


def test_retrieval_official_and_tie_aware_recall(suite):
    """Captions: 12 images, each caption pointing at its image, except the empty caption planted in image 2's list,
    which scores image 5 above image 2 (a text→image miss at 1, a hit at 5); image 1 has an empty txt (no caption):
    an image→text miss for CLIP_benchmark, left out by negft."""
    from negft.probes.zeroshot import run
    _, written, found = suite
    data = load(found["world_captions"])
    captions = written["wds_world_captions"]["captions"]
    assert data["kind"] == "retrieval" and data["captions"] == captions
    assert captions[1] == [] and "" in captions[2]
    texts = [c for cs in captions for c in cs]
    assert len(set(texts)) == len(texts)          # one feature per caption string
    ctx = _ctx()
    for j, cs in enumerate(captions):
        for c in cs:
            ctx._texts[c] = _unit((CAPTIONS + 5, 1), (CAPTIONS + 2, 0.5)) if c == "" else _unit((CAPTIONS + j, 1))
    for j, key in enumerate(data["images"]):
        ctx._images[key] = _unit((CAPTIONS + j, 1))
    res = run(ctx, found["world_captions"])
    m, q = res.metrics, len(texts)
    for rule in ("", "_official"):
        assert m[f"zeroshot_retrieval/world_captions/r1{rule}"] == pytest.approx((q - 1) / q)
        assert m[f"zeroshot_retrieval/world_captions/r5{rule}"] == 1.0
    assert m["zeroshot_retrieval/world_captions/i2t_r1_official"] == pytest.approx(11 / 12)
    assert m["zeroshot_retrieval/world_captions/i2t_r1"] == 1.0
    assert "1 of 12 images" in res.skipped["zeroshot_retrieval/world_captions/i2t"]


def test_a_dataset_that_cannot_be_read_is_skipped_naming_the_file(tmp_path):
    from negft.probes.zeroshot import run
    write_clip_benchmark_example(tmp_path / "clip_benchmark", n=4, odd=False)
    found = {d.name: d for d in datasets_for(None, data_root=tmp_path) if d.manifest == "clip_benchmark_wds"}
    shapes, colors, captions = (tmp_path / "clip_benchmark" / f"wds_world_{n}"
                                for n in ("shapes", "colors", "captions"))
    (shapes / "zeroshot_classification_templates.txt").write_text("a photo of {0}.\n")
    (colors / "test" / "1.tar").unlink()
    (captions / "dataset_type.txt").write_text("multilabel\n")
    skipped = {name: run(_ctx(), d).skipped[f"zeroshot/{name}"] for name, d in found.items()}
    assert "a template may hold no field but {c}" in skipped["world_shapes"]
    assert "1 of 2 shards" in skipped["world_colors"] and str(colors / "test" / "1.tar") in skipped["world_colors"]
    assert "multilabel" in skipped["world_captions"]


def test_no_dataset_folder_under_the_root_is_one_skip_naming_where_to_put_them(tmp_path, monkeypatch):
    from negft.probes.zeroshot import run
    from negft.data.check import check
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path))
    assert "not found at" in check("clip_benchmark_wds")[0]
    write_clip_benchmark_example(tmp_path / "other", n=2, odd=False)
    (tmp_path / "other").rename(tmp_path / "clip_benchmark")
    assert check("clip_benchmark_wds") == []
    (tmp_path / "clip_benchmark" / "wds_world_shapes" / "classnames.txt").unlink()
    assert "wds_world_shapes" in check("clip_benchmark_wds")[0] and "classnames.txt" in check("clip_benchmark_wds")[0]
    (tmp_path / "clip_benchmark").rename(tmp_path / "elsewhere")
    found = [d for d in datasets_for(None, data_root=tmp_path) if d.manifest == "clip_benchmark_wds"]
    assert len(found) == 1
    msg = run(_ctx(), found[0]).skipped[f"zeroshot/{found[0].name}"]
    assert str(tmp_path / "clip_benchmark" / "<dataset>" / "test" / "nshards.txt") in msg
    assert "data_manifests/clip_benchmark_wds.yaml" in msg


def test_drift_metrics_may_name_the_suite_and_an_unknown_one_is_refused(tmp_path, capsys):
    """The patching rule holds a suite metric named in patch.drift; the default stays ImageNet's (and the world's);
    a metric no probe reports is refused before anything runs, in a recipe and on negft patch's command line."""
    from negft.commands.cli import main
    from negft.config import load_config
    from negft.patching import Rule, select
    assert load_config([]).patch.drift == ["zeroshot/imagenet/top1", "zeroshot/imagenetv2/top1",
                                           "zeroshot/world/top1", "retrieval/*/r5"]
    cfg = load_config(["patch.drift=[zeroshot/*/top1,zeroshot_retrieval/*/r5_official]"])
    assert cfg.patch.drift[1] == "zeroshot_retrieval/*/r5_official"
    from negft.commands import train
    assert train.main(["patch.drift=[zeroshot/cars/acc1]", f"out={tmp_path / 'run'}"]) == 2
    assert re.search("zeroshot/cars/acc1.*zeroshot/<dataset>/top1", capsys.readouterr().err)
    assert not (tmp_path / "run").exists()
    bad = "drift=zeroshot_retrieval/flickr30k/R5"
    assert main(["patch", "base=a", "finetuned=b", f"out={tmp_path / 'o'}", bad]) == 2
    assert "zeroshot_retrieval/flickr30k/R5" in capsys.readouterr().err and not (tmp_path / "o").exists()
    base = {"mcq_neg/world/acc": 0.2, "zeroshot/imagenet/top1": 0.5, "zeroshot_retrieval/flickr30k/r5": 0.8}
    rows = [{"tower": "vt", "alpha": 0.0, "metrics": base},
            {"tower": "vt", "alpha": 0.5, "metrics": {**base, "mcq_neg/world/acc": 0.3,
                                                      "zeroshot_retrieval/flickr30k/r5": 0.78}},
            {"tower": "vt", "alpha": 1.0, "metrics": {**base, "mcq_neg/world/acc": 0.6,
                                                      "zeroshot_retrieval/flickr30k/r5": 0.5}}]
    assert select(Rule(["mcq_neg/*/acc"], list(load_config([]).patch.drift)), rows)["alpha"] == 1.0
    assert select(Rule(["mcq_neg/*/acc"], ["zeroshot_retrieval/*/r5"]), rows)["alpha"] == 0.5


def test_report_lists_the_runs_drift_metrics(tmp_path):
    import json
    import yaml
    from negft.train.ledger import write_report
    keys = ["zeroshot/world/top1", "zeroshot/world_shapes/top1", "zeroshot/world_shapes/top1_official",
            "zeroshot_retrieval/world_captions/r5", "zeroshot/imagenet/top1"]
    lines = [{"epoch": e, "metrics": dict.fromkeys(keys, v), "ci95": {k: [0, 1] for k in keys}}
             for e, v in ((0, 0.6), (2, 0.5))]
    (tmp_path / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    report = write_report(tmp_path, "r").read_text()          # no config.yaml: the default drift metrics
    costs = next(line for line in report.splitlines() if line.startswith("- **Costs**"))
    assert "drift (`zeroshot/imagenet/top1`) 0.600 → 0.500 (-0.100)" in costs
    assert "`zeroshot/world_shapes/top1`" not in report
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"patch": {"drift": ["zeroshot/world_*/top1",
                                                                                 "zeroshot_retrieval/*/r5"]}}))
    costs = [line for line in write_report(tmp_path, "r").read_text().splitlines() if line.startswith("- **Costs")]
    assert len(costs) == 1 and costs[0].endswith(
        "drift (`zeroshot/world_shapes/top1`) 0.600 → 0.500 (-0.100); "
        "drift (`zeroshot_retrieval/world_captions/r5`) 0.600 → 0.500 (-0.100)")


def test_samples_are_grouped_as_webdataset_groups_tar_members(tmp_path):
    """Consecutive members sharing the name up to the first dot make a sample (extensions lower-cased); a key seen
    again later starts a new sample; a sample with an extension twice is skipped (webdataset raises); __...__
    members and names without a dot are passed over."""
    import io
    import tarfile
    from negft.probes.clip_benchmark_wds import _samples
    members = [("s1.PNG", b"a"), ("s1.cls", b"1"), ("__meta__", b""), ("s2.webp", b"b"), ("s2.cls", b"2"),
               ("s2.cls", b"3"), ("s1.cls", b"4"), ("noext", b""), ("d/s3.x.jpg", b"c")]
    with tarfile.open(tmp_path / "0.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    samples, skipped = _samples(tmp_path / "0.tar")
    assert [(s["__key__"], sorted(k for k in s if k != "__key__")) for s in samples] == [
        ("s1", ["cls", "png"]), ("s1", ["cls"]), ("d/s3", ["x.jpg"])]
    assert sum(skipped.values()) == 1 and "twice" in next(iter(skipped))
