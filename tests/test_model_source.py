"""One reading of a model string (``negft.config.source``) and one loader (``negft.models.load``) for eval, patch and
train: which kind each string is, and the errors that name the key it was given as."""
import pytest

from negft.config import ConfigError, PatchCfg, source


def test_each_kind_of_model_string(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "w.safetensors").write_bytes(b"x")
    kinds = {"hf-hub:org/name": ("hf-hub", "hf-hub:org/name", None),
             f"local-dir:{tmp_path / 'ckpt'}": ("local-dir", f"local-dir:{tmp_path / 'ckpt'}", tmp_path / "ckpt"),
             str(tmp_path / "ckpt"): ("local-dir", f"local-dir:{tmp_path / 'ckpt'}", tmp_path / "ckpt"),
             str(tmp_path / "w.safetensors"): ("file", str(tmp_path / "w.safetensors"), tmp_path / "w.safetensors"),
             "/nowhere/w.pt": ("file", "/nowhere/w.pt", None), "openai": ("tag", "openai", None), "": ("tag", "", None)}
    for text, (kind, pretrained, path) in kinds.items():
        got = source(text)
        assert (got.kind, got.pretrained) == (kind, pretrained), text
        assert path is None or got.path == path, text
        assert got.carries_architecture == (kind in ("hf-hub", "local-dir")), text


def test_load_names_the_key_and_what_to_pass(tmp_path):
    from negft import models
    with pytest.raises(FileNotFoundError, match="base '/nowhere/w.pt' is neither a checkpoint directory nor a file"):
        models.load("/nowhere/w.pt", "ViT-B-32", key="base")
    (tmp_path / "w.safetensors").write_bytes(b"x")
    with pytest.raises(ValueError, match=r"ckpt='.*w\.safetensors' needs an architecture.*pass model=ARCH"):
        models.load(str(tmp_path / "w.safetensors"), key="ckpt")
    (tmp_path / "SHA256SUMS").write_text("0" * 64 + "  w.safetensors\n")      # a release whose file changed
    with pytest.raises(ConfigError, match="finetuned: w.safetensors .* fail"):
        models.load(str(tmp_path / "w.safetensors"), "ViT-B-32", key="finetuned")


def test_the_patch_rules_max_drift_is_declared_once():
    from negft.patching import Rule
    assert Rule([], []).max_drift == PatchCfg().max_drift == Rule.of(PatchCfg()).max_drift
