"""Untrusted files: a pickle that carries code, passed as ``model.pretrained``, ``ckpt=`` or
``base=`` (a bare pickle, a ``.pt`` zip of one, or a local-dir's ``.bin``), is refused with negft's message naming
the file and what to pass instead, and never runs (its planted side effect does not happen); a release whose
files fail ``SHA256SUMS`` is refused by eval.py and ``negft patch`` unless ``verify=false``; a release never
overwrites."""
import os
import pickle
import shutil

import pytest
import torch

from negft.commands import cli
from negft import models
from negft.config import ConfigError
from negft.release import SUMS, release, sha256, verify
from tests.conftest import run_here


class _Plant:
    """Unpickling this creates the file ``marker``: the side effect a malicious weights file would have."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


@pytest.fixture()
def evil(tmp_path):
    """{name: path} of weights files whose pickle creates ``tmp_path / 'RAN'`` when loaded, and that marker."""
    marker = tmp_path / "RAN"
    files = {"pickle": tmp_path / "evil.bin", "zip": tmp_path / "evil.pt"}
    with open(files["pickle"], "wb") as f:
        pickle.dump({"state_dict": {"logit_scale": torch.ones(1)}, "x": _Plant(marker)}, f)
    torch.save({"state_dict": {"logit_scale": torch.ones(1)}, "x": _Plant(marker)}, files["zip"])
    # the payload is live: an unguarded load runs it (here with its marker pointed elsewhere)
    probe = tmp_path / "probe.pt"
    torch.save(_Plant(tmp_path / "PROBE"), probe)
    torch.load(probe, weights_only=False)
    assert (tmp_path / "PROBE").exists()
    # a local-dir whose weights are the zip, as open_clip_pytorch_model.bin
    tiny = models.build("negft-tiny", "")
    folder = models.save(tiny.model, tmp_path / "evil_dir", tiny.model_cfg, tiny.preprocess_cfg)
    (folder / models.WEIGHTS_FILE).unlink()
    shutil.copyfile(files["zip"], folder / "open_clip_pytorch_model.bin")
    files["local-dir"] = folder
    return files, marker


def _refusal(text: str, path) -> None:
    assert f"'{path}'" in text and "safetensors" in text and "local-dir:" in text and "nothing in it ran" in text


def test_a_pickle_carrying_code_as_model_pretrained_is_refused_and_never_runs(evil):
    files, marker = evil
    for kind in ("pickle", "zip"):
        with pytest.raises(ConfigError) as e:
            models.build("negft-tiny", str(files[kind]))
        _refusal(str(e.value), files[kind])
    with pytest.raises(ConfigError) as e:
        models.build("", models.LOCAL_DIR + str(files["local-dir"]))
    _refusal(str(e.value), files["local-dir"] / "open_clip_pytorch_model.bin")
    assert not marker.exists()


def test_train_refuses_it_with_exit_2_before_writing(evil, cache, tmp_path):
    """train.py with model.pretrained=<a .pt zip of a pickle carrying code> on real-format shards."""
    files, marker = evil
    shard = sorted((cache / "world-s0-tiny" / "finetune").glob("*.tar"))[0]
    out = tmp_path / "run"
    proc = run_here(["train.py", "recipe=negcap", "model.arch=negft-tiny", f"model.pretrained={files['zip']}",
                     f"streams.negcap.urls={shard}", "train.steps_per_epoch=1", "train.precision=fp32",
                     "train.workers=0", f"out={out}"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    _refusal(proc.stderr, files["zip"])
    assert not marker.exists() and not out.exists()


def test_eval_and_patch_refuse_it_as_ckpt_and_base(evil, tmp_path, capsys):
    files, marker = evil
    tiny = models.build("negft-tiny", "")
    good = models.save(tiny.model, tmp_path / "good", tiny.model_cfg, tiny.preprocess_cfg)
    for ckpt, arch in ((files["zip"], ["model=negft-tiny"]), (files["pickle"], ["model=negft-tiny"]),
                       (files["local-dir"], [])):       # a directory carries its architecture
        assert cli.main(["eval", f"ckpt={ckpt}", *arch, f"out={tmp_path / 'eval'}"]) == 2
        assert "nothing in it ran" in capsys.readouterr().err
    for base in (files["zip"], files["local-dir"]):
        assert cli.main(["patch", f"base={base}", f"finetuned={good}", "arch=negft-tiny",
                         f"out={tmp_path / 'patch'}"]) == 2
        assert "nothing in it ran" in capsys.readouterr().err
    assert not marker.exists()
    assert not (tmp_path / "eval").exists() and not (tmp_path / "patch").exists()


@pytest.fixture()
def released(tmp_path):
    tiny = models.build("negft-tiny", "")
    ckpt = models.save(tiny.model, tmp_path / "ckpt", tiny.model_cfg, tiny.preprocess_cfg)
    return release(str(ckpt), str(tmp_path / "release")), ckpt


def test_a_release_that_fails_its_sha256sums_is_refused_unless_verify_false(released, tmp_path, capsys,
                                                                            monkeypatch):
    rel, ckpt = released
    weights = rel / models.WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF                        # one bit of one weight: the file still loads
    weights.write_bytes(bytes(data))
    assert verify(rel) == [models.WEIGHTS_FILE]
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path / "no-data"))
    for target in (rel, weights):           # the folder, or the file inside it
        assert cli.main(["eval", f"ckpt={target}", "suite=mcq_neg", f"out={tmp_path / 'eval'}"]) == 2
        err = capsys.readouterr().err
        assert models.WEIGHTS_FILE in err and SUMS in err and "verify=false" in err
    assert cli.main(["patch", "base=recorded", f"finetuned={rel}", f"out={tmp_path / 'patch'}"]) == 2
    assert "finetuned" in capsys.readouterr().err
    assert cli.main(["patch", f"base={rel}", f"finetuned={ckpt}", f"out={tmp_path / 'patch'}"]) == 2
    assert "base" in capsys.readouterr().err and not (tmp_path / "patch").exists()
    # verify=false: the user takes it as it is (and it is evaluated: here on no data, so nothing is scored, exit 1)
    assert cli.main(["eval", f"ckpt={rel}", "suite=mcq_neg", "verify=false", f"out={tmp_path / 'eval'}"]) == 1
    err = capsys.readouterr().err
    assert "nothing was scored" in err and SUMS not in err and (tmp_path / "eval" / "results.json").exists()
    assert cli.main(["eval", f"ckpt={rel}", "verify=maybe", f"out={tmp_path / 'x'}"]) == 2
    # a garbled SHA256SUMS line is a failure too, not a crash
    (rel / SUMS).write_text((rel / SUMS).read_text() + "not a checksum line\n")
    assert any(f"{SUMS} line" in b for b in verify(rel))


def test_a_release_never_overwrites(released, tmp_path):
    rel, ckpt = released
    before = {p.name: sha256(p) for p in rel.iterdir()}
    with pytest.raises(FileExistsError, match="never overwritten"):
        release(str(ckpt), str(rel))
    (tmp_path / "empty").mkdir()
    (tmp_path / "a-file").write_text("x")
    for out in ("empty", "a-file"):
        with pytest.raises(FileExistsError):
            release(str(ckpt), str(tmp_path / out))
    assert {p.name: sha256(p) for p in rel.iterdir()} == before and verify(rel) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".release")]     # no temporary left
    assert os.listdir(tmp_path / "empty") == []
