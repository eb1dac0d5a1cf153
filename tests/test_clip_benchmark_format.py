"""``eval.py ... format=clip_benchmark``: one result JSON per dataset and task in LAION-AI/CLIP_benchmark's layout
(clip_benchmark/cli.py: keys dataset, model, pretrained, task, metrics, language; file
{dataset}_{pretrained}_{model}_{language}_{task}.json), read back against those keys, its file name and its
``build`` rows, and its ``model`` / ``pretrained`` loaded the way CLIP_benchmark loads them."""
import json
import math
import os

import numpy as np
import open_clip
import pytest
import torch
from PIL import Image

from negft.commands.eval import main as run_eval

KEYS = {"dataset", "model", "pretrained", "task", "metrics", "language"}     # clip_benchmark/cli.py `dump`
TASK_METRICS = {                     # clip_benchmark/metrics/zeroshot_classification.py, zeroshot_retrieval.py
    "zeroshot_classification": {"acc1", "acc5", "mean_per_class_recall"},
    "zeroshot_retrieval": {f"{side}_retrieval_recall@{k}" for side in ("image", "text") for k in (1, 5, 10)},
}


def _build_row(data: dict) -> dict:
    """What CLIP_benchmark's ``build`` command does with a result file (cli.py main_build.process_file)."""
    row = dict(data["metrics"])
    row.update(data)
    del row["metrics"]
    row["model_fullname"] = row["model"] + " " + row["pretrained"]
    return row


def _output_name(data: dict, template: str = "{dataset}_{pretrained}_{model}_{language}_{task}.json") -> str:
    """The name CLIP_benchmark's ``run`` (cli.py) formats its default ``--output`` with, from the arguments the
    file records: a ``pretrained`` file by its base name, ``dataset`` without ``wds/`` and with ``/`` as ``_``."""
    pretrained = data["pretrained"]
    dataset = data["dataset"][len("wds/"):] if data["dataset"].startswith("wds/") else data["dataset"]
    return template.format(model=data["model"], task=data["task"], language=data["language"],
                           pretrained=os.path.basename(pretrained) if os.path.isfile(pretrained) else pretrained,
                           dataset=dataset.replace("/", "_"))


def test_metrics_map_to_clip_benchmarks_names_and_official_rules():
    from negft.clip_benchmark import clip_benchmark_results
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
        assert set(r) == KEYS | {"not_rerunnable"} and r["language"] == "en" and r["pretrained"] == "runs/x/epoch_3"
        assert f"'{r['dataset'].removesuffix('_negated')}' is negft's name for" in r["not_rerunnable"]
    assert got["imagenet", "zeroshot_classification"]["metrics"]["acc1"] == 0.6
    assert math.isnan(got["imagenet", "zeroshot_classification"]["metrics"]["acc5"])    # not reported: NaN
    f32 = np.float32                      # retrieval as CLIP_benchmark writes it: a float32 mean, .item()
    assert got["coco", "zeroshot_retrieval"]["metrics"] == {
        "image_retrieval_recall@1": f32(0.1), "text_retrieval_recall@1": f32(0.2),
        "image_retrieval_recall@5": f32(0.3), "text_retrieval_recall@5": f32(0.4)}
    assert got["coco", "zeroshot_retrieval"]["metrics"]["image_retrieval_recall@1"] != 0.1
    assert got["coco_negated", "zeroshot_retrieval"]["metrics"]["image_retrieval_recall@5"] == 0.25
    assert all(type(v) is float for r in got.values() for v in r["metrics"].values())


def test_eval_writes_clip_benchmark_files_read_back_against_its_keys(tmp_path, cache, capsys):
    from negft import models
    from negft.commands.eval import EvalKeys, evaluate_checkpoint
    torch.manual_seed(0)
    b = models.build("negft-tiny", "")
    ckpt = tmp_path / "epoch_1"
    models.save(b.model, ckpt, b.model_cfg, b.preprocess_cfg)
    out = tmp_path / "eval"
    evaluate_checkpoint(EvalKeys(ckpt=str(ckpt), out=str(out), suite="zeroshot,retrieval,retrieval_neg", data="world", batch_size=64, bootstrap=20,
                                 world_dir=str(cache / "world-s0-tiny"), format="clip_benchmark"))
    assert "negft.models.register()" in capsys.readouterr().out        # what a user must do for a tiny arch
    metrics = json.loads((out / "results.json").read_text())["metrics"]
    weights = str(ckpt / "open_clip_model.safetensors")
    files = sorted(p.name for p in (out / "clip_benchmark").iterdir())
    assert set(files) == {"world_open_clip_model.safetensors_negft-tiny_en_zeroshot_classification.json",
                          "world_open_clip_model.safetensors_negft-tiny_en_zeroshot_retrieval.json",
                          "world_negated_open_clip_model.safetensors_negft-tiny_en_zeroshot_retrieval.json"}
    for name in files:
        data = json.loads((out / "clip_benchmark" / name).read_text())
        assert list(data) == ["dataset", "model", "pretrained", "task", "metrics", "language", "not_rerunnable"]
        assert name == _output_name(data)
        assert data["model"] == "negft-tiny" and data["pretrained"] == weights
        assert set(data["metrics"]) == TASK_METRICS[data["task"]]
        assert all(0.0 <= v <= 1.0 for v in data["metrics"].values())
        assert _build_row(data)["model_fullname"] == f"negft-tiny {weights}"
        if data["task"] == "zeroshot_classification":                    # float64 there: count / n, sklearn
            assert data["metrics"]["acc1"] == metrics["zeroshot/world/top1_official"]
            assert data["metrics"]["acc5"] == metrics["zeroshot/world/top5_official"]
        elif data["dataset"] == "world":                                  # float32 there: .float().mean().item()
            assert data["metrics"]["image_retrieval_recall@5"] == float(np.float32(metrics["retrieval/world/r5_official"]))
            assert data["metrics"]["text_retrieval_recall@10"] == float(
                np.float32(metrics["retrieval/world/i2t_r10_official"]))
        else:
            assert data["metrics"]["image_retrieval_recall@1"] == float(
                np.float32(metrics["retrieval_neg/world/r1_official"]))

    # `pretrained` loads as CLIP_benchmark loads it (clip_benchmark/models/open_clip.py), to the checkpoint's model
    model, _, preprocess = open_clip.create_model_and_transforms(data["model"], pretrained=data["pretrained"])
    tokenizer = open_clip.get_tokenizer(data["model"])
    ref = models.build("", str(ckpt))
    image = Image.fromarray(np.random.default_rng(0).integers(0, 256, (80, 96, 3), dtype=np.uint8))
    texts = ["a red circle above a blue square", "no triangle"]
    model.eval(), ref.model.eval()
    with torch.no_grad():
        for m, pre, tok in ((model, preprocess, tokenizer), (ref.model, ref.preprocess_val, ref.tokenizer)):
            m.got = (m.encode_image(pre(image)[None]), m.encode_text(tok(texts)))
    torch.testing.assert_close(model.got[0], ref.model.got[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.got[1], ref.model.got[1], rtol=1e-5, atol=1e-5)


def test_the_model_name_rebuilds_the_recorded_activation():
    """CLIP_benchmark passes only a name and a weights file to open_clip, and a file records no activation."""
    from negft.clip_benchmark import clip_benchmark_model, clip_benchmark_notes
    vit = open_clip.get_model_config("ViT-B-32")
    assert clip_benchmark_model({**vit, "quick_gelu": True, "nonscalar_logit_scale": True}, "ViT-B-32") == \
        "ViT-B-32-quickgelu"
    assert clip_benchmark_model({**vit, "quick_gelu": False}, "ViT-B-32-quickgelu") == "ViT-B-32"
    tiny = {**open_clip.get_model_config("negft-tiny"), "quick_gelu": True}
    assert clip_benchmark_model(tiny, "negft-tiny") is None
    pp = {"size": [64, 64], "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]}
    notes = clip_benchmark_notes(None, "negft-tiny", tiny, pp, "w.safetensors")
    assert "cannot rebuild it" in notes[0] and "mean" in notes[1] and "std" in notes[1] and "size" not in notes[1]
    side = open_clip.get_model_config("negft-tiny")["vision_cfg"]["image_size"]
    assert isinstance(side, int) and len(clip_benchmark_notes(None, "negft-tiny", tiny, {"size": side}, "w")) == 1
    assert "size" in clip_benchmark_notes(None, "negft-tiny", tiny, {"size": side + 1}, "w")[1]


def test_an_unknown_format_is_refused_before_anything_runs(tmp_path, capsys):
    assert run_eval([f"ckpt={tmp_path}", f"out={tmp_path / 'out'}", "format=csv"]) == 2
    assert "format" in capsys.readouterr().err and not (tmp_path / "out").exists()


def test_webdataset_files_carry_a_clip_benchmark_eval_command_that_names_existing_files(tmp_path, monkeypatch,
                                                                                          capsys):
    """Read from CLIP_benchmark's webdataset layout, a file's dataset, dataset_root, split, model, pretrained and
    task form ``clip_benchmark eval``'s arguments (cli.py ``run``: ``--dataset_root`` formatted with ``{dataset}``
    and ``{dataset_cleaned}``, ``wds/`` dropped from the name) naming the folder that was read and the weights; a
    folder with samples CLIP_benchmark stops on is marked not re-runnable."""
    from negft import models
    from negft.clip_benchmark import clip_benchmark_eval_args
    from negft.commands.eval import EvalKeys, evaluate_checkpoint
    from negft.world.formats.clip_benchmark_wds import write_clip_benchmark_example
    data_root = tmp_path / "data{x}"                 # a brace CLIP_benchmark's str.format must not read as a field
    written = write_clip_benchmark_example(data_root / "clip_benchmark", n=8, broken=True)
    monkeypatch.setenv("NEGFT_DATA", str(data_root))
    torch.manual_seed(0)
    b = models.build("negft-tiny", "")
    ckpt = tmp_path / "epoch_1"
    models.save(b.model, ckpt, b.model_cfg, b.preprocess_cfg)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "eval"
    evaluate_checkpoint(EvalKeys(ckpt="epoch_1", out=str(out), suite="zeroshot", data="real", batch_size=64,
                                 bootstrap=20, format="clip_benchmark"))
    printed = capsys.readouterr().out
    metrics = json.loads((out / "results.json").read_text())["metrics"]
    files = {json.loads(p.read_text())["dataset"]: (p.name, json.loads(p.read_text()))
             for p in (out / "clip_benchmark").iterdir()}
    assert set(files) == {"wds/world_shapes", "wds/world_captions", "world_colors"}

    name, colors = files.pop("world_colors")         # broken=True: 3 samples CLIP_benchmark raises on
    assert "3 samples" in colors["not_rerunnable"] and "dataset_root" not in colors
    with pytest.raises(ValueError, match="not re-runnable"):
        clip_benchmark_eval_args(colors)

    for dataset, (name, data) in files.items():
        folder = data_root / "clip_benchmark" / ("wds_" + dataset.removeprefix("wds/"))
        args = clip_benchmark_eval_args(data)
        assert f"rerun {dataset}: python -c" in printed                  # negft-tiny: through register()
        assert args[:2] == ["eval", "--dataset"] and "--no_amp" in args
        opt = dict(zip(args[1:], args[2:]))
        assert opt["--dataset"] == dataset
        short = dataset.removeprefix("wds/")
        root = opt["--dataset_root"].format(dataset=short, dataset_cleaned=short.replace("/", "-"))
        assert root == data["dataset_root"] == str(folder) and os.path.isabs(root)
        shards = int((folder / opt["--split"] / "nshards.txt").read_text())
        assert shards >= 1 and all((folder / "test" / f"{i}.tar").is_file() for i in range(shards))
        assert os.path.isfile(opt["--pretrained"]) and opt["--pretrained"] == str(ckpt / "open_clip_model.safetensors")
        models.register()
        assert open_clip.get_model_config(opt["--model"]) is not None and opt["--model"] == "negft-tiny"
        assert name == _output_name(data)                               # the file CLIP_benchmark would write
        if dataset == "wds/world_shapes":
            assert opt["--task"] == "zeroshot_classification" and "--recall_k" not in args
            assert data["metrics"]["acc1"] == metrics["zeroshot/world_shapes/top1_official"]
        else:                  # 4 images: recall@5 and @10 are beyond CLIP_benchmark's topk, left out
            assert (folder / "dataset_type.txt").read_text().strip() == "retrieval"
            assert opt["--task"] == "zeroshot_retrieval" and args[args.index("--recall_k") + 1:] == ["1"]
            assert len(written["wds_world_captions"]["captions"]) == 4
            assert set(data["metrics"]) == {"image_retrieval_recall@1", "text_retrieval_recall@1"}
            assert data["metrics"]["text_retrieval_recall@1"] == float(
                np.float32(metrics["zeroshot_retrieval/world_captions/i2t_r1_official"]))
