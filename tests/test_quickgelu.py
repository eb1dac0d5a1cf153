"""The QuickGELU trap: OpenAI's weights in a file, loaded as the plain architecture, must get QuickGELU.

open_clip's ``ViT-B-32`` builds GELU; OpenAI trained with QuickGELU. A checkpoint file passed by path
carries no activation, and ``create_model_and_transforms("ViT-B-32", pretrained=FILE)`` builds GELU
silently. A tiny ViT stands in for ViT-B-32 here: ``negft-tiny`` builds GELU, its ``-quickgelu`` twin
QuickGELU, and an ``openai`` tag registered for it (a file) makes it an architecture with QuickGELU weights.
"""
import json
import warnings

import open_clip
import pytest
import torch
from safetensors.torch import save_file

from negft import models
from negft.config import ConfigError
from negft.commands.eval import EvalKeys, evaluate_checkpoint
from tests.conftest import run_here

ARCH = "negft-tiny"
TWIN = "negft-tiny-quickgelu"
JIT_BUFFERS = {"input_resolution": torch.tensor(64), "context_length": torch.tensor(32),
               "vocab_size": torch.tensor(49408)}


@pytest.fixture(autouse=True)
def twin(monkeypatch):
    models.register()
    monkeypatch.setitem(open_clip.factory._MODEL_CONFIGS, TWIN,
                        {**open_clip.get_model_config(ARCH), "quick_gelu": True})


@pytest.fixture
def original():
    """A random QuickGELU model as open_clip builds it (0-d logit_scale, OpenAI's key layout)."""
    torch.manual_seed(0)
    model = open_clip.create_model(TWIN).eval()
    with torch.no_grad():      # random weights big enough for the activation to matter
        for name, p in model.named_parameters():
            if "mlp.c_fc" in name:
                p.normal_(0, 0.5)
    return model


@pytest.fixture
def openai_file(original, tmp_path):
    """``original``'s state dict as OpenAI's non-JIT CLIP writes one: the same keys as open_clip's CLIP."""
    path = tmp_path / "openai_plain.pt"
    torch.save(original.state_dict(), path)
    return path


@pytest.fixture
def openai_tag(monkeypatch, openai_file):
    """Register an ``openai`` tag for ``negft-tiny`` whose weights (``openai_file``) used QuickGELU."""
    cfg = open_clip.pretrained._pcfg(file=str(openai_file), quick_gelu=True)
    monkeypatch.setitem(open_clip.pretrained._PRETRAINED, ARCH, {"openai": cfg})
    return "openai"


def embed(model):
    g = torch.Generator().manual_seed(1)
    images = torch.randn(3, 3, 64, 64, generator=g)
    tokens = open_clip.get_tokenizer(ARCH)(["a red cube left of a ball", "no dog here", "two cats"])
    with torch.no_grad():
        return model.eval().encode_image(images), model.encode_text(tokens)


def assert_same(model, original, atol=1e-6):
    for got, want in zip(embed(model), embed(original)):
        torch.testing.assert_close(got, want, atol=atol, rtol=0)


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_openai_layout_file_gets_quick_gelu_and_the_same_embeddings(original, tmp_path, suffix):
    # a state dict saved from OpenAI's TorchScript model carries its three extra buffers
    path = tmp_path / f"openai_jit_state{suffix}"
    state = {**original.state_dict(), **JIT_BUFFERS}
    torch.save(state, path) if suffix == ".pt" else save_file(state, str(path))
    bundle = models.build(ARCH, str(path))
    assert models.activation(bundle.model) == "quick_gelu"
    assert bundle.model_cfg["quick_gelu"] is True        # a checkpoint written from it records it
    assert_same(bundle.model, original)
    assert models.activation(models.build(ARCH, str(path), quick_gelu=False).model) == "gelu"  # the user said


def test_the_naive_load_is_wrong_and_negft_refuses_to_guess(original, openai_file, openai_tag):
    naive, _, _ = open_clip.create_model_and_transforms(ARCH, pretrained=str(openai_file))
    assert models.activation(naive) == "gelu"
    for got, want in zip(embed(naive), embed(original)):
        assert (got - want).abs().max() > 1e-3, "the trap: same weights, wrong activation, other embeddings"
    # OpenAI's plain state dict, a LAION one and a fine-tuned one look alike: the user must say
    with pytest.raises(ConfigError) as err:
        models.build(ARCH, str(openai_file))
    assert "model.quick_gelu=true|false" in str(err.value) and TWIN in str(err.value)
    assert_same(models.build(ARCH, str(openai_file), quick_gelu=True).model, original)
    assert_same(models.build(TWIN, str(openai_file)).model, original)
    assert models.activation(models.build(ARCH, str(openai_file), quick_gelu=False).model) == "gelu"


def test_an_architecture_without_quick_gelu_weights_builds_as_named(openai_file):
    assert models.activation(models.build(ARCH, str(openai_file)).model) == "gelu"


def test_a_quick_gelu_tag_builds_quick_gelu_without_a_mismatch_warning(original, openai_tag):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bundle = models.build(ARCH, openai_tag)
    assert not [w for w in caught if "QuickGELU" in str(w.message)]
    assert models.activation(bundle.model) == "quick_gelu" and bundle.model_cfg["quick_gelu"] is True
    assert_same(bundle.model, original)
    assert models.activation(models.build(ARCH, openai_tag, quick_gelu=False).model) == "gelu"


def test_non_openai_checkpoints_are_unaffected(openai_tag, tmp_path):
    torch.manual_seed(2)
    gelu = models.build(ARCH, "")
    assert models.activation(gelu.model) == "gelu"
    # a negft checkpoint (local-dir) records its activation, even for an arch with QuickGELU weights
    models.save(gelu.model, tmp_path / "gelu", gelu.model_cfg, gelu.preprocess_cfg)
    loaded = models.build(ARCH, f"local-dir:{tmp_path / 'gelu'}")
    assert models.activation(loaded.model) == "gelu"
    assert_same(loaded.model, gelu.model)
    # one written before negft recorded quick_gelu: an absent key is GELU, as it was built
    cfg_file = tmp_path / "gelu" / models.CONFIG_FILE
    cfg = json.loads(cfg_file.read_text())
    del cfg["model_cfg"]["quick_gelu"]
    cfg_file.write_text(json.dumps(cfg))
    assert models.activation(models.build(ARCH, str(tmp_path / "gelu")).model) == "gelu"
    # a QuickGELU checkpoint comes back QuickGELU
    qg = models.build(TWIN, "")
    models.save(qg.model, tmp_path / "qg", qg.model_cfg, qg.preprocess_cfg)
    assert models.activation(models.build("", f"local-dir:{tmp_path / 'qg'}").model) == "quick_gelu"
    # a bare file written from a negft model (1-element logit_scale) builds as named
    save_file({k: v.contiguous() for k, v in gelu.model.state_dict().items()}, str(tmp_path / "negft.safetensors"))
    bare = models.build(ARCH, str(tmp_path / "negft.safetensors"))
    assert models.activation(bare.model) == "gelu"
    assert_same(bare.model, gelu.model)


def test_a_torchscript_archive_is_refused_not_run(tmp_path):
    path = tmp_path / "ViT-B-32.pt"
    torch.jit.script(torch.nn.Linear(2, 2)).save(str(path))
    with pytest.raises(ConfigError) as err:
        models.build(ARCH, str(path))
    assert "TorchScript" in str(err.value) and "model.pretrained=openai" in str(err.value)


def test_activation_names_each_tower_when_they_differ():
    model = models.build(ARCH, "").model
    model.transformer.resblocks[0].mlp.gelu = open_clip.transformer.QuickGELU()
    assert models.activation(model) == "t:gelu+quick_gelu,v:gelu"


def test_eval_and_train_print_the_activation(tmp_path, cache, capsys):
    qg = models.build(TWIN, "")
    ckpt = tmp_path / "qg"
    models.save(qg.model, ckpt, qg.model_cfg, qg.preprocess_cfg)
    evaluate_checkpoint(EvalKeys(ckpt=str(ckpt), out=str(tmp_path / "eval"), suite="none", batch_size=8,
                                 bootstrap=10))
    assert "act=quick_gelu" in capsys.readouterr().out
    run = tmp_path / "run"
    proc = run_here(["train.py", "recipe=negfull", "data=world", "world.size=tiny", "eval.suite=none",
                     "train.workers=0", "epochs=1", "train.steps_per_epoch=1", "streams.negcap.batch_size=2",
                     "streams.negmcq.batch_size=2", f"model.world_arch={ARCH}", f"model.world_pretrained={ckpt}",
                     "model.quick_gelu=false", f"out={run}", f"world.cache={cache}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "act=gelu" in proc.stdout
    ckpt_config = json.loads((run / "checkpoints" / "epoch_1" / models.CONFIG_FILE).read_text())
    assert ckpt_config["model_cfg"]["quick_gelu"] is False
