"""``eval.py ... format=clip_benchmark``: one result JSON per dataset and task in LAION-AI/CLIP_benchmark's layout
(clip_benchmark/cli.py: keys dataset, model, pretrained, task, metrics, language; file
{dataset}_{pretrained}_{model}_{language}_{task}.json), read back against those keys."""
import json
import math

import torch

from negft.cli import run_eval

KEYS = {"dataset", "model", "pretrained", "task", "metrics", "language"}     # clip_benchmark/cli.py `dump`
TASK_METRICS = {                     # clip_benchmark/metrics/zeroshot_classification.py, zeroshot_retrieval.py
    "zeroshot_classification": {"acc1", "acc5", "mean_per_class_recall"},
    "zeroshot_retrieval": {f"{side}_retrieval_recall@{k}" for side in ("image", "text") for k in (1, 5, 10)},
}


def _build_row(data: dict) -> dict:
    """What CLIP_benchmark's ``build`` command does with a result file (cli.py main_build.process_file)."""
    row = dict(data)
    row.update(data["metrics"])
    del row["metrics"]
    row["model_fullname"] = row["model"] + " " + row["pretrained"]
    return row


def test_metrics_map_to_clip_benchmarks_names_and_official_rules():
    from negft.eval_cmd import clip_benchmark_results
    m = {"zeroshot/imagenet/top1": 0.5, "zeroshot/imagenet/top1_official": 0.6,
         "zeroshot/imagenet/mean_per_class_recall_official": 0.55, "zeroshot/shapes/top1_official": 1.0,
         "zeroshot/shapes/mean_per_class_recall_official": 1.0,
         "retrieval/coco/r1_official": 0.1, "retrieval/coco/i2t_r1_official": 0.2, "retrieval/coco/r1": 0.0,
         "retrieval/coco/r5_official": 0.3, "retrieval/coco/i2t_r5_official": 0.4,
         "retrieval_neg/coco/r5_official": 0.25, "retrieval_neg/coco/i2t_r5_official": 0.35,
         "mcq_neg/coco/acc_official": 0.9}
    got = {(r["dataset"], r["task"]): r for r in clip_benchmark_results(m, "ViT-B-32", "runs/x/epoch_3")}
    assert set(got) == {("imagenet", "zeroshot_classification"), ("shapes", "zeroshot_classification"),
                        ("coco", "zeroshot_retrieval"), ("coco_negated", "zeroshot_retrieval")}
    for r in got.values():
        assert set(r) == KEYS and r["language"] == "en" and r["pretrained"] == "runs/x/epoch_3"
    assert got["imagenet", "zeroshot_classification"]["metrics"]["acc1"] == 0.6
    assert math.isnan(got["imagenet", "zeroshot_classification"]["metrics"]["acc5"])    # not reported: NaN
    assert got["coco", "zeroshot_retrieval"]["metrics"] == {
        "image_retrieval_recall@1": 0.1, "text_retrieval_recall@1": 0.2,
        "image_retrieval_recall@5": 0.3, "text_retrieval_recall@5": 0.4}
    assert got["coco_negated", "zeroshot_retrieval"]["metrics"]["image_retrieval_recall@5"] == 0.25


def test_eval_writes_clip_benchmark_files_read_back_against_its_keys(tmp_path, cache):
    from negft import models
    from negft.eval_cmd import evaluate_checkpoint
    torch.manual_seed(0)
    b = models.build("negft-tiny", "")
    ckpt = tmp_path / "epoch_1"
    models.save(b.model, ckpt, b.model_cfg, b.preprocess_cfg)
    out = tmp_path / "eval"
    evaluate_checkpoint(str(ckpt), str(out), "negft-tiny", "", "zeroshot,retrieval,retrieval_neg", "world", "test",
                        "64", "20", str(cache / "world-s0-tiny"), format="clip_benchmark")
    metrics = json.loads((out / "results.json").read_text())["metrics"]
    files = sorted(p.name for p in (out / "clip_benchmark").iterdir())
    assert files == ["world_epoch_1_negft-tiny_en_zeroshot_classification.json",
                     "world_epoch_1_negft-tiny_en_zeroshot_retrieval.json",
                     "world_negated_epoch_1_negft-tiny_en_zeroshot_retrieval.json"]
    for name in files:
        data = json.loads((out / "clip_benchmark" / name).read_text())
        assert set(data) == KEYS
        assert name == f"{data['dataset']}_epoch_1_{data['model']}_{data['language']}_{data['task']}.json"
        assert data["model"] == "negft-tiny" and data["pretrained"] == str(ckpt)
        assert set(data["metrics"]) == TASK_METRICS[data["task"]]
        assert all(0.0 <= v <= 1.0 for v in data["metrics"].values())
        assert _build_row(data)["model_fullname"] == f"negft-tiny {ckpt}"
        if data["task"] == "zeroshot_classification":
            assert data["metrics"]["acc1"] == metrics["zeroshot/world/top1_official"]
            assert data["metrics"]["acc5"] == metrics["zeroshot/world/top5_official"]
        elif data["dataset"] == "world":
            assert data["metrics"]["image_retrieval_recall@5"] == metrics["retrieval/world/r5_official"]
            assert data["metrics"]["text_retrieval_recall@10"] == metrics["retrieval/world/i2t_r10_official"]
        else:
            assert data["metrics"]["image_retrieval_recall@1"] == metrics["retrieval_neg/world/r1_official"]


def test_an_unknown_format_is_refused_before_anything_runs(tmp_path, capsys):
    assert run_eval([f"ckpt={tmp_path}", f"out={tmp_path / 'out'}", "format=csv"]) == 2
    assert "format" in capsys.readouterr().err and not (tmp_path / "out").exists()
