"""End to end on the tiny world: a run directory as README.md describes it, loadable by plain open_clip."""
import json
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import run_cli, run_here

REQUIRED = ["mcq_neg/world/acc", "mcq_neg/world/acc_affirmation", "mcq_neg/world/acc_negation",
            "mcq_neg/world/acc_hybrid", "retrieval/world/r1", "retrieval/world/r5", "retrieval/world/r10",
            "retrieval_neg/world/r1", "retrieval_neg/world/r5", "retrieval_neg/world/r10", "zeroshot/world/top1",
            "relcomp/world/text", "relcomp/world/image", "relcomp/world/group"]
# the demo recipe's runs at a test's cost: its streams' batches of 64 cut to 16 (a run's files do not depend on them)
QUICK = ["data=world", "world.size=tiny", "eval.bootstrap=50", "train.workers=0", "streams.negcap.batch_size=16",
         "streams.negmcq.batch_size=16"]
# the probes of REQUIRED's metrics: the runs here check the run directory, the patching and the release, which
# any probe shows; every probe of the default suite runs on the world in test_probes.py
REQUIRED_SUITE = "mcq_neg,retrieval,retrieval_neg,zeroshot,relcomp"


def _check_run_dir(run, epochs, required=REQUIRED):
    assert (run / "config.yaml").exists() and (run / "report.md").exists()
    ledger = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    assert [entry["epoch"] for entry in ledger] == list(range(epochs + 1))
    for entry in ledger:
        for key in required:
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
def demo_run(cache, world_pretrain, tmp_path_factory):
    run = tmp_path_factory.mktemp("demo") / "run"
    proc = run_here(["train.py", "recipe=demo", f"out={run}", f"world.cache={cache}", "epochs=2",
                     "train.steps_per_epoch=2", "patch.alpha=0.0", "patch.alphas=0,1", "patch.towers=t", *QUICK,
                     world_pretrain, f"eval.suite={REQUIRED_SUITE}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run, proc


def test_demo_writes_the_contract_run_directory(demo_run, cache):
    run, proc = demo_run
    _check_run_dir(run, 2)
    # patch.alpha: the patched model is evaluated after every epoch; at α = 0 it is the base model
    ledger = [json.loads(line) for line in (run / "ledger.jsonl").read_text().splitlines()]
    assert "patched" not in ledger[0] and "paired_p" not in ledger[0]
    for entry in ledger[1:]:
        assert entry["patched"]["alpha"] == 0.0 and entry["patched"]["metrics"] == ledger[0]["metrics"]
        assert set(REQUIRED) <= entry["paired_p"].keys() <= entry["metrics"].keys()
    report = (run / "report.md").read_text()
    assert "Patched model after each epoch" in report
    # patch.sweep: the run ends with a sweep of its last epoch and a release of the selected model
    assert (run / "patch" / "selected.json").exists() and (run / "release" / "SHA256SUMS").exists()
    assert "(patch/sweep.png)" in report and "(release/README.md)" in report
    # its test-split numbers are the run's own evaluations: the base's and the selected model's are the ledger's
    # epoch 0 and last epoch (α is 0 or 1 here)
    sel = json.loads((run / "patch" / "selected.json").read_text())
    assert sel["test"]["base_metrics"] == pytest.approx(ledger[0]["metrics"], abs=1e-6)
    assert sel["test"]["metrics"] == pytest.approx(ledger[-1 if sel["alpha"] == 1.0 else 0]["metrics"], abs=1e-6)
    # the base model came from the cached run of the world-pretrain recipe (shortened), itself a complete run
    # directory
    base_runs = list((cache / "base").glob("world-pretrain-*/run"))
    assert len(base_runs) == 1
    assert (base_runs[0].parent / "model" / "open_clip_model.safetensors").exists()


def test_patch_takes_the_runs_test_results_for_the_base_and_the_unpatched_model(demo_run, tmp_path, monkeypatch):
    """The pipeline hands the patch step its run's ledger results (``test_results``): the base's is reported as
    given, and so is the fine-tuned checkpoint's when the selected model is it weight for weight; a patched
    selection is evaluated."""
    from negft import patching
    from negft.patching import Rule
    run, _ = demo_run
    planted = {name: {"metrics": {"planted": v}, "ci95": {"planted": [v, v]}, "skipped": {}}
               for name, v in (("base", 1.0), ("finetuned", 2.0))}
    evaluations = []
    real = patching.run_suite
    monkeypatch.setattr(patching, "run_suite", lambda *a, **k: evaluations.append(1) or real(*a, **k))
    for alpha in (1.0, 0.5):
        monkeypatch.setattr(patching, "select", lambda rule, rows, a=alpha: next(r for r in rows if r["alpha"] == a))
        evaluations.clear()
        out = tmp_path / f"alpha{alpha}"
        patching.patch("recorded", run / "checkpoints" / "epoch_2", out, [0.5, 1.0], ["t"],
                        Rule(["mcq_neg/*/acc"], [], 1.0), suite=REQUIRED_SUITE, bootstrap=20,
                        test_results=planted)
        test = json.loads((out / "selected.json").read_text())["test"]
        assert test["base_metrics"] == {"planted": 1.0} and test["base_ci95"] == {"planted": [1.0, 1.0]}
        if alpha == 1.0:            # the sweep's three (α = 0, 0.5, 1 on val), none on test
            assert test["metrics"] == {"planted": 2.0} and len(evaluations) == 3
        else:
            assert set(REQUIRED) <= set(test["metrics"]) and len(evaluations) == 4


@pytest.fixture(scope="module")
def released(demo_run, tmp_path_factory):
    """``negft patch`` on the demo run's last checkpoint (a sweep on val, the selection, its test report), then
    ``negft release`` of the selected model: (the patch folder, the release folder)."""
    run, _ = demo_run
    tmp = tmp_path_factory.mktemp("released")
    out, rel = tmp / "patch", tmp / "release"
    proc = run_here(["-m", "negft", "patch", "base=recorded", f"finetuned={run / 'checkpoints' / 'epoch_2'}",
                     f"out={out}", "alphas=0,0.5", "towers=t,vt", "bootstrap=50", f"suite={REQUIRED_SUITE}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    proc = run_here(["-m", "negft", "release", f"ckpt={out / 'selected'}", f"out={rel}"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, rel


TEXTS = ["a red star on the beach", "there is no circle"]
# a fresh interpreter that never imports negft: each local-dir in argv through plain open_clip (model, transforms
# and tokenizer), its image and text embeddings of two seeded random images and TEXTS, saved per folder
PLAIN_OPEN_CLIP = f"""import json, sys, torch, open_clip
out = {{}}
for folder in sys.argv[2:]:
    m = open_clip.create_model_and_transforms('local-dir:' + folder)[0].eval()
    tok = open_clip.get_tokenizer('local-dir:' + folder)
    torch.manual_seed(0)
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        out[folder] = {{'img': m.encode_image(x), 'txt': m.encode_text(tok({TEXTS!r}))}}
out['negft imported'] = torch.tensor([any(n == 'negft' or n.startswith('negft.') for n in sys.modules)])
torch.save(out, sys.argv[1])
"""


@pytest.fixture(scope="module")
def in_plain_open_clip(demo_run, released, tmp_path_factory):
    """{folder: embeddings} of the demo run's last checkpoint and of the release, computed by plain open_clip in one
    new process (its imports cost seconds: one process serves both)."""
    run, _ = demo_run
    path = tmp_path_factory.mktemp("plain") / "features.pt"
    folders = [str(run / "checkpoints" / "epoch_2"), str(released[1])]
    proc = run_cli(["-c", PLAIN_OPEN_CLIP, str(path), *folders])
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = torch.load(path, weights_only=True)
    assert not got.pop("negft imported").item()
    return got


def test_checkpoint_loads_in_plain_open_clip_in_a_new_process(demo_run, in_plain_open_clip):
    from negft import models
    run, _ = demo_run
    ckpt = run / "checkpoints" / "epoch_2"
    bundle = models.build("", str(ckpt))
    torch.manual_seed(0)
    image = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        expected_img = bundle.model.eval().encode_image(image)
        expected_txt = bundle.model.encode_text(bundle.tokenizer(TEXTS))
    got = in_plain_open_clip[str(ckpt)]
    torch.testing.assert_close(got["img"], expected_img)
    torch.testing.assert_close(got["txt"], expected_txt)


def test_eval_cli_on_a_checkpoint(demo_run, tmp_path):
    run, _ = demo_run
    out = tmp_path / "eval"
    # the run's suite and a probe that draws a figure (every probe of the default suite runs on the world in
    # test_probes.py, and on the released layouts in test_benchmarks_real.py)
    proc = run_here(["eval.py", f"ckpt={run / 'checkpoints' / 'epoch_1'}", f"out={out}", "bootstrap=50",
                     "base=recorded", f"suite={REQUIRED_SUITE},geometry"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    results = json.loads((out / "results.json").read_text())
    assert set(REQUIRED) <= set(results["metrics"])
    # against the base model: its metrics equal the run's epoch 0 (every metric the run's suite has), with a
    # paired p-value per metric
    epoch0 = json.loads((run / "ledger.jsonl").read_text().splitlines()[0])["metrics"]
    assert {k: results["base_metrics"][k] for k in epoch0} == pytest.approx(epoch0, abs=1e-9)
    assert set(REQUIRED) <= set(results["paired_p"]) and all(0 <= p <= 1 for p in results["paired_p"].values())
    assert (out / "figures" / "geometry__world.png").exists()
    assert (out / "results.md").exists() and list((out / "examples").glob("mcq_neg__world.jsonl"))
    bad = run_here(["eval.py", f"ckpt={run}", f"out={out}", "suite=nope"])
    assert bad.returncode == 2 and "nope" in bad.stderr


def test_patch_sweep_then_release(demo_run, released, in_plain_open_clip, tmp_path):
    """negft patch: sweep on val, selection, test report, a loadable selected model; the t-mode rows and the
    selected model's test numbers, which reuse the base model's features, equal a from-scratch evaluation.
    negft release: checksums, a card, the same embeddings in a fresh process; a corrupted file is caught; an
    existing out refused."""
    import shutil

    import open_clip
    from PIL import Image
    from negft.evaluation import datasets_for, run_suite
    from negft.patching import load_pair
    from negft.patching import interpolate
    from negft.release import verify
    run, _ = demo_run
    ckpt, (out, rel) = run / "checkpoints" / "epoch_2", released
    rows = [json.loads(line) for line in (out / "sweep.jsonl").read_text().splitlines()]
    assert sorted((r["tower"], r["alpha"]) for r in rows) == [(m, a) for m in ("t", "vt") for a in (0.0, 0.5)]
    assert all(r["split"] == "val" and set(REQUIRED) <= set(r["metrics"]) for r in rows)
    sel = json.loads((out / "selected.json").read_text())
    recorded = yaml.safe_load((run / "config.yaml").read_text())["patch"]["targets"]
    assert "largest mean gain" in sel["rule"] and sel["targets"] == recorded == [
        "mcq_neg/*/acc", "mcq_neg/*/acc_negation", "retrieval_neg/*/r5"]
    assert (sel["tower"], sel["alpha"]) in {(r["tower"], r["alpha"]) for r in rows}
    assert set(REQUIRED) <= set(sel["test"]["metrics"]) and sel["val"]["drift"] <= sel["max_drift"]
    from negft import probes
    assert sel["provenance"]["probe_versions"]["mcq_neg"] == probes.VERSIONS["mcq_neg"]   # the card shows it
    assert Image.open(out / "sweep.png").size[0] > 100

    bundle, base_state, ft_state, info = load_pair("recorded", str(ckpt))
    bundle.model.load_state_dict(interpolate(base_state, ft_state, 0.5, "t"))
    naive = run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer,
                     datasets_for(Path(info["world_dir"]) / "val"), suite=REQUIRED_SUITE, n_boot=50)
    cached = next(r for r in rows if (r["tower"], r["alpha"]) == ("t", 0.5))["metrics"]
    assert cached == pytest.approx(naive.metrics, abs=1e-6)
    # the selected model's test numbers, which reuse the base's features of the tower its mode leaves, too
    bundle.model.load_state_dict(interpolate(base_state, ft_state, sel["alpha"], sel["tower"]))
    naive = run_suite(bundle.model, bundle.preprocess_val, bundle.tokenizer,
                     datasets_for(Path(info["world_dir"]) / "test"), suite=REQUIRED_SUITE, n_boot=50)
    assert sel["test"]["metrics"] == pytest.approx(naive.metrics, abs=1e-6)

    assert sorted(p.name for p in rel.iterdir()) == ["README.md", "SHA256SUMS", "open_clip_config.json",
                                                      "open_clip_model.safetensors"]
    card = (rel / "README.md").read_text()
    assert f"α = {sel['alpha']}" in card and "| mcq_neg/world/acc |" in card and "Known limits" in card
    assert verify(rel) == []
    # the release in a fresh process equals the source checkpoint through plain open_clip: negft feeds a ResNet
    # tower channels-last images, whose convolutions round differently in the last bits
    src = open_clip.create_model_and_transforms(f"local-dir:{out / 'selected'}")[0].eval()
    tok = open_clip.get_tokenizer(f"local-dir:{out / 'selected'}")
    torch.manual_seed(0)
    x = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        want = {"img": src.encode_image(x), "txt": src.encode_text(tok(TEXTS))}
    got = in_plain_open_clip[str(rel)]
    assert torch.equal(got["img"], want["img"]) and torch.equal(got["txt"], want["txt"])

    again = run_here(["-m", "negft", "release", f"ckpt={out / 'selected'}", f"out={rel}"])
    assert again.returncode == 2 and "exists" in again.stderr
    corrupted = Path(shutil.copytree(rel, tmp_path / "corrupted"))
    weights = corrupted / "open_clip_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert verify(corrupted) == ["open_clip_model.safetensors"]


def test_report_stars_changes_that_a_paired_test_supports(tmp_path):
    import numpy as np
    from negft.probes.stats import paired_p_values
    from negft.train.ledger import Ledger, write_report
    rng = np.random.default_rng(0)
    base = rng.integers(0, 2, 300).astype(float)
    gained = np.maximum(base, rng.integers(0, 2, 300) * (rng.random(300) < 0.4))
    shuffled = base[rng.permutation(300)]
    first = {"a/w/acc": base, "b/w/acc": base}
    for epoch, values in ((0, first), (1, {"a/w/acc": gained, "b/w/acc": shuffled})):
        extra = {"paired_p": paired_p_values(first, values)} if epoch else {}
        Ledger(tmp_path).append(epoch, epoch, {k: float(v.mean()) for k, v in values.items()},
                                {k: [0.0, 1.0] for k in values}, {}, **extra)
    report = write_report(tmp_path, "t").read_text()
    row = {line.split("|")[1].strip(): line for line in report.splitlines() if line.startswith("| ")}
    assert row["a/w/acc"].rstrip(" |").endswith("\\*")
    assert not row["b/w/acc"].rstrip(" |").endswith("\\*")
