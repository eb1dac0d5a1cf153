"""negft installed from a wheel and run from another folder: the recipes and data manifests are package data, so
``recipe=NAME``, ``negft recipes [cp]`` and ``negft data check`` answer as they do in a checkout."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from negft.commands import cli
from negft.config import RECIPES
from negft.data import manifests
from tests.conftest import REPO


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """A wheel of the checkout, built offline from a copy of its sources (a build writes build/ and *.egg-info
    beside them) and installed with ``pip --target``: the folder that goes on PYTHONPATH."""
    tmp = tmp_path_factory.mktemp("package")
    src = tmp / "src"
    shutil.copytree(REPO / "negft", src / "negft", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input", "-q"]
    env = {**os.environ, "PIP_NO_INDEX": "1"}
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(tmp / "wheel"), str(src)],
                   check=True, capture_output=True, env=env)
    [wheel] = (tmp / "wheel").glob("negft-*.whl")
    subprocess.run([*pip, "install", "--no-deps", "--target", str(tmp / "site"), str(wheel)], check=True,
                   capture_output=True, env=env)
    return tmp / "site"


def _installed(site, cwd, *args, env=None):
    """``python ARGS`` in ``cwd`` with only the installed copy of negft importable (never the checkout)."""
    env = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


RESOLVE = """import json, negft
from negft.config import RECIPES, load_config
from negft.data import manifests
names = [p.stem for p in RECIPES.glob("*.yaml")] + ["my.yaml"]
cfgs = {n: load_config([f"recipe={n}"]) for n in names}
print(json.dumps({"negft": negft.__file__, "manifests": str(manifests.MANIFESTS),
                  "recipe": {n: c.recipe for n, c in cfgs.items()},
                  "world": {n: load_config([f"recipe={n}", "data=world"]).data for n in names},
                  "missing": [s.manifest for c in cfgs.values() for s in c.streams.values()
                              if s.manifest and not manifests.path(s.manifest).exists()]}))
"""


def test_installed_negft_lists_copies_and_resolves_its_recipes_from_another_folder(site, tmp_path):
    names = sorted(p.stem for p in RECIPES.glob("*.yaml"))
    listed = _installed(site, tmp_path, "-m", "negft", "recipes")
    assert listed.returncode == 0, listed.stderr
    assert f"recipes in {site / 'negft' / 'recipes'}" in listed.stdout
    rows = [line.split()[0] for line in listed.stdout.splitlines() if line.startswith("  ") and line[2] != " "]
    assert rows == names
    copied = _installed(site, tmp_path, "-m", "negft", "recipes", "cp", "demo", "./my.yaml")
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "my.yaml").read_text() == (RECIPES / "demo.yaml").read_text()
    (tmp_path / "my.yaml").write_text("# mine\n" + (RECIPES / "demo.yaml").read_text())
    again = _installed(site, tmp_path, "-m", "negft", "recipes", "cp", "negfull", "./my.yaml")
    assert again.returncode == 2 and "never overwrites" in again.stderr
    assert (tmp_path / "my.yaml").read_text().startswith("# mine\n")
    resolved = _installed(site, tmp_path, "-c", RESOLVE)
    assert resolved.returncode == 0, resolved.stderr
    got = json.loads(resolved.stdout)
    assert got["negft"].startswith(str(site)) and got["manifests"] == str(site / "negft" / "data_manifests")
    assert got["recipe"] == {**{n: n for n in names}, "my.yaml": "my.yaml"}
    assert set(got["world"].values()) == {"world"} and got["missing"] == []


def test_installed_data_check_reports_every_manifest_missing_without_data(site, tmp_path):
    proc = _installed(site, tmp_path, "-m", "negft", "data", "check", "all", env={"NEGFT_DATA": str(tmp_path / "d")})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    for name in manifests.names():
        assert f"MISSING  {name}\n" in proc.stdout
        assert f"(negft/data_manifests/{name}.yaml)" in proc.stdout


def test_installed_negft_trains_recipe_demo_on_the_world(site, tmp_path, cache):
    """One step from random weights (no base pretraining, no probes, no sweep): the recipe comes from the
    installed package."""
    run = tmp_path / "run"
    proc = _installed(site, tmp_path, "-m", "negft", "train", "recipe=demo", "data=world", "world.size=tiny",
                      f"world.cache={cache}", "max_steps=1", "model.world_pretrained=", "eval.suite=none",
                      "patch.sweep=false", "train.workers=0", "streams.negcap.batch_size=16",
                      "streams.negmcq.batch_size=16", f"out={run}")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "recipe: demo\n" in (run / "config.yaml").read_text()
    assert list((run / "checkpoints").glob("epoch_*/open_clip_model.safetensors"))


def test_recipes_cp_refuses_a_name_it_does_not_know_and_a_dest_recipe_cannot_read(tmp_path, capsys):
    assert cli.main(["recipes", "cp", "nope", str(tmp_path / "a.yaml")]) == 2
    err = capsys.readouterr().err
    assert "unknown recipe 'nope'. Valid choices: cc12m, " in err and ", demo, " in err
    assert cli.main(["recipes", "cp", "demo", str(tmp_path / "a.txt")]) == 2
    assert "must end in .yaml" in capsys.readouterr().err
    assert cli.main(["recipes", "ls"]) == 2 and "usage: negft recipes" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
