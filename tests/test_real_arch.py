"""Real architectures train from every kind of weights source: a file, a training checkpoint, a local-dir."""
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from negft import models
from tests.conftest import run_here

SMOKE = ["recipe=negfull", "data=world", "world.size=tiny", "eval.suite=none", "train.workers=0",
         "train.precision=fp32", "train.zero_stage=0", "epochs=1", "train.steps_per_epoch=1",
         "streams.negcap.batch_size=2", "streams.negmcq.batch_size=2", "optim.lr=1e-4", "optim.warmup_steps=1",
         "model.world_arch=ViT-B-32", "tower=vt"]


@pytest.fixture(scope="module")
def vit_b32(tmp_path_factory):
    """ViT-B-32 with random weights, written as a safetensors file and a local-dir (the open_clip training
    checkpoint is written by the test that reads it, a slow one); its 1.2 GB of files go with the module."""
    import shutil
    root = tmp_path_factory.mktemp("vitb32")
    torch.manual_seed(0)
    bundle = models.build("ViT-B-32", "")
    state = {k: v.contiguous() for k, v in bundle.model.state_dict().items()}
    save_file(state, str(root / "vitb32.safetensors"))
    models.save(bundle.model, root / "local", bundle.model_cfg, bundle.preprocess_cfg)
    yield root, state
    shutil.rmtree(root)


@pytest.mark.parametrize("source", ["vitb32.safetensors", pytest.param("epoch_1.pt", marks=pytest.mark.slow)])
def test_vit_b32_trains_on_world_images_resized_to_224(vit_b32, cache, tmp_path, source):
    root, before = vit_b32
    if source == "epoch_1.pt":      # an open_clip training checkpoint: {'state_dict': {'module.' + key: ...}}
        torch.save({"epoch": 1, "state_dict": {f"module.{k}": v for k, v in before.items()}}, root / source)
    pretrained = f"local-dir:{root / source}" if source == "local" else str(root / source)
    run = tmp_path / "run"
    proc = run_here(["train.py", *SMOKE, f"model.world_pretrained={pretrained}", f"out={run}",
                     f"world.cache={cache}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    ckpt = run / "checkpoints" / "epoch_1"
    cfg = json.loads((ckpt / models.CONFIG_FILE).read_text())
    assert cfg["model_cfg"]["vision_cfg"]["image_size"] == 224
    after = load_file(str(ckpt / models.WEIGHTS_FILE))
    assert after.keys() == before.keys()
    assert not torch.equal(after["visual.conv1.weight"], before["visual.conv1.weight"]), "no step was taken"


def test_a_local_dir_base_is_the_same_vit_b32_as_its_file(vit_b32):
    """The third form a base comes in (``local-dir:``, what negft writes) builds the model the file trains above."""
    root, before = vit_b32
    bundle = models.build("", f"local-dir:{root / 'local'}")
    after = bundle.model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    assert bundle.model.visual.image_size == (224, 224)


def test_a_missing_tag_names_what_was_looked_for_and_how_to_pass_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    import socket
    lookups = []

    def no_network(host, *args, **kwargs):
        lookups.append(host)
        raise socket.gaierror(socket.EAI_NONAME, "no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    with pytest.raises(FileNotFoundError) as err:
        models.build("ViT-B-32", "laion2b_s34b_b79k")
    msg = str(err.value)
    assert "laion2b_s34b_b79k" in msg and "model.pretrained=/path/to/" in msg and "local-dir:" in msg
    assert lookups == []        # the cache only: the hub was not asked (it used to be, 10 times, about 45 s)


def test_a_model_read_from_a_file_is_built_without_random_draws(tmp_path, monkeypatch):
    """Weights read strictly right after the build (a file, a local-dir): torch.nn.init draws no parameter just to
    have it overwritten, the weights are the file's, and the initialisers are themselves again after. A
    local-dir without a weights file is a random model, drawn as ever."""
    import collections
    drawn = collections.Counter()
    for name in models.RANDOM_INITS:
        init = getattr(torch.nn.init, name)
        monkeypatch.setattr(torch.nn.init, name, lambda *a, _n=name, _f=init, **k: drawn.update([_n]) or _f(*a, **k))
    counted = {name: getattr(torch.nn.init, name) for name in models.RANDOM_INITS}
    made = models.build("negft-tiny", "")
    assert drawn["normal_"] > 0
    want = made.model.state_dict()
    save_file({k: v.contiguous() for k, v in want.items()}, str(tmp_path / "w.safetensors"))
    models.save(made.model, tmp_path / "local", made.model_cfg, made.preprocess_cfg)
    for source in (str(tmp_path / "w.safetensors"), f"local-dir:{tmp_path / 'local'}"):
        drawn.clear()
        got = models.build("negft-tiny", source).model.state_dict()
        assert not drawn, (source, drawn)
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), source
        assert {name: getattr(torch.nn.init, name) for name in models.RANDOM_INITS} == counted
    (tmp_path / "local" / models.WEIGHTS_FILE).unlink()
    models.build("", f"local-dir:{tmp_path / 'local'}")
    assert drawn["normal_"] > 0
