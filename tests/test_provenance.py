"""Results carry their provenance: negft's version, the git commit of its checkout (or why there is none), each
probe's version — in every ledger line, results.json and the model card, read once per process."""
import json
import shutil
import subprocess

import pytest

import negft
from negft import probes, provenance
from negft.train.ledger import Ledger, write_report


def _git(root, *args):
    return subprocess.run(["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                          capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_commit_and_whether_tracked_files_differ_from_it(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    (repo / "a.py").write_text("x = 1\n")
    _git(repo, "add", "a.py")
    _git(repo, "commit", "-q", "-m", "one")
    assert provenance.git_state(repo) == {"git_commit": _git(repo, "rev-parse", "HEAD"), "git_dirty": False}
    (repo / "new.py").write_text("")                     # untracked: not dirty, as git describe --dirty has it
    assert provenance.git_state(repo)["git_dirty"] is False
    (repo / "a.py").write_text("x = 2\n")
    assert provenance.git_state(repo)["git_dirty"] is True
    inside = repo / "site-packages"                      # a folder inside a checkout is not that checkout
    inside.mkdir()
    state = provenance.git_state(inside)
    assert state["git_commit"] is None and "not run from a git checkout" in state["git_note"]


def test_no_checkout_or_no_git_records_none_and_says_why(tmp_path, monkeypatch):
    state = provenance.git_state(tmp_path)
    assert state["git_commit"] is None and state["git_dirty"] is None and str(tmp_path) in state["git_note"]
    (tmp_path / ".git").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert provenance.git_state(tmp_path)["git_note"] == "git is not installed"


def test_every_ledger_line_carries_it_computed_once_per_process(tmp_path, monkeypatch):
    """An installed negft (no .git beside the package): no commit, the reason, no failure; the code's part is
    read once however many lines are written; the probe versions are those of the probes behind the line's
    metrics, skips and patched metrics."""
    calls = []
    real = provenance.git_state
    monkeypatch.setattr(provenance, "git_state", lambda root: calls.append(root) or real(root))
    monkeypatch.setattr(provenance, "CHECKOUT", tmp_path / "site-packages")
    provenance.code.cache_clear()
    try:
        ledger = Ledger(tmp_path)
        for epoch in range(3):
            ledger.append(epoch, epoch * 10, {"mcq_neg/world/acc": 0.5, "zeroshot/world/top1": 0.25},
                          {"mcq_neg/world/acc": [0.4, 0.6], "zeroshot/world/top1": [0.2, 0.3]},
                          {"snare_structure/world": "spaCy missing"},
                          patched={"alpha": 0.5, "tower": "t", "metrics": {"retrieval/world/r5": 1.0}, "ci95": {}})
    finally:
        provenance.code.cache_clear()
    assert len(calls) == 1
    lines = ledger.read()
    assert len(lines) == 3
    for line in lines:
        p = line["provenance"]
        assert p["negft_version"] == negft.__version__ and p["git_commit"] is None and p["git_dirty"] is None
        assert "not run from a git checkout" in p["git_note"]
        assert p["probe_versions"] == {name: probes.VERSIONS[name]
                                       for name in ("mcq_neg", "zeroshot", "snare", "retrieval")}
    report = write_report(tmp_path, "run").read_text()
    assert "- epochs 0, 1, 2: negft " + negft.__version__ + ", no git commit (not run from a git checkout" in report
    assert f"mcq_neg v{probes.VERSIONS['mcq_neg']}" in report


def test_this_checkout_records_its_commit():
    """Run from this repository (the test suite's own case): its commit, as git gives it."""
    if not (provenance.CHECKOUT / ".git").exists() or shutil.which("git") is None:
        pytest.skip("not run from a git checkout")
    state = provenance.git_state(provenance.CHECKOUT)
    assert state["git_commit"] == _git(provenance.CHECKOUT, "rev-parse", "HEAD")
    assert isinstance(state["git_dirty"], bool) and provenance.code()["negft_version"] == negft.__version__


def _checkpoint(path, info):
    from negft import models
    path.mkdir(parents=True)
    (path / models.CONFIG_FILE).write_text(json.dumps({"model_cfg": {}, "negft": info}))
    return path


def test_the_model_card_names_what_released_it_and_what_computed_its_numbers(tmp_path, monkeypatch):
    from negft.release import model_card
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: demo\n")
    ledger = Ledger(run)
    ledger.append(0, 0, {"mcq_neg/world/acc": 0.5}, {"mcq_neg/world/acc": [0.4, 0.6]}, {})
    other = {"negft_version": "9.9", "git_commit": "abc", "git_dirty": True}
    monkeypatch.setattr(provenance, "code", lambda: other)
    monkeypatch.setattr("negft.release.code", lambda: other)
    ledger.append(1, 10, {"mcq_neg/world/acc": 0.7}, {"mcq_neg/world/acc": [0.6, 0.8]}, {})   # resumed elsewhere
    ckpt = _checkpoint(run / "checkpoints" / "epoch_1", {"epoch": 1, "run_dir": str(run), "arch": "negft-tiny"})
    card = model_card(ckpt, {"epoch": 1, "run_dir": str(run), "arch": "negft-tiny"})
    mcq = f"probes mcq_neg v{probes.VERSIONS['mcq_neg']}"
    assert "- released with: negft 9.9, git commit abc (tracked files modified)" in card
    first = ledger.read()[0]["provenance"]
    assert f"- probe results computed by: {provenance.describe(first)}" in card and mcq in card
    assert f"- probe results computed by: negft 9.9, git commit abc (tracked files modified); {mcq}" in card
    # a patch's selected.json that records none says so
    patch = tmp_path / "patch"
    selected = _checkpoint(patch / "selected", {"patch": {"alpha": 0.5, "tower": "t"}, "finetuned": str(ckpt)})
    (patch / "selected.json").write_text(json.dumps({"test": {
        "metrics": {"mcq_neg/world/acc": 0.6}, "ci95": {}, "base_metrics": {"mcq_neg/world/acc": 0.5},
        "base_ci95": {}}}))
    card = model_card(selected, {"patch": {"alpha": 0.5, "tower": "t"}, "finetuned": str(ckpt)})
    assert "- probe results computed by: not recorded" in card
