"""`negft data check`: missing, truncated, off-schema and tampered datasets are named with their manifest."""
import json

import pytest

from negft.commands.cli import main
from negft.data import manifests
from negft.data.check import check
from negft.data.shards import ShardWriter
from negft.world.generator import train_sample

from conftest import run_here


def _convert(out, n=5, maxcount=2, drop=()):
    """A small converted dataset in the NegCap / NegMCQ schema, written by the converters' writer."""
    with ShardWriter(out, "test", "tests", {}, maxcount=maxcount, progress=False) as w:
        for i in range(n):
            png, rec, _ = train_sample("finetune", 0, i, set())
            w.add(f"img-{i}.x", png, "png", {k: v for k, v in rec.items() if k not in drop})
        return w.close("test")


@pytest.fixture
def data_root(tmp_path, monkeypatch):
    monkeypatch.setenv("NEGFT_DATA", str(tmp_path / "data"))
    return tmp_path / "data"


def test_an_empty_data_root_lists_every_manifest_with_its_path(data_root, capsys):
    assert main(["data", "check", "all"]) == 1
    out = capsys.readouterr().out
    for name in manifests.names():
        man = manifests.load(name)
        assert f"MISSING  {name}" in out
        expected = man["shards"].rstrip("/").split("{")[0].rstrip("/") if "shards" in man else man["root"]
        assert str(data_root / expected) in out, name


def test_a_converted_dataset_passes_and_a_damaged_one_is_named(data_root):
    folder = data_root / "cc12m_negfull"
    written = _convert(folder)
    assert written["counts"] == {"samples": 5, "shards": 3}
    assert check("cc12m_negcap", checksums=True) == [] and check("cc12m_negmcq") == []
    assert manifests.sample_count(manifests.load("cc12m_negcap")) == 5
    assert manifests.sample_count(manifests.load("cc12m_negcap"), "negcap") == 5
    # counts that differ from what the converter wrote (a shard replaced by another)
    record = json.loads((folder / "manifest.json").read_text())
    (folder / "manifest.json").write_text(json.dumps({**record, "counts": {"samples": 6, "shards": 3}}))
    assert any("5 samples in the shards" in p and "says 6" in p for p in check("cc12m_negcap"))
    # a shard cut short (a copy that stopped)
    last = folder / written["shards"][-1]
    last.write_bytes(last.read_bytes()[:700])
    problems = check("cc12m_negcap", checksums=True)
    assert any("unreadable, truncated" in p and last.name in p for p in problems)
    assert any("sha256 differs" in p and last.name in p for p in problems)
    assert all("data_manifests/cc12m_negcap.yaml" in p for p in problems)
    # a shard gone
    (folder / written["shards"][1]).unlink()
    assert any("1 of 3 shards missing" in p for p in check("cc12m_negcap"))


def test_a_dataset_without_a_schema_field_is_refused(data_root):
    _convert(data_root / "cc12m_negfull", drop=("mcq",))
    assert check("cc12m_negcap") == []
    problems = check("cc12m_negmcq")
    assert len(problems) == 1 and "no sample holds mcq" in problems[0]
    # shards of one's own (no converter manifest): each shard's first sample must hold the schema
    (data_root / "cc12m_negfull" / "manifest.json").unlink()
    problems = check("cc12m_negmcq")
    assert len(problems) == 3 and all("first sample lacks mcq" in p for p in problems)


def test_train_exits_2_naming_the_missing_dataset_before_writing(tmp_path):
    out = tmp_path / "run"
    env = {"NEGFT_DATA": str(tmp_path / "nothing"), "NEGFT_CACHE": str(tmp_path / "cache")}
    proc = run_here(["train.py", "recipe=negfull", "model.arch=negft-tiny", "model.pretrained=",
                     f"out={out}", "max_steps=1"], env=env)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "cc12m_negcap" in proc.stderr and str(tmp_path / "nothing" / "cc12m_negfull") in proc.stderr
    assert "negft data convert" in proc.stderr
    assert not out.exists()
