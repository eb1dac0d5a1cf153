"""negft release as a Hugging Face Hub repository: README.md with the Hub's metadata (read back by
huggingface_hub), no path of the building machine in any released file, loadable as ``hf-hub:ORG/NAME`` from the
Hub's cache, and ``push=`` (dry run, and the refusals that upload nothing; no request ever leaves this machine)."""
import json
import math
import os
import shutil

import pytest
import torch
import yaml

from negft import models
from negft.provenance import provenance
from negft.release import SUMS, _data_lines, _provenance_lines, base_of, datasets_of, sha256, verify
from negft.train.ledger import Ledger
from tests.conftest import run_here

BASE_NAME = "world-pretrain-s0-tiny-abc123"
METRICS = {"mcq_neg/world/acc": 0.75, "mcq_neg/world/acc_negation": 0.5, "retrieval/world/r1": 0.25,
           "zeroshot/world/top1": float("nan")}
BASE_METRICS = {"mcq_neg/world/acc": 0.5, "mcq_neg/world/acc_negation": 0.25, "retrieval/world/r1": 0.3,
                "zeroshot/world/top1": 0.4}


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A world run laid out as the demo leaves it (a cached world base, the run's ledger, a patch's selected/ and
    selected.json; tiny random weights), released with ``negft release ... license=mit``."""
    root = tmp_path_factory.mktemp("released")
    tiny = models.build("negft-tiny", "")
    save = lambda path, extra=None: models.save(tiny.model, path, tiny.model_cfg, tiny.preprocess_cfg, extra)
    base = save(root / "cache" / "base" / BASE_NAME / "model")
    world = root / "cache" / "world-s0-tiny"
    world.mkdir()
    (world / "world.json").write_text(json.dumps({"generator_version": "7", "seed": 0, "size": "tiny"}))
    run = root / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"recipe": "demo", "data": "world", "eval": {"split": "test"},
                                                     "loss": {"name": "clip"}, "streams": {"negcap": {}}}))
    ci = {k: [0.0, 1.0] for k in METRICS}
    Ledger(run).append(0, 0, BASE_METRICS, ci, {})
    Ledger(run).append(2, 4, METRICS, ci, {})
    info = {"recipe": "demo", "data": "world", "arch": "negft-tiny", "base": models.LOCAL_DIR + str(base),
            "tower": "t", "world_dir": str(world), "run_dir": str(run)}
    ckpt = save(run / "checkpoints" / "epoch_2", {**info, "epoch": 2, "epoch_step": 2, "step": 4})
    selected = save(run / "patch" / "selected", {**info, "finetuned": str(ckpt),
                                                 "patch": {"alpha": 0.5, "tower": "t"}})
    (run / "patch" / "selected.json").write_text(json.dumps({
        "rule": "largest mean gain", "targets": ["mcq_neg/*/acc"], "tower": "t", "alpha": 0.5,
        "test": {"metrics": METRICS, "ci95": ci, "base_metrics": BASE_METRICS, "base_ci95": ci, "skipped": {}},
        "provenance": provenance(list(METRICS))}))
    rel = root / "release"
    proc = run_here(["-m", "negft", "release", f"ckpt={selected}", f"out={rel}", "license=mit"])
    assert proc.returncode == 0, proc.stderr[-2000:]
    return rel, root, base, selected


def test_the_card_is_a_hub_readme_whose_model_index_is_the_probe_table(released):
    from huggingface_hub import ModelCard
    rel, _, _, selected = released
    assert sorted(p.name for p in rel.iterdir()) == ["README.md", SUMS, models.CONFIG_FILE, models.WEIGHTS_FILE]
    assert verify(rel) == [] and "README.md" in (rel / SUMS).read_text()
    card = ModelCard.load(rel / "README.md")
    data = card.data
    assert (data.library_name, data.base_model, data.pipeline_tag, data.license) == (
        "open_clip", BASE_NAME, "zero-shot-image-classification", "mit")
    assert data.datasets == ["negft-world"] and {"clip", "open_clip", "negation", "negft"} <= set(data.tags)
    test = json.loads((selected.parent / "selected.json").read_text())["test"]["metrics"]
    results = {r.metric_name: r for r in data.eval_results}
    # every metric of the table but the NaN one (the table's –), at its value in selected.json
    assert set(results) == {k for k, v in test.items() if not math.isnan(v)}
    for key, r in results.items():
        probe, dataset, metric = key.split("/")
        assert (r.metric_value, r.metric_type, r.dataset_config) == (test[key], metric, probe)
        assert (r.dataset_name, r.dataset_split) == ("negft-world", "test")
        assert f"| {key} |" in card.text
    assert "Known limits" in card.text and "α = 0.5" in card.text


def test_no_released_file_names_a_path_of_the_building_machine(released):
    rel, root, base, selected = released
    for path in rel.iterdir():
        content = path.read_bytes()
        for where in (str(root), os.path.expanduser("~"), str(root.parent)):
            assert where.encode() not in content, (path.name, where)
    # the base by its release name and weights' sha256, the run by recipe, epoch and the commit that trained it
    record = json.loads((rel / models.CONFIG_FILE).read_text())["negft"]
    trained = Ledger(root / "run").read()[1]["provenance"]
    assert record["base"] == BASE_NAME and record["base_sha256"] == sha256(base / models.WEIGHTS_FILE)
    assert record["run"] == {"recipe": "demo", "epoch": 2, **{k: trained[k] for k in
                                                             ("negft_version", "git_commit", "git_dirty")}}
    assert record["world"]["name"] == "world-s0-tiny" and record["patch"]["alpha"] == 0.5
    assert f"`{BASE_NAME}` (weights sha256 `{record['base_sha256']}`)" in (rel / "README.md").read_text()
    # the checkpoint's own record keeps its paths: patching and eval read them
    assert models.negft_info(selected)["base"] == models.LOCAL_DIR + str(base)


def test_a_package_install_is_described_without_its_folder(tmp_path, monkeypatch):
    note = f"not run from a git checkout (no .git in {tmp_path / 'site-packages'}: negft installed as a package)"
    monkeypatch.setattr("negft.release.code", lambda: {"negft_version": "0.1", "git_commit": None, "git_note": note})
    lines = "\n".join(_provenance_lines([None]))
    assert "(no .git in site-packages: negft installed as a package)" in lines and str(tmp_path) not in lines


def test_a_tag_base_and_real_streams_are_named_as_the_hub_knows_them(tmp_path):
    assert base_of({"base": "openai", "arch": "ViT-B-32"}) == {"tag": "openai",
                                                               "name": "timm/vit_base_patch32_clip_224.openai"}
    assert base_of({"base": ""}) == {}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump({"streams": {
        "negcap": {"manifest": "cc12m_negcap"}, "negmcq": {"manifest": "cc12m_negmcq"},
        "extra": {"urls": str(tmp_path / "shard-{000..001}.tar")}}}, sort_keys=False))
    assert datasets_of(tmp_path, {"data": "real"}) == ["cc12m_negcap", "cc12m_negmcq", "extra"]
    lines = "\n".join(_data_lines(tmp_path, {"data": "real"}))        # the card's lines: the shards by name
    assert "urls `shard-{000..001}.tar`" in lines and str(tmp_path) not in lines


def test_the_release_loads_from_the_hub_cache_as_hf_hub_org_name(released, tmp_path, monkeypatch):
    """The release as the Hub's cache holds a downloaded repository, loaded offline: the same embeddings as the
    local-dir load, bit for bit."""
    import huggingface_hub.constants as hub
    import open_clip
    rel = released[0]
    rev = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--negft-test--tiny-demo"
    shutil.copytree(rel, repo / "snapshots" / rev)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    for key, value in (("HF_HUB_CACHE", str(tmp_path / "hub")), ("HF_HUB_OFFLINE", "1")):
        monkeypatch.setenv(key, value)
    # read by huggingface_hub once, at import: its module constants are what a download looks at
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    models.register()
    torch.manual_seed(0)
    images = torch.rand(2, 3, 64, 64)
    feats = []
    for name in (f"local-dir:{rel}", "hf-hub:negft-test/tiny-demo"):
        model = open_clip.create_model_and_transforms(name)[0].eval()
        tokens = open_clip.get_tokenizer(name)(["a red star", "no circle"])
        with torch.no_grad():
            feats.append((model.encode_image(images), model.encode_text(tokens)))
    assert torch.equal(feats[0][0], feats[1][0]) and torch.equal(feats[0][1], feats[1][1])


class _NoRequests:
    """HfApi's two calls a push makes, recorded; ``fail``: what create_repo raises instead."""

    def __init__(self, monkeypatch, fail=None):
        from huggingface_hub import HfApi
        self.calls, self.fail = [], fail
        monkeypatch.setattr(HfApi, "create_repo", lambda api, *a, **k: self._call("create_repo", a, k))
        monkeypatch.setattr(HfApi, "upload_folder", lambda api, *a, **k: self._call("upload_folder", a, k))

    def _call(self, name, args, kwargs):
        if self.fail is not None:
            raise self.fail
        self.calls.append((name, args, kwargs))


def _hub_state(monkeypatch, tmp_path, token, offline):
    """No token anywhere (environment, token file) unless ``token``; HF_HUB_OFFLINE as ``offline`` says."""
    import huggingface_hub.constants as hub
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(hub, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    if token:
        monkeypatch.setenv("HF_TOKEN", "hf_" + "x" * 34)
    if offline:
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def test_push_dry_run_lists_the_release_and_uploads_nothing(released, tmp_path, monkeypatch):
    rel = released[0]
    hub = _NoRequests(monkeypatch, fail=AssertionError("a dry run made a request"))
    before = {p.name: sha256(p) for p in rel.iterdir()}
    proc = run_here(["-m", "negft", "release", f"out={rel}", "push=negft-test/tiny-demo", "dry_run=true"])
    assert proc.returncode == 0, proc.stderr
    assert "https://huggingface.co/negft-test/tiny-demo" in proc.stdout
    for name in before:
        assert f"  {name}  {(rel / name).stat().st_size} bytes" in proc.stdout
    assert {p.name: sha256(p) for p in rel.iterdir()} == before and hub.calls == []
    # SHA256SUMS is checked first: a damaged release is refused, dry run or not
    damaged = tmp_path / "damaged"
    shutil.copytree(rel, damaged)
    (damaged / "README.md").write_text("changed")
    proc = run_here(["-m", "negft", "release", f"out={damaged}", "push=negft-test/tiny-demo", "dry_run=true"])
    assert proc.returncode == 2 and "README.md" in proc.stderr and SUMS in proc.stderr


@pytest.mark.parametrize("token, offline, fail, said", [
    (False, False, None, "HF_TOKEN"),                         # no token: say how to give one
    (True, True, None, "HF_HUB_OFFLINE"),                     # offline: nothing is tried
    (True, False, ConnectionError("no route to host"), "network"),
])
def test_push_without_a_token_or_a_reachable_hub_exits_2_having_uploaded_nothing(released, tmp_path, monkeypatch,
                                                                                token, offline, fail, said):
    from huggingface_hub import get_token
    _hub_state(monkeypatch, tmp_path, token, offline)
    assert (get_token() is None) != token
    hub = _NoRequests(monkeypatch, fail)
    proc = run_here(["-m", "negft", "release", f"out={released[0]}", "push=negft-test/tiny-demo"])
    assert proc.returncode == 2 and said in proc.stderr and "nothing was uploaded" in proc.stderr, proc.stderr
    assert hub.calls == []
    if not token:
        assert "hf auth login" in proc.stderr


def test_push_creates_the_repository_and_uploads_the_released_files_in_one_commit(released, tmp_path, monkeypatch):
    _hub_state(monkeypatch, tmp_path, token=True, offline=False)
    hub = _NoRequests(monkeypatch)
    proc = run_here(["-m", "negft", "release", f"out={released[0]}", "push=negft-test/tiny-demo", "private=true"])
    assert proc.returncode == 0, proc.stderr
    (create, args, kwargs), (upload, _, up) = hub.calls
    assert (create, args, kwargs) == ("create_repo", ("negft-test/tiny-demo",), {"private": True, "exist_ok": True})
    assert upload == "upload_folder" and up["folder_path"] == str(released[0])
    assert sorted(up["allow_patterns"]) == ["README.md", SUMS, models.CONFIG_FILE, models.WEIGHTS_FILE]
    assert run_here(["-m", "negft", "release", f"out={released[0]}"]).returncode == 2      # neither ckpt nor push
