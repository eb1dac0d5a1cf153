"""Launchers on CPU: the DeepSpeed launcher's two gloo ranks run the demo's stages; torchrun's and srun's two ranks
train to the same weights; how each launcher's environment maps to ranks, and the collective timeout."""
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from negft.models import WEIGHTS_FILE
from tests.conftest import REPO, Forked
from tests.test_resume import _free_port
from tests.test_train import QUICK, REQUIRED, _check_run_dir


def _launcher(name: str) -> str | None:
    """A launcher script of the environment that runs the tests (the venv's bin), else one on PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else shutil.which(name)


needs_deepspeed = pytest.mark.skipif(_launcher("deepspeed") is None, reason="deepspeed launcher not installed")


# the probes of the demo's patching targets (MCQ, Retrieval-Neg): enough for a run directory, a sweep and a release;
# the other probes' keys in a run directory are test_train.py's
SUITE = "mcq_neg,retrieval_neg"


def _args(run, cache, world_pretrain) -> list[str]:
    """Two steps of the demo from the (shortened) world-pretrain base, into ``run``."""
    return ["recipe=demo", f"out={run}", f"world.cache={cache}", "epochs=1", "train.steps_per_epoch=2", *QUICK,
            world_pretrain, f"eval.suite={SUITE}", "patch.alphas=0,1"]


@pytest.fixture(scope="module")
def deepspeed_run(cache, world_pretrain, rank_shim, tmp_path_factory):
    """The DeepSpeed launcher's two ranks, uninterrupted: the run every other launcher's two ranks must match. Its
    cache holds the session's world and no base (the ranks train it); the other launchers' runs find it there.
    Each rank is train.py forked from a preloaded server (``rank_shim``, run by the launcher with --no_python)."""
    root = tmp_path_factory.mktemp("ds")
    run, own = root / "run", root / "cache"
    own.mkdir()
    (own / "world-s0-tiny").symlink_to(cache / "world-s0-tiny")
    proc = subprocess.run([_launcher("deepspeed"), "--num_gpus", "2", "--master_port", str(_free_port()),
                           "--no_python", str(rank_shim), *_args(run, own, world_pretrain)],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return run, proc, own


# the runs compared with the DeepSpeed launcher's by their weights alone: no evaluation, no sweep
WEIGHTS_ONLY = ["eval.suite=none", "patch.sweep=false"]


def _same_weights(run, reference) -> None:
    a = load_file(str(reference / "checkpoints" / "epoch_1" / WEIGHTS_FILE))
    b = load_file(str(run / "checkpoints" / "epoch_1" / WEIGHTS_FILE))
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-6, msg=k)


@needs_deepspeed
def test_deepspeed_two_ranks_on_cpu(deepspeed_run):
    """The DeepSpeed launcher starts two gloo ranks here; they train the world base together (the tiny world-pretrain
    recipe, two steps), then write one complete run directory, and rank 0 sweeps and releases while rank 1
    waits."""
    run, proc, _ = deepspeed_run
    assert "2 rank(s)" in proc.stdout and "base model not cached: training" in proc.stdout
    _check_run_dir(run, 1, [k for k in REQUIRED if k.split("/")[0] in SUITE.split(",")])
    assert (run / "patch" / "selected.json").exists() and (run / "release" / "SHA256SUMS").exists()


@needs_deepspeed
@pytest.mark.skipif(_launcher("torchrun") is None, reason="torchrun not installed")
def test_torchrun_two_ranks_train_as_the_deepspeed_launchers(deepspeed_run, world_pretrain, rank_shim, tmp_path):
    """torchrun sets torch's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*) as the DeepSpeed launcher does."""
    run, cache = tmp_path / "run", deepspeed_run[2]
    proc = subprocess.run([_launcher("torchrun"), "--nproc_per_node", "2", "--master_port", str(_free_port()),
                           "--no-python", str(rank_shim), *_args(run, cache, world_pretrain), *WEIGHTS_ONLY],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 rank(s)" in proc.stdout
    _same_weights(run, deepspeed_run[0])


@needs_deepspeed
def test_srun_two_tasks_train_as_the_deepspeed_launchers(deepspeed_run, world_pretrain, tmp_path):
    """Two processes as srun starts them: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, and the job script's
    MASTER_ADDR and MASTER_PORT; no RANK or WORLD_SIZE."""
    assert "RANK" not in os.environ and "WORLD_SIZE" not in os.environ
    run, port, cache = tmp_path / "run", str(_free_port()), deepspeed_run[2]
    ranks = [Forked([*_args(run, cache, world_pretrain), *WEIGHTS_ONLY],
                    env={"SLURM_PROCID": str(r), "SLURM_NTASKS": "2", "SLURM_LOCALID": str(r), "SLURM_JOB_ID": "4242",
                         "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
             for r in range(2)]
    try:
        outs = [proc.communicate(timeout=600) for proc in ranks]
    finally:
        for proc in ranks:
            proc.kill()
    assert [proc.returncode for proc in ranks] == [0, 0], outs[0][1][-3000:] + outs[1][1][-3000:]
    assert "2 rank(s)" in outs[0][0]
    _same_weights(run, deepspeed_run[0])


# ------------------------------------------------------------------------- the environment each launcher sets
TORCH = {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
SLURM = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "42"}


@pytest.mark.parametrize("environ, expected", [
    ({}, ("python", 0, 1, 0, 1)),
    ({**TORCH, "LOCAL_SIZE": "4", "CROSS_RANK": "0"}, ("deepspeed", 3, 8, 1, 4)),
    ({**TORCH, "LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "none"}, ("torchrun", 3, 8, 1, 2)),
    ({**SLURM, "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}, ("srun", 5, 8, 1, 8)),
    # a launcher inside a Slurm job (deepspeed or torchrun in an sbatch script) keeps its own ranks
    ({**SLURM, **TORCH, "LOCAL_WORLD_SIZE": "8", "TORCHELASTIC_RUN_ID": "x"}, ("torchrun", 3, 8, 1, 8)),
], ids=["alone", "deepspeed", "torchrun", "srun", "torchrun-in-slurm"])
def test_launch_env_maps_each_launchers_variables(environ, expected):
    from negft.train.engine import launch_env
    env = launch_env(environ)
    assert (env.launcher, env.rank, env.world_size, env.local_rank, env.local_size) == expected


def test_srun_tasks_without_the_job_scripts_rendezvous_are_refused_naming_it(monkeypatch):
    """Several srun tasks meet at MASTER_ADDR:MASTER_PORT, which the job script sets; without them: a ConfigError
    (exit 2) that says so, instead of a wait. One task needs none."""
    from negft.config import ConfigError
    from negft.train.engine import LaunchEnv, export_ranks
    for name in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.setenv(name, "")        # recorded as it was, so that what export_ranks sets goes at teardown
        monkeypatch.delenv(name)
    with pytest.raises(ConfigError, match=r"srun started 2 tasks, but MASTER_ADDR and MASTER_PORT are not set.*"
                                          r"scontrol show hostnames"):
        export_ranks(LaunchEnv("srun", 1, 2, 1, 2))
    export_ranks(LaunchEnv("srun", 0, 1, 0, 1))
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["MASTER_ADDR"]) == ("0", "1", "127.0.0.1")


@pytest.mark.parametrize("env, resume, printed", [
    (("srun", 0, 2, 0, 2), "auto", "srun --ntasks 2 python train.py recipe=demo out=R resume=auto"),
    (("torchrun", 0, 2, 0, 2), None, "torchrun --nproc_per_node 2 train.py recipe=demo out=R resume=latest"),
    (("torchrun", 0, 8, 0, 4), None, "torchrun --nnodes 2 --nproc_per_node 4 --rdzv_endpoint HOST:PORT train.py "
                                     "recipe=demo out=R resume=latest"),
    (("deepspeed", 0, 2, 0, 2), "latest", "deepspeed --num_gpus 2 train.py recipe=demo out=R resume=latest"),
    (("deepspeed", 0, 8, 0, 4), "auto", "deepspeed --hostfile HOSTFILE train.py recipe=demo out=R resume=auto"),
    (("python", 0, 1, 0, 1), "auto", "python train.py recipe=demo out=R resume=auto"),
], ids=["srun", "torchrun", "torchrun-nodes", "deepspeed", "deepspeed-nodes", "alone"])
def test_the_continue_command_names_the_launcher_and_repeats_resume_auto(env, resume, printed, tmp_path,
                                                                        monkeypatch):
    """What a stopped run prints: the launcher that started it with its rank count (placeholders for what a rank
    cannot see), and resume=auto where the run was launched so (the command line a requeue repeats)."""
    from negft.commands import train as train_command
    from negft.config import load_config
    from negft.train import engine
    run = tmp_path / "R"
    run.mkdir()
    (run / "config.yaml").write_text("recipe: demo\n")
    monkeypatch.setattr(engine, "_launched", engine.LaunchEnv(*env))
    monkeypatch.setattr(sys, "argv", ["train.py"])
    argv = ["recipe=demo", f"out={run}", *([f"resume={resume}"] if resume else [])]
    command = train_command.continue_command(argv, load_config(argv))
    assert command == printed.replace("out=R", shlex.quote(f"out={run}"))


def test_the_collective_timeout_set_key_over_deepspeed_timeout_over_600_s():
    """train.dist_timeout_s where set (seconds), else DEEPSPEED_TIMEOUT (minutes, as DeepSpeed reads it), else
    600 s; each says where it came from, as the lost-rank message prints it."""
    from negft.config import ConfigError, load_config
    from negft.train.engine import collective_timeout
    key = load_config(["recipe=demo"]).train.dist_timeout_s
    assert key is None
    assert collective_timeout(key, {}) == (600.0, "600 seconds, the default; train.dist_timeout_s or "
                                                  "DEEPSPEED_TIMEOUT sets it")
    assert collective_timeout(key, {"DEEPSPEED_TIMEOUT": "20"}) == (1200.0,
                                                                   "1200 seconds, DEEPSPEED_TIMEOUT=20 minutes")
    set_key = load_config(["recipe=demo", "train.dist_timeout_s=45"]).train.dist_timeout_s
    assert collective_timeout(set_key, {"DEEPSPEED_TIMEOUT": "20"}) == (45.0, "train.dist_timeout_s=45 seconds")
    with pytest.raises(ConfigError, match="DEEPSPEED_TIMEOUT='ten' is not a number of minutes"):
        collective_timeout(None, {"DEEPSPEED_TIMEOUT": "ten"})


def test_the_job_script_requeues_itself_on_sigusr1s_exit_code_only(tmp_path):
    """scripts/slurm/negfull.sbatch with stand-ins for srun (exits as its tasks did) and scontrol: the rendezvous is
    the job's first node, the command line is the same on every run (resume=auto, the script's arguments), and only
    138 (stopped by SIGUSR1 before the time limit) requeues the job; the script exits as srun did."""
    stand_ins, log = tmp_path / "bin", tmp_path / "calls"
    stand_ins.mkdir()
    (stand_ins / "srun").write_text(f'#!/bin/sh\necho "srun $* @ $MASTER_ADDR:$MASTER_PORT" >> {log}\n'
                                    'exit $SRUN_EXIT\n')
    (stand_ins / "scontrol").write_text('#!/bin/sh\nif [ "$1 $2" = "show hostnames" ]; then printf "node7\\nnode8\\n"; '
                                        f'else echo "scontrol $*" >> {log}; fi\n')
    for f in stand_ins.iterdir():
        f.chmod(0o755)
    run = tmp_path / "run"
    for code, requeued in ((138, True), (143, False), (1, False), (0, False)):
        log.write_text("")
        proc = subprocess.run(["bash", "scripts/slurm/negfull.sbatch", "optim.lr=2e-6"], cwd=REPO, capture_output=True,
                              text=True, env={**os.environ, "PATH": f"{stand_ins}:{os.environ['PATH']}",
                                              "SRUN_EXIT": str(code), "SLURM_JOB_ID": "4242", "OUT": str(run),
                                              "SLURM_JOB_NODELIST": "node[7-8]"})
        assert proc.returncode == code, proc.stderr
        assert log.read_text().splitlines() == [
            f"srun python train.py recipe=negfull out={run} resume=auto optim.lr=2e-6 @ node7:24242",
            *(["scontrol requeue 4242"] if requeued else [])]
