"""Every write negft makes that fails (a full disk, a read-only file system) ends with negft's own message: the path
it could not write, what the failure left and how to go on; exit 1 and no traceback on the command line; nothing
finished is lost and no half-written file is left where a reader looks. The checkpoint and the ledger are in
test_resume.py (``test_a_failing_write_stops_the_run_naming_the_path_and_keeps_what_was_written``)."""
import errno
import hashlib
import json
import os
import shutil
import tarfile
from pathlib import Path

import pytest

from negft import io, models
from negft.world.formats import negbench_csv

from conftest import run_here

AGAIN = "Free space or fix the permissions, then run the same command again."


def _enospc(*_, **__):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def _tree(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under ``root``, hidden ones too."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _hidden(root: Path) -> list[Path]:
    return [p for p in root.rglob(".*") if ".tmp" in p.name]


def _negft(*args, code=1) -> str:
    """``negft ARGS`` in this process, which must exit ``code`` without a traceback; returns its stderr."""
    proc = run_here(["-m", "negft", *args])
    assert proc.returncode == code, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    return proc.stderr


@pytest.mark.parametrize("fault", ["write", "rename"])
def test_a_model_that_cannot_be_saved_keeps_the_old_one_or_leaves_nothing(bundle, tmp_path, monkeypatch, fault):
    """models.save (a patch's selected/): a full disk while the weights are written, or a read-only file system
    at the rename, raises WriteError naming the directory; one saved before is kept byte for byte, a new one is
    not there at all, and no staging directory is left."""
    old, new = tmp_path / "old", tmp_path / "new"
    models.save(bundle.model, old, bundle.model_cfg, bundle.preprocess_cfg)
    before = _tree(old)
    if fault == "write":
        monkeypatch.setattr(models, "save_file", _enospc)
        why = "[Errno 28] No space left on device"
    else:
        replace = os.replace

        def read_only(src, dst):
            if Path(src).name.endswith(".tmp"):
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))
            return replace(src, dst)
        monkeypatch.setattr(io.os, "replace", read_only)
        why = "[Errno 30] Read-only file system"
    for out, kept in ((old, "its previous version is kept, whole"), (new, "nothing was left at that path")):
        with pytest.raises(io.WriteError) as e:
            models.save(bundle.model, out, bundle.model_cfg, bundle.preprocess_cfg)
        assert str(e.value) == f"cannot write '{out}': {why}; {kept}"
    assert _tree(old) == before and not new.exists() and not _hidden(tmp_path)


def test_a_release_that_cannot_be_written_exits_1_leaving_no_release(bundle, tmp_path, monkeypatch):
    """negft release onto a full disk: the message names out, says nothing was left there and how to go on;
    exit 1; out is not there (a release is never half there), and the same command then releases it."""
    ckpt, rel = tmp_path / "ckpt", tmp_path / "release"
    models.save(bundle.model, ckpt, bundle.model_cfg, bundle.preprocess_cfg, extra={"arch": "negft-tiny"})
    with monkeypatch.context() as full:
        full.setattr(shutil, "copyfile", _enospc)
        err = _negft("release", f"ckpt={ckpt}", f"out={rel}")
    assert (f"negft: error: cannot write '{rel}': [Errno 28] No space left on device; nothing was left at that "
            f"path\n{AGAIN}") in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
    _negft("release", f"ckpt={ckpt}", f"out={rel}", code=0)
    assert (rel / "SHA256SUMS").is_file()


def test_a_world_that_cannot_be_built_exits_1_and_keeps_the_world_that_was_there(cache, tmp_path, monkeypatch):
    """negft data world (seed 1) into a folder holding a world (seed 0), with the disk full at its first shard:
    the message names the folder and says the old world is kept; exit 1; it is, file for file, and the build's
    scratch directory is gone."""
    from negft.world import generator
    out, old = tmp_path / "world", cache / "world-s0-tiny"
    (out / "finetune").mkdir(parents=True)          # what a reader checks of it (a copy of all of it costs seconds)
    for name in ("world.json", "finetune/shard-000000.tar"):
        shutil.copyfile(old / name, out / name)
    before = _tree(out)
    monkeypatch.setattr(generator, "_dispatch", _enospc)
    err = _negft("data", "world", f"out={out}", "seed=1", "size=tiny", "workers=1")
    assert (f"negft: error: cannot write '{out}': [Errno 28] No space left on device; the world that was there "
            f"is kept, whole\n{AGAIN}") in err
    assert _tree(out) == before


def _full_at(monkeypatch, fault: str) -> None:
    """The disk fills while a converter writes its third shard (``shard``), or its manifest (``manifest``)."""
    from negft.data import shards
    if fault == "shard":
        tar_add, opened = shards.tar_add, []

        def full_in_the_third(tf, name, data):
            if tf not in opened:
                opened.append(tf)
            return _enospc() if len(opened) == 3 else tar_add(tf, name, data)
        monkeypatch.setattr(shards, "tar_add", full_in_the_third)
    else:
        fsync = os.fsync

        def full(fd):
            if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(".manifest.json"):
                _enospc()
            return fsync(fd)
        monkeypatch.setattr(os, "fsync", full)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the manifest's file by /proc/self/fd")
@pytest.mark.parametrize("fault, failed, finished", [("shard", "shard-000002.tar", 2), ("manifest", "manifest.json", 4)])
def test_a_conversion_that_cannot_write_exits_1_keeping_its_finished_shards(tmp_path, monkeypatch, fault, failed,
                                                                             finished):
    """negft data convert with the disk full in its third shard, or at its manifest: the message names that file
    and the finished shards that stay; exit 1; they are whole tars, nothing half-written is there and no
    manifest (so no reader takes the folder for a converted dataset); the same command then converts it."""
    ex = negbench_csv.write_negcap_example(tmp_path / "src", 6)
    assert 6 + ex["kept_without_negcap"] == 7            # samples: 4 shards of at most 2
    out = tmp_path / "out"
    command = ["data", "convert", "negbench-negcap", ex["csv"], ex["images"], f"out={out}", "maxcount=2"]
    with monkeypatch.context() as full:
        _full_at(full, fault)
        err = _negft(*command)
    assert (f"negft: error: cannot write '{out / failed}': [Errno 28] No space left on device; the {finished} "
            f"shard(s) finished before it stay in '{out}' without manifest.json, so nothing takes the folder for a "
            f"converted dataset; the same command converts it again\n{AGAIN}") in err
    shards = [f"shard-{i:06d}.tar" for i in range(finished)]
    assert sorted(p.name for p in out.iterdir()) == shards
    for name in shards:
        with tarfile.open(out / name) as tf:
            assert len(tf.getnames()) == (2 if name == "shard-000003.tar" else 4)      # image + json a sample
    _negft(*command, code=0)
    assert json.loads((out / "manifest.json").read_text())["counts"] == {"samples": 7, "shards": 4}


def test_a_world_base_that_cannot_be_cached_exits_1_keeping_its_training_run(cache, world_pretrain, tmp_path,
                                                                             monkeypatch):
    """A run whose world base model has trained but cannot be copied into the cache (a full disk): the message
    names the model directory, says its training run is kept, and gives the command to continue (the same one);
    exit 1; no half-copied model is there. (Training the base is the real thing's business, tested in
    test_stages.py: here it is a finished run's last checkpoint.)"""
    from negft.train import world_base
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "world-s0-tiny").symlink_to(cache / "world-s0-tiny")

    def trained(cfg, base, where):
        epoch = Path(cfg.out) / "checkpoints" / "epoch_1"
        epoch.mkdir(parents=True)
        for name in (models.WEIGHTS_FILE, models.CONFIG_FILE):
            (epoch / name).write_text(name)
        return Path(cfg.out)
    copytree = shutil.copytree
    monkeypatch.setattr(world_base, "train", trained)
    monkeypatch.setattr(world_base.shutil, "copytree",
                        lambda src, dst, **kw: copytree(src, dst, **kw, copy_function=_enospc))
    out = tmp_path / "run"
    proc = run_here(["train.py", "recipe=demo", "data=world", "world.size=tiny", f"world.cache={tmp_path / 'cache'}",
                     world_pretrain, f"out={out}"])
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    [base] = [p for p in (tmp_path / "cache" / "base").iterdir() if p.is_dir()]     # beside it: its lock file
    assert (f"negft: error: cannot write '{base / 'model'}': [Errno 28] No space left on device; its training run "
            f"'{base / 'run'}' is kept, and the same command caches the model from it\nThere is no complete "
            f"checkpoint in {out}; once that is put right, continue with:\n  python train.py ") in proc.stderr
    assert sorted(p.name for p in base.iterdir()) == ["run"]
    assert (base / "run" / "checkpoints" / "epoch_1" / models.WEIGHTS_FILE).is_file()


def test_a_recipe_copy_on_a_full_disk_leaves_no_file(tmp_path, monkeypatch):
    """``negft recipes cp``: a full disk while the copy is written exits 1 naming DEST, and leaves no DEST (a
    half-written recipe would run as a different recipe)."""
    monkeypatch.setattr(Path, "write_text", _enospc)
    dest = tmp_path / "mine.yaml"
    err = _negft("recipes", "cp", "demo", str(dest))
    assert f"cannot write '{dest}': [Errno 28] No space left on device; nothing was left at that path" in err
    assert AGAIN in err
    assert not dest.exists() and not _hidden(tmp_path)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="finds the manifest's file by /proc/self/fd")
def test_a_negation_whose_val_manifest_cannot_be_written_leaves_no_manifest_and_converts_again(tmp_path,
                                                                                             monkeypatch):
    """negft data negate writes train/manifest.json, then val/'s: a full disk at the second leaves neither (one
    split alone is no conversion), so the same command, as the message says, converts both again."""
    from negft.world.formats import coco as coco_example
    ex = coco_example.write_coco_example(tmp_path / "src", 12, seed=0)
    out = tmp_path / "out"
    command = ["data", "negate", ex["captions"], ex["images"], f"out={out}", f"labels={ex['instances']}",
               "val_fraction=0.5", "progress=false"]
    fsync, manifests = os.fsync, []

    def full_at_the_second_manifest(fd):
        if Path(os.readlink(f"/proc/self/fd/{fd}")).name.startswith(".manifest.json"):
            manifests.append(fd)
            if len(manifests) == 2:
                _enospc()
        return fsync(fd)
    with monkeypatch.context() as full:
        full.setattr(os, "fsync", full_at_the_second_manifest)
        err = _negft(*command)
    assert f"negft: error: cannot write '{out / 'val' / 'manifest.json'}': [Errno 28] No space left" in err
    assert "the same command converts it again" in err and AGAIN in err
    assert not list(out.rglob("manifest.json")) and not _hidden(out)
    _negft(*command, code=0)
    assert sorted(p.parent.name for p in out.rglob("manifest.json")) == ["train", "val"]
