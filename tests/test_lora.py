"""model.lora: peft's adapters on the text tower train alone; every checkpoint holds the merged plain open_clip weights,
which compute what the adapted model computes."""
import open_clip
import pytest
import torch
from safetensors.torch import load_file

from negft import lora, models
from negft.config import ConfigError, LoraCfg, load_config
from tests.conftest import run_here
from tests.test_towers import QUICK, _random_model

RANK = 4


def _tokens(model, n=6, seed=1):
    """Random token rows of varied length, each ended by the end-of-text token (the highest id)."""
    g = torch.Generator().manual_seed(seed)
    ctx, vocab = model.positional_embedding.shape[0], model.vocab_size
    tokens = torch.randint(1, vocab - 1, (n, ctx), generator=g)
    ends = torch.randint(3, ctx, (n,), generator=g)
    tokens[torch.arange(n), ends] = vocab - 1
    tokens[torch.arange(ctx)[None] > ends[:, None]] = 0
    return tokens


def _adapted(base_dir, seed=0):
    """The base model with adapters whose B (zero at the start) is random: a model that has trained."""
    model = models.build("", f"local-dir:{base_dir}").model.eval()
    lora.inject(model, LoraCfg(rank=RANK))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    return model


def _plain_model(state, base_dir):
    model = models.build("", f"local-dir:{base_dir}").model.eval()
    model.load_state_dict(state, strict=True)
    return model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return _random_model("negft-tiny", tmp_path_factory)


def test_merged_weights_compute_what_the_adapters_do(base):
    model = _adapted(base)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    merged = lora.plain_state(model)
    plain = _plain_model(merged, base)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()), "the live model changed"
    assert merged.keys() == plain.state_dict().keys()
    tokens = _tokens(model)
    with torch.no_grad():
        adapted, trimmed = model.encode_text(tokens), models.encode_text_trimmed(model, tokens)
        ours = plain.encode_text(tokens)
        unadapted = _plain_model(load_file(str(base / models.WEIGHTS_FILE)), base).encode_text(tokens)
    torch.testing.assert_close(ours, adapted, rtol=0, atol=1e-5)
    torch.testing.assert_close(trimmed, adapted, rtol=0, atol=1e-5)     # the block loop runs the adapters too
    assert (adapted - unadapted).abs().max() > 1e-3, "the default targets must change the text features"


@pytest.fixture(scope="module")
def lora_run(base, cache, tmp_path_factory):
    run = tmp_path_factory.mktemp("lora") / "run"
    proc = run_here(["train.py", *QUICK, "tower=t", f"model.lora.rank={RANK}", "model.train_logit_scale=false",
                     f"model.world_pretrained=local-dir:{base}", f"out={run}", f"world.cache={cache}"])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return run / "checkpoints" / "epoch_1"


def test_checkpoint_is_the_merged_model_in_plain_open_clip(base, lora_run):
    """The checkpoint loads in open_clip alone, equals the merge of the adapters DeepSpeed's resume state holds, and
    encodes text as the adapted model does."""
    model, _, _ = open_clip.create_model_and_transforms(f"local-dir:{lora_run}")
    saved = load_file(str(lora_run / models.WEIGHTS_FILE))
    assert not any(lora.is_adapter(k) or lora.BASE in k for k in saved)
    ds = torch.load(lora_run / "state" / "ds" / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    adapted = models.build("", f"local-dir:{base}").model.eval()
    lora.inject(adapted, LoraCfg(rank=RANK))
    adapted.load_state_dict({k.removeprefix("clip."): v for k, v in ds["module"].items() if k.startswith("clip.")})
    assert any(p.abs().max() > 0 for n, p in adapted.named_parameters() if ".lora_B." in n), "the adapters trained"
    for k, v in lora.plain_state(adapted).items():
        torch.testing.assert_close(saved[k], v.float(), rtol=0, atol=1e-6, msg=k)
    tokens = _tokens(model)
    with torch.no_grad():
        torch.testing.assert_close(model.eval().encode_text(tokens), adapted.encode_text(tokens), rtol=0, atol=1e-5)


def test_only_the_adapters_train(base, lora_run):
    """Every weight but the adapted linear layers' comes out bit-identical; those carry the adapters' deltas."""
    before = load_file(str(base / models.WEIGHTS_FILE))
    after = load_file(str(lora_run / models.WEIGHTS_FILE))
    assert before.keys() == after.keys()
    adapted = {k for k in before
               if k.endswith(("mlp.c_fc.weight", "mlp.c_proj.weight")) and not k.startswith("visual.")}
    assert len(adapted) == 6        # negft-tiny's 3 text blocks
    for k in before:
        assert torch.equal(before[k], after[k]) != (k in adapted), k


@pytest.mark.parametrize("args,key", [
    (["model.lora.rank=-1"], "model.lora.rank"),
    (["model.lora.alpha=0"], "model.lora.alpha"),
    (["model.lora.dropout=1.0"], "model.lora.dropout"),
    (["model.lora.rank=4", "tower=v"], "tower=v"),
    (["model.lora.rank=4", "model.lock_text_unlocked_layers=1"], "model.lock_text_unlocked_layers"),
    (["model.lora.rank=4", "patch.alpha=0.5"], "patch.alpha"),
    (["model.lora.rank=4", "loss.guard.l2sp=0.1"], "loss.guard.l2sp"),
])
def test_bad_lora_values_are_refused_by_name(args, key):
    with pytest.raises(ConfigError) as e:
        load_config(["recipe=negfull", *args])
    assert key in str(e.value)


@pytest.mark.parametrize("target,says", [("attn.out_proj", "does not call it"), ("attn", "does not call it"),
                                         ("ln_1", "not an nn.Linear"), ("mlp.nothing", "no module")])
def test_targets_that_would_do_nothing_are_refused(bundle, target, says):
    with pytest.raises(ConfigError, match="model.lora.targets") as e:
        lora.targets(bundle.model, [target])
    assert says in str(e.value)
