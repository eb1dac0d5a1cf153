"""End to end on the tiny world: a run directory as the CONTRACT says, loadable by plain open_clip."""
import json
import shutil
import sys

import pytest
import torch

from tests.conftest import REPO, run_cli

REQUIRED = ["mcq_neg/world/acc", "mcq_neg/world/acc_affirmation", "mcq_neg/world/acc_negation",
            "mcq_neg/world/acc_hybrid", "retrieval/world/r1", "retrieval/world/r5", "retrieval/world/r10",
            "retrieval_neg/world/r1", "retrieval_neg/world/r5", "retrieval_neg/world/r10", "zeroshot/world/top1",
            "relcomp/world/text", "relcomp/world/image", "relcomp/world/group"]
QUICK = ["data=world", "world.size=tiny", "eval.bootstrap=50", "train.workers=0"]


def _check_run_dir(run, epochs):
    assert (run / "config.yaml").exists() and (run / "report.md").exists()
    ledger = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    assert [entry["epoch"] for entry in ledger] == list(range(epochs + 1))
    for entry in ledger:
        for key in REQUIRED:
            assert key in entry["metrics"] and len(entry["ci95"][key]) == 2
            lo, hi = entry["ci95"][key]
            assert lo <= entry["metrics"][key] <= hi
        assert entry["time"].endswith("Z") and "skipped" in entry
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    ckpt = run / "checkpoints" / f"epoch_{epochs}"
    assert (ckpt / "open_clip_model.safetensors").exists() and (ckpt / "open_clip_config.json").exists()
    assert "mcq_neg/world/acc" in (run / "report.md").read_text()
    return ckpt


@pytest.fixture(scope="module")
def demo_run(cache, tmp_path_factory):
    run = tmp_path_factory.mktemp("demo") / "run"
    proc = run_cli(["train.py", "recipe=demo", f"out={run}", f"world.cache={cache}", "epochs=2",
                    "train.steps_per_epoch=2", *QUICK])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run, proc


def test_demo_writes_the_contract_run_directory(demo_run, cache):
    run, proc = demo_run
    _check_run_dir(run, 2)
    # the base model came from the cached world-pretrain run, itself a complete run directory
    base_runs = list((cache / "base").glob("world-pretrain-*/run"))
    assert len(base_runs) == 1
    assert (base_runs[0].parent / "model" / "open_clip_model.safetensors").exists()


def test_checkpoint_loads_in_plain_open_clip_in_a_new_process(demo_run, tmp_path):
    from negft import models
    run, _ = demo_run
    ckpt = run / "checkpoints" / "epoch_2"
    bundle = models.build("", str(ckpt))
    torch.manual_seed(0)
    image = torch.rand(2, 3, 64, 64)
    tokens = bundle.tokenizer(["a red star on the beach", "there is no circle"])
    torch.save({"image": image, "tokens": tokens}, tmp_path / "inputs.pt")
    with torch.no_grad():
        expected_img = bundle.model.eval().encode_image(image)
        expected_txt = bundle.model.encode_text(tokens)
    script = (
        "import sys, torch, open_clip\n"
        f"m, _, _ = open_clip.create_model_and_transforms('local-dir:{ckpt}')\n"
        f"x = torch.load('{tmp_path / 'inputs.pt'}', weights_only=True)\n"
        "with torch.no_grad():\n"
        "    out = {'img': m.eval().encode_image(x['image']), 'txt': m.encode_text(x['tokens'])}\n"
        f"torch.save(out, '{tmp_path / 'out.pt'}')\n")
    proc = run_cli(["-c", script])
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = torch.load(tmp_path / "out.pt", weights_only=True)
    torch.testing.assert_close(got["img"], expected_img)
    torch.testing.assert_close(got["txt"], expected_txt)


def test_eval_cli_on_a_checkpoint(demo_run, tmp_path):
    run, _ = demo_run
    out = tmp_path / "eval"
    proc = run_cli(["eval.py", f"ckpt={run / 'checkpoints' / 'epoch_1'}", f"out={out}", "bootstrap=50"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert set(REQUIRED) <= set(results["metrics"])
    assert (out / "results.md").exists() and list((out / "examples").glob("mcq_neg__world.jsonl"))
    bad = run_cli(["eval.py", f"ckpt={run}", f"out={out}", "suite=nope"])
    assert bad.returncode == 2 and "nope" in bad.stderr


@pytest.mark.skipif(shutil.which("deepspeed", path=str(REPO / ".venv" / "bin")) is None and
                    shutil.which("deepspeed") is None, reason="deepspeed launcher not installed")
def test_deepspeed_two_ranks_on_cpu(demo_run, cache, tmp_path):
    """The DeepSpeed launcher starts two gloo ranks here; they write one complete run directory."""
    import subprocess
    launcher = shutil.which("deepspeed", path=str(REPO / ".venv" / "bin")) or shutil.which("deepspeed")
    run = tmp_path / "ds"
    proc = subprocess.run([launcher, "--num_gpus", "2", "--master_port", "29561", "train.py", "recipe=demo",
                           f"out={run}", f"world.cache={cache}", "epochs=1", "train.steps_per_epoch=2", *QUICK],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 rank(s)" in proc.stdout
    _check_run_dir(run, 1)
