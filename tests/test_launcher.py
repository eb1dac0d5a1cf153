"""The DeepSpeed launcher on CPU: two gloo ranks run the demo's stages."""
import shutil

import pytest

from tests.conftest import REPO
from tests.test_train import QUICK, REQUIRED_SUITE, _check_run_dir


@pytest.mark.skipif(shutil.which("deepspeed", path=str(REPO / ".venv" / "bin")) is None and
                    shutil.which("deepspeed") is None, reason="deepspeed launcher not installed")
def test_deepspeed_two_ranks_on_cpu(cache, world_pretrain, tmp_path):
    """The DeepSpeed launcher starts two gloo ranks here; they train the world base together (the tiny world-pretrain
    recipe, two steps), then write one complete run directory, and rank 0 sweeps and releases while rank 1
    waits."""
    import subprocess
    launcher = shutil.which("deepspeed", path=str(REPO / ".venv" / "bin")) or shutil.which("deepspeed")
    run = tmp_path / "ds"
    proc = subprocess.run([launcher, "--num_gpus", "2", "--master_port", "29561", "train.py", "recipe=demo",
                           f"out={run}", f"world.cache={cache}", "epochs=1", "train.steps_per_epoch=2", *QUICK,
                           world_pretrain, f"eval.suite={REQUIRED_SUITE}", "patch.alphas=0,1"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 rank(s)" in proc.stdout
    _check_run_dir(run, 1)
    assert (run / "patch" / "selected.json").exists() and (run / "release" / "SHA256SUMS").exists()
