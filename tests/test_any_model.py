"""Anyone's model: ``eval.py model=ARCH pretrained=TAG``, ``ckpt=hf-hub:ORG/NAME`` and ``ckpt=local-dir:DIR`` load
through open_clip, offline, with the activation the weights' record says (a tag's ``quick_gelu``, a config's), and
``negft.evaluate`` scores any model with ``encode_image`` / ``encode_text`` as eval.py does.

Nothing is downloaded: the tests write the Hugging Face cache as a download leaves it
(``models--ORG--NAME/snapshots/<rev>/...`` + ``refs/main``) and register a tag whose ``hf_hub`` record points there,
which is where open_clip's ``download_pretrained`` looks (``open_clip_model.safetensors`` first, the safe alternative
of its default ``open_clip_pytorch_model.bin``: ``pretrained.py``, ``_get_safe_alternatives``)."""
import json
import shutil

import open_clip
import pytest
import torch

import negft
from negft import models
from negft.probes.base import EvalContext
from tests.conftest import run_here

ARCH = "negft-tiny"
TWIN = "negft-tiny-quickgelu"
REV = "0123456789abcdef0123456789abcdef01234567"
SUITE = "zeroshot"                           # the cheapest: which weights and which activation show in it
WRAPPED_SUITE = "zeroshot,mcq_neg,probe_r"   # probe_r reads the logit scale
TAG = "negfttest"


@pytest.fixture(autouse=True)
def hub(tmp_path, monkeypatch):
    """An empty Hugging Face cache under tmp_path, offline: what a download would read and write."""
    import huggingface_hub.constants as constants
    root = tmp_path / "hf" / "hub"
    root.mkdir(parents=True)
    for key, value in (("HF_HOME", str(tmp_path / "hf")), ("HF_HUB_CACHE", str(root)),
                       ("HUGGINGFACE_HUB_CACHE", str(root)), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(key, value)
    # read by huggingface_hub once, at import: its module constants are what a download looks at
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(root))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    models.register()
    monkeypatch.setitem(open_clip.factory._MODEL_CONFIGS, TWIN,
                        {**open_clip.get_model_config(ARCH), "quick_gelu": True})
    return root


def put_on_hub(root, repo: str, files: dict) -> None:
    """``files`` ({name: source path}) as the Hub cache holds a downloaded revision of ``repo``."""
    org, name = repo.split("/")
    folder = root / f"models--{org}--{name}"
    (folder / "snapshots" / REV).mkdir(parents=True)
    for target, source in files.items():
        shutil.copy(source, folder / "snapshots" / REV / target)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(REV)


def tiny(tmp_path, arch=ARCH, seed=0):
    """A random ``arch`` saved as a negft checkpoint directory (open_clip_config.json + safetensors)."""
    torch.manual_seed(seed)
    b = models.build(arch, "")
    with torch.no_grad():      # random weights big enough for the activation to matter
        for name, p in b.model.named_parameters():
            if "mlp.c_fc" in name:
                p.normal_(0, 0.5)
    return models.save(b.model, tmp_path / f"{arch}-{seed}", b.model_cfg, b.preprocess_cfg)


def register_tag(monkeypatch, repo: str, quick_gelu: bool) -> None:
    """A pretrained tag ``TAG`` of ``ARCH`` whose weights are Hub repository ``repo``'s default file."""
    cfg = open_clip.pretrained._pcfg(hf_hub=f"{repo}/", quick_gelu=quick_gelu)
    monkeypatch.setitem(open_clip.pretrained._PRETRAINED, ARCH, {TAG: cfg})


def run_eval(tmp_path, cache, name, *keys, suite=SUITE):
    out = tmp_path / name
    proc = run_here(["eval.py", *keys, f"out={out}", f"suite={suite}", "data=world", "bootstrap=20",
                     f"world_dir={cache / 'world-s0-tiny'}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((out / "results.json").read_text()), proc.stdout


def plain(value) -> str:
    """``value`` as JSON text: numbers compared as written (NaN equal to NaN)."""
    return json.dumps(value, sort_keys=True)


def same_numbers(a: dict, b: dict) -> bool:
    return all(plain(a[k]) == plain(b[k]) for k in ("metrics", "ci95", "skipped"))


def test_hf_hub_scores_as_the_directory_it_was_pushed_from(tmp_path, cache, hub):
    ckpt = tiny(tmp_path)
    put_on_hub(hub, "negft-test/tiny", {n: ckpt / n for n in (models.CONFIG_FILE, models.WEIGHTS_FILE)})
    local, _ = run_eval(tmp_path, cache, "dir", f"ckpt={ckpt}")
    hubbed, out = run_eval(tmp_path, cache, "hub", "ckpt=hf-hub:negft-test/tiny", "format=clip_benchmark")
    assert same_numbers(local, hubbed) and local["metrics"]
    assert hubbed["ckpt"] == "hf-hub:negft-test/tiny" and "act=gelu" in out
    # CLIP_benchmark rebuilds it as open_clip.create_model_and_transforms("hf-hub:negft-test/tiny")
    files = list((tmp_path / "hub" / "clip_benchmark").iterdir())
    assert [p.name for p in files] == ["world__hf-hub:negft-test_tiny_en_zeroshot_classification.json"]
    data = json.loads(files[0].read_text())
    assert data["model"] == "hf-hub:negft-test/tiny" and data["pretrained"] == ""
    as_dir, _ = run_eval(tmp_path, cache, "local-dir", f"ckpt=local-dir:{ckpt}")
    assert same_numbers(local, as_dir) and as_dir["ckpt"] == f"local-dir:{ckpt}"


def test_a_hub_model_not_in_the_cache_exits_2_saying_where_it_looked(tmp_path, hub, capsys):
    from negft.commands import cli
    assert cli.main(["eval", "ckpt=hf-hub:negft-test/absent", f"out={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert "not in the Hugging Face cache" in err and str(hub) in err and "local-dir:DIR" in err
    assert not (tmp_path / "o").exists()


def test_a_tag_loads_the_weights_open_clip_finds_for_it(tmp_path, cache, hub, monkeypatch):
    ckpt = tiny(tmp_path)
    put_on_hub(hub, "negft-test/tiny-tag", {models.WEIGHTS_FILE: ckpt / models.WEIGHTS_FILE})
    register_tag(monkeypatch, "negft-test/tiny-tag", quick_gelu=False)
    built = models.build(ARCH, TAG).model.state_dict()
    saved = models.build("", str(ckpt)).model.state_dict()
    assert all(torch.equal(built[k], saved[k]) for k in saved)
    local, _ = run_eval(tmp_path, cache, "dir", f"ckpt={ckpt}")
    tagged, out = run_eval(tmp_path, cache, "tag", f"model={ARCH}", f"pretrained={TAG}")
    assert same_numbers(local, tagged) and "act=gelu" in out
    assert tagged["model"] == ARCH and tagged["pretrained"] == TAG and "ckpt" not in tagged
    # base= takes the same forms: the tag beside the Hub copy of its weights (the architecture from its config)
    put_on_hub(hub, "negft-test/tiny", {n: ckpt / n for n in (models.CONFIG_FILE, models.WEIGHTS_FILE)})
    paired, out = run_eval(tmp_path, cache, "paired", "ckpt=hf-hub:negft-test/tiny", f"base={TAG}")
    assert f"base {TAG}: act=gelu" in out and plain(paired["base_metrics"]) == plain(paired["metrics"])


def test_an_unknown_tag_exits_2_naming_the_nearest(tmp_path, monkeypatch, capsys):
    from negft.commands import cli
    register_tag(monkeypatch, "negft-test/tiny-tag", quick_gelu=False)
    assert cli.main(["eval", f"model={ARCH}", "pretrained=negftest", f"out={tmp_path / 'o'}"]) == 2
    err = capsys.readouterr().err
    assert "pretrained 'negftest' is neither a file nor a known tag" in err and f"Nearest tags: {TAG}" in err
    assert cli.main(["eval", "model=ViT-B-32", "pretrained=opnai", f"out={tmp_path / 'o'}"]) == 2
    assert "Nearest tags: openai" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_quick_gelu_weights_are_scored_with_quick_gelu_by_every_path(tmp_path, cache, hub, monkeypatch):
    """The same QuickGELU weights as a tag whose record says quick_gelu, on the Hub and in a local-dir whose config
    says it: QuickGELU each time, the same numbers, and not the numbers the GELU architecture gives them."""
    ckpt = tiny(tmp_path, TWIN)
    assert json.loads((ckpt / models.CONFIG_FILE).read_text())["model_cfg"]["quick_gelu"] is True
    put_on_hub(hub, "negft-test/tiny-qg", {n: ckpt / n for n in (models.CONFIG_FILE, models.WEIGHTS_FILE)})
    put_on_hub(hub, "negft-test/tiny-qg-tag", {models.WEIGHTS_FILE: ckpt / models.WEIGHTS_FILE})
    register_tag(monkeypatch, "negft-test/tiny-qg-tag", quick_gelu=True)
    runs = [run_eval(tmp_path, cache, name, *keys) for name, keys in (
        ("tag", (f"model={ARCH}", f"pretrained={TAG}")), ("hub", ("ckpt=hf-hub:negft-test/tiny-qg",)),
        ("local-dir", (f"ckpt=local-dir:{ckpt}",)))]
    assert all("act=quick_gelu" in out for _, out in runs)
    assert all(same_numbers(runs[0][0], r) for r, _ in runs[1:])
    # the features each path gives are QuickGELU's, which the GELU architecture does not give these weights
    tokens = open_clip.get_tokenizer(ARCH)(["a red star", "no circle"])
    feats = [models.build(*source).model.encode_text(tokens) for source in (
        (ARCH, TAG), ("", "hf-hub:negft-test/tiny-qg"), ("", f"local-dir:{ckpt}"))]
    gelu = models.build(ARCH, str(ckpt / models.WEIGHTS_FILE), quick_gelu=False).model.encode_text(tokens)
    assert all(torch.equal(feats[0], f) for f in feats[1:]) and not torch.allclose(feats[0], gelu, atol=1e-3)


class Towers(torch.nn.Module):
    """Another library's model, as a notebook wraps it: the towers under its own names, an integer parameter
    first (a step counter), and ``encode_image`` / ``encode_text`` the only things negft calls."""

    def __init__(self, clip):
        super().__init__()
        self.steps = torch.nn.Parameter(torch.zeros(1, dtype=torch.long), requires_grad=False)
        self.pixels_to_vector = clip.visual
        self.clip = clip
        self.logit_scale = clip.logit_scale.reshape(-1)[0].item()       # a number (its log), not a parameter

    def embed_pixels(self, pixels):
        return self.pixels_to_vector(pixels)

    def embed_tokens(self, tokens):
        return self.clip.encode_text(tokens)

    def encode_image(self, pixels):
        return self.embed_pixels(pixels)

    def encode_text(self, tokens):
        return self.embed_tokens(tokens)


def test_negft_evaluate_scores_a_wrapped_model_as_eval_py_does(tmp_path, cache):
    """The same numbers and files. Only probe_r's mean confidences may differ, in the eighth digit: eval.py encodes
    an open_clip model's texts trimmed to their length (``models.encode_text_trimmed``, equal up to float
    rounding), the wrapper through its own full-length ``encode_text``."""
    ckpt = tiny(tmp_path)
    b = models.build("", str(ckpt))
    wrapped = Towers(b.model)
    got = negft.evaluate(wrapped, b.preprocess_val, b.tokenizer, suite=WRAPPED_SUITE, data="world",
                         world_dir=cache / "world-s0-tiny", bootstrap=20, out=tmp_path / "api")
    ran, _ = run_eval(tmp_path, cache, "cli", f"ckpt={ckpt}", suite=WRAPPED_SUITE)
    rounded = [k for k in ran["metrics"] if k.startswith("probe_r") and k.endswith("/confidence")]
    assert rounded and all(got.metrics[k] == pytest.approx(ran["metrics"][k], abs=1e-6) for k in rounded)
    exact = lambda d: {k: v for k, v in d.items() if k not in rounded}
    assert plain(exact(got.metrics)) == plain(exact(ran["metrics"])) and len(exact(got.metrics)) > 20
    assert plain(exact(got.ci95)) == plain(exact(ran["ci95"])) and got.skipped == ran["skipped"] == {}
    written = json.loads((tmp_path / "api" / "results.json").read_text())
    assert plain(written["metrics"]) == plain(got.metrics) and written["model"] == "Towers"
    files = lambda out: sorted(str(p.relative_to(out)) for p in out.rglob("*"))
    assert files(tmp_path / "api") == files(tmp_path / "cli")
    # data= a folder: the world itself
    again = negft.evaluate(wrapped, b.preprocess_val, b.tokenizer, suite="zeroshot", data=cache / "world-s0-tiny",
                           bootstrap=20)
    assert plain(again.metrics) == plain({k: v for k, v in got.metrics.items() if k.startswith("zeroshot/")})


def test_a_wrapper_without_logit_scale_or_float_parameters_gets_clip_s_defaults():
    class Bare:
        def encode_image(self, pixels):
            return pixels.flatten(1)

        def encode_text(self, tokens):
            return tokens.float()
    ctx = EvalContext(Bare(), None, None, "cpu")
    assert ctx.logit_scale == 100.0 and ctx.dtype == torch.float32
    with pytest.raises(TypeError, match="encode_image"):
        negft.evaluate(object(), None, None)


def test_import_negft_stays_cheap():
    """``import negft`` loads neither torch nor open_clip; ``negft.evaluate`` is imported when first used. Reading
    a recipe loads torch (the loss settings live beside their terms) but not open_clip, whose import costs seconds
    more: a mistyped key is refused before either a model or open_clip is loaded."""
    import subprocess
    import sys
    code = ("import sys, negft; print(sorted(m for m in ('torch', 'open_clip') if m in sys.modules)); "
            "from negft.config import load_config; load_config(['recipe=negfull']); "
            "print(sorted(m for m in ('torch', 'open_clip') if m in sys.modules))")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True).stdout == "[]\n['torch']\n"
    from negft import evaluation
    assert negft.evaluate is evaluation.evaluate
