"""What produced a result: negft's version, the git commit of the checkout it ran from (and whether its tracked
files differed from that commit), and the version of each probe behind the numbers. Every ledger line,
``eval.py``'s ``results.json`` and a release's model card carry it, as lm-evaluation-harness's results carry
``lm_eval_version``, ``git_hash`` and each task's version under ``versions`` (EleutherAI/lm-evaluation-harness:
``lm_eval/loggers/utils.py`` ``get_git_commit_hash``, ``add_env_info``). lm-eval reads the commit of the working
directory; negft reads the one of the checkout its code was imported from, which is the code that ran.

The code's part is read once per process (``code``), at the entry points' start, so that a commit made or a file
edited while a run goes on does not change what its later lines record, and a ledger line costs no subprocess.
negft installed without its git checkout (a wheel, site-packages) records no commit and says so.
"""
from __future__ import annotations

import functools
import os
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import negft

CHECKOUT = Path(negft.__file__).resolve().parent.parent      # the repository root when run from a checkout


@functools.lru_cache(maxsize=None)
def code() -> dict:
    """{negft_version, git_commit, git_dirty[, git_note]} of this process's negft (computed once)."""
    return {"negft_version": negft.__version__, **git_state(CHECKOUT)}


def git_state(root: Path) -> dict:
    """{git_commit, git_dirty} of the checkout at ``root``; both None with a ``git_note`` saying why where
    ``root`` is no checkout or git cannot read it. Dirty: a tracked file differs from the commit (``git describe
    --dirty``'s sense; untracked files are not looked at)."""
    if not (root / ".git").exists():      # a folder, or a file in a worktree; never a repository above root
        return _none(f"not run from a git checkout (no .git in {root}: negft installed as a package)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")}     # root's repository, not another

    def git(*args: str) -> str:
        return subprocess.run(["git", "--no-optional-locks", "-C", str(root), *args], capture_output=True,
                              text=True, check=True, timeout=30, env=env).stdout
    try:
        commit = git("rev-parse", "--verify", "HEAD").strip()
        dirty = bool(git("status", "--porcelain", "--untracked-files=no").strip())
    except FileNotFoundError:
        return _none("git is not installed")
    except subprocess.CalledProcessError as e:
        said = (e.stderr or "").strip().splitlines()
        return _none(f"git could not read {root}: {said[-1] if said else e}")
    except (OSError, subprocess.SubprocessError) as e:
        return _none(f"git could not read {root}: {e}")
    return {"git_commit": commit, "git_dirty": dirty}


def _none(why: str) -> dict:
    return {"git_commit": None, "git_dirty": None, "git_note": why}


def provenance(keys) -> dict:
    """The code's provenance and ``probe_versions``, {probe: version} of the probes that report ``keys``
    (metric and skip keys)."""
    from negft import probes
    return {**code(), "probe_versions": probes.versions(keys)}


def describe(record: dict | None) -> str:
    """One line for a report or card: ``negft 0.1.0, git commit abc1234 (tracked files modified); probes
    mcq_neg v2, ...``; what is missing is said."""
    if not record:
        return "not recorded (written before negft recorded its provenance)"
    commit = record.get("git_commit")
    if commit:
        git = f"git commit {commit}" + (" (tracked files modified)" if record.get("git_dirty") else "")
    else:
        git = f"no git commit ({record.get('git_note', 'none recorded')})"
    text = f"negft {record.get('negft_version', '?')}, {git}"
    versions = record.get("probe_versions")
    if versions:
        text += "; probes " + ", ".join(f"{name} v{v}" for name, v in versions.items())
    return text


def now() -> str:
    """The UTC time a ledger line, results.json or selected.json records."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
