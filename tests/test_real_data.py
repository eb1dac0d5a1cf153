"""The real-data path end to end: released files → `negft data convert|negate|relcomp` → `negft data check`
→ `train.py` with `data=real` (a ViT small enough for CPU, a random-init weights file as the "pretrained"
model) → a checkpoint that plain open_clip loads. The files are written in the released layouts with world
images (negft/world/formats/: coco, img2dataset, negbench_csv, visual_genome)."""
import json

import pytest
import torch

from negft import models
from negft.world.formats import coco, img2dataset, negbench_csv
from negft.world.formats.visual_genome import write_vg_example

from conftest import run_cli, run_here

SMALL = ["model.arch=negft-tiny", "train.precision=fp32", "train.zero_stage=0", "train.workers=0", "epochs=1",
         "eval.bootstrap=50", "optim.warmup_steps=1",
         "eval.suite=mcq_neg,retrieval,zeroshot"]   # geometry would encode ImageNet's 24,000 captions (no data needed)


def _negft(*args, env):
    return run_here(["-m", "negft", *args], env=env)


def _random_init_file(path) -> str:
    """A weights file of the kind a user passes as model.pretrained, here with random weights."""
    from safetensors.torch import save_file
    model = models.build("negft-tiny", "").model
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return str(path)


def _loads_in_plain_open_clip(ckpt, env) -> None:
    """A fresh process with no negft import loads the checkpoint and encodes with it."""
    code = ("import open_clip, torch; m, _, pre = open_clip.create_model_and_transforms('local-dir:%s'); "
            "tok = open_clip.get_tokenizer('local-dir:%s'); "
            "print(m.encode_text(tok(['a photo with no dog'])).shape)") % (ckpt, ckpt)
    proc = run_cli(["-c", code], env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "torch.Size([1," in proc.stdout


def test_negbench_csvs_to_a_negfull_run(tmp_path):
    data, src = tmp_path / "data", tmp_path / "released"
    env = {"NEGFT_DATA": str(data), "NEGFT_CACHE": str(tmp_path / "cache")}
    cap = negbench_csv.write_negcap_example(src, 24, bad=True)
    mcq = negbench_csv.write_mcq_example(src, 24, bad=True)

    # 1. an empty data root: the check lists what is missing, train.py refuses before writing anything
    assert _negft("data", "check", "cc12m_negcap", env=env).returncode == 1
    # 2. convert: both CSVs into one sample per image
    proc = _negft("data", "convert", "negbench-negcap", cap["csv"], cap["images"], f"mcq={mcq['csv']}",
                  f"out={data / 'cc12m_negfull'}", env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    written = json.loads((data / "cc12m_negfull" / "manifest.json").read_text())
    assert summary["counts"] == written["counts"] and written["fields"]["mcq"] == mcq["good"]
    assert written["fields"]["negcap"] >= cap["good"]
    assert set(written["skipped"]) == set(cap["skipped"]) | set(mcq["skipped"])     # every planted reason
    # 3. check
    for name in ("cc12m_negcap", "cc12m_negmcq"):
        proc = _negft("data", "check", name, "checksums=true", env=env)
        assert proc.returncode == 0, proc.stdout
    # 4. train: NegFull on the converted shards, epoch length from the converter's count
    out = tmp_path / "run"
    weights = _random_init_file(tmp_path / "w.safetensors")
    proc = run_here(["train.py", "recipe=negfull", f"model.pretrained={weights}", *SMALL, "streams.negcap.batch_size=8",
                     "streams.negmcq.batch_size=4", f"out={out}"], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ledger = [json.loads(line) for line in (out / "ledger.jsonl").read_text().splitlines()]
    steps = written["fields"]["negcap"] // 8           # the first stream's samples set the epoch
    assert [e["epoch"] for e in ledger] == [0, 1] and ledger[1]["step"] == steps
    assert any("data not found" in v for v in ledger[0]["skipped"].values())    # real probes absent: named
    ckpt = out / "checkpoints" / "epoch_1"
    assert models.negft_info(ckpt)["data"] == "real"
    _loads_in_plain_open_clip(ckpt, env)


@pytest.mark.slow
def test_img2dataset_coco_negate_and_visual_genome_to_runs(tmp_path):
    """The other released formats through their converters into the recipes that read them."""
    data, src = tmp_path / "data", tmp_path / "released"
    env = {"NEGFT_DATA": str(data), "NEGFT_CACHE": str(tmp_path / "cache")}
    weights = _random_init_file(tmp_path / "w.safetensors")

    i2d = img2dataset.write_img2dataset_example(src / "i2d", 32, bad=True)
    assert _negft("data", "convert", "img2dataset", i2d["folder"], i2d["negcap"], f"mcq={i2d['mcq']}",
                  f"out={data / 'cc12m_negfull'}", env=env).returncode == 0
    c = coco.write_coco_example(src / "coco", 40, bad=True)
    assert _negft("data", "convert", "coco", c["captions"], c["instances"], c["images"],
                  f"out={data / 'coco_control'}", env=env).returncode == 0
    assert _negft("data", "negate", c["captions"], c["images"], f"labels={c['instances']}",
                  f"out={data / 'coco_negfull'}", env=env).returncode == 0
    vg = write_vg_example(src / "vg", 40, bad=True)
    assert _negft("data", "relcomp", vg["relationships"], vg["images"], f"exclude={','.join(vg['exclude'])}",
                  f"out={data / 'relcomp_train'}", env=env).returncode == 0
    for name in ("cc12m_negcap", "cc12m_negmcq", "coco_control", "coco_negfull", "relcomp_train"):
        proc = _negft("data", "check", name, env=env)
        assert proc.returncode == 0, proc.stdout

    runs = {
        "negfull": ["recipe=negfull", "streams.negcap.batch_size=8", "streams.negmcq.batch_size=4"],
        "negfull_coco": ["recipe=negfull", "streams.negcap.manifest=coco_negfull", "streams.negmcq.manifest=coco_negfull",
                         "streams.negcap.batch_size=8", "streams.negmcq.batch_size=4"],
        "control": ["recipe=cc12m", "streams.cc12m.manifest=coco_control", "streams.cc12m.batch_size=8"],
        "relcomp": ["recipe=relcomp", "streams.relcomp.batch_size=8"],
    }
    for name, args in runs.items():
        out = tmp_path / name
        proc = run_here(["train.py", *args, f"model.pretrained={weights}", *SMALL, "max_steps=2", f"out={out}"],
                        env=env)
        assert proc.returncode == 0, (name, proc.stderr[-3000:])
        _loads_in_plain_open_clip(out / "checkpoints" / "epoch_1", env)
        trained = models.build("", f"local-dir:{out / 'checkpoints' / 'epoch_1'}").model.state_dict()
        start = models.build("negft-tiny", weights).model.state_dict()
        assert any(not torch.equal(trained[k], start[k]) for k in start), name
