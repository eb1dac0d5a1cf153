import contextlib
import gc
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# `make test` runs one pytest-xdist worker per core: each computes on one thread (two workers of two threads on two
# cores would fight over them). Set before torch is imported, so the processes a test starts inherit it too.
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

MEMORY_TEMP, MEMORY_TEMP_ROOM = "/dev/shm", 8 << 30


def pytest_configure(config):
    """The session's temporary folders in memory (``MEMORY_TEMP``, a tmpfs) where it has room for them, unless
    --basetemp or PYTEST_DEBUG_TEMPROOT says where: the tests write and delete checkpoints of 50 to 150 MB by the
    hundred (2 GB for the ViT-B-32 ones); on a disk file system (here ext4 mounted with ``discard``) the tests that
    write most took about a tenth longer, the suite 5% (bench/RESULTS.md). The workers of `make test` get their
    folders from the controller."""
    if config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT") or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    with contextlib.suppress(OSError):
        stat = os.statvfs(MEMORY_TEMP)
        if stat.f_bavail * stat.f_frsize >= MEMORY_TEMP_ROOM:
            os.environ["PYTEST_DEBUG_TEMPROOT"] = MEMORY_TEMP


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A private negft cache holding the tiny world, one for the test session: `make test`'s workers share it as two
    jobs of a Slurm array share theirs (the first builds the world and each base under negft's cache lock, the
    other waits for it and reuses it)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent                          # above each worker's own folder: the session's
    path = root / "negft-cache"
    from negft.world.generator import build_world
    build_world(path / "world-s0-tiny", seed=0, size="tiny", workers=2, progress=False)
    return path


@pytest.fixture(scope="session")
def world_pretrain(tmp_path_factory):
    """The world-pretrain recipe with two steps of 32 instead of its 24 of 128 on the tiny world, and no probe pass
    (named as it is, so its base is cached as ``world-pretrain-*``): what the demo's base stage does, at a test's
    budget."""
    import yaml
    from negft.config import RECIPES
    recipe = yaml.safe_load((RECIPES / "world-pretrain.yaml").read_text())
    recipe["epochs"] = 1
    recipe["train"] = {**recipe.get("train", {}), "steps_per_epoch": 2, "workers": 0}
    recipe["eval"] = {**recipe.get("eval", {}), "suite": "none"}
    recipe["streams"]["corpus"]["batch_size"] = 32
    path = tmp_path_factory.mktemp("recipes") / "world-pretrain.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return f"model.world_pretrained={path}"


def run_cli(args, cwd=REPO, env=None, timeout=900):
    """Run a repo entry point in a fresh process; returns the CompletedProcess."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                          timeout=timeout)


# what a train.py process imports first: a forked run starts with them imported
PRELOAD = ["torch", "deepspeed", "open_clip", "negft.commands.cli", "negft.commands.train", "negft.train.loop",
           "tests.forkserver_preload"]


def _forked_train(argv, env, cwd, fault, new_session, out_path, err_path):
    """A forked child's ``python train.py ARGV``: its own session if asked, stdout and stderr to files (line
    buffered, as PYTHONUNBUFFERED leaves them), the environment and directory a process would have, ``fault``
    (Python source) run first, then train.py's entry; it exits as the interpreter would (exit handlers run)."""
    import atexit
    import multiprocessing
    import signal
    gc.freeze()             # the server's imports: out of the child's collections, as in the worker (pytest_collection)
    if new_session:
        os.setsid()
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(f, fd)
        os.close(f)
    sys.stdout = open(1, "w", buffering=1, closefd=False)
    sys.stderr = open(2, "w", buffering=1, closefd=False)
    multiprocessing.set_start_method("fork", force=True)     # a fresh process's default: its loader forks
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.argv = ["train.py", *argv]
    exec(compile(fault, "<fault>", "exec"), {"os": os, "signal": signal, "sys": sys, "Path": Path})
    from negft.commands.train import main as run_train
    try:
        code = run_train(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    handler = signal.getsignal(signal.SIGTERM)
    print("SIGTERM handler after the run:", "default" if handler is signal.SIG_DFL else handler)
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


class Forked:
    """``python train.py ARGS`` in a process of its own, forked from a server that imported train.py's modules
    once (multiprocessing's forkserver, ``PRELOAD``): its own pid, session, signals, file descriptors and exit
    status, without the seconds of imports a fresh interpreter pays. For the runs a test signals, kills or
    crashes; ``subprocess.Popen``'s interface as the tests use it (pid, poll, communicate, send_signal, kill,
    returncode: negative for a signal)."""

    def __init__(self, args, env=None, fault="", start_new_session=False, cwd=REPO):
        import multiprocessing
        import tempfile
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        self._dir = Path(tempfile.mkdtemp(prefix="forked-"))
        self._out, self._err = self._dir / "stdout", self._dir / "stderr"
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self._proc = ctx.Process(target=_forked_train, args=(list(args), env, str(cwd), fault, start_new_session,
                                                             str(self._out), str(self._err)))
        self._proc.start()
        self.pid = self._proc.pid

    @property
    def returncode(self):
        return self._proc.exitcode

    def poll(self):
        return self._proc.exitcode

    def communicate(self, timeout=None):
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(["train.py"], timeout)
        return self._out.read_text(), self._err.read_text()

    def send_signal(self, sig):
        if self._proc.exitcode is None:
            os.kill(self.pid, sig)

    def kill(self):
        import signal
        self.send_signal(signal.SIGKILL)


# ----------------------------------------------------------------------------- a launcher's ranks, forked
# A launcher (deepspeed, torchrun) starts each rank as `python train.py ARGS`: a fresh interpreter that pays the torch,
# DeepSpeed and open_clip imports (about ten CPU-seconds on 2 cores). Started with --no_python and this script
# instead, each rank asks the test's rank server for a ``Forked`` train.py with the argv, environment and working
# directory the launcher gave it, then prints what it printed and exits as it did.
RANK_SHIM = """#!{python}
import json, os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.connect({address!r})
s.sendall(json.dumps({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd()}}).encode() + b"\\n")
reply = json.loads(s.makefile().readline())
sys.stdout.write(reply["stdout"])
sys.stderr.write(reply["stderr"])
sys.exit(reply["code"])
"""


def _serve_rank(conn) -> None:
    """One rank: fork it, kill it if its launcher's process goes away first, send back its output and status."""
    import json
    import socket
    with conn:
        request = json.loads(conn.makefile().readline())
        proc = Forked(request["argv"], env=request["env"], cwd=request["cwd"])
        while proc.poll() is None:
            proc._proc.join(0.1)
            try:
                if conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    proc.kill()                             # the shim died: its rank goes with it
            except BlockingIOError:
                pass
        out, err = proc.communicate(timeout=60)
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        with contextlib.suppress(OSError):                  # a shim that died reads nothing
            conn.sendall(json.dumps({"stdout": out, "stderr": err, "code": code}).encode() + b"\n")


@pytest.fixture(scope="module")
def rank_shim(tmp_path_factory):
    """The path of an executable that a launcher started with --no_python runs as each rank (``RANK_SHIM``)."""
    import socket
    import threading
    root = tmp_path_factory.mktemp("ranks")
    address = str(root / "server")
    server = socket.socket(socket.AF_UNIX)
    server.bind(address)
    server.listen()

    def accept():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return                                      # closed at teardown
            threading.Thread(target=_serve_rank, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    shim = root / "rank"
    shim.write_text(RANK_SHIM.format(python=sys.executable, address=address))
    shim.chmod(0o755)
    yield shim
    server.shutdown(socket.SHUT_RDWR)                       # wakes the accepting thread
    server.close()


@contextlib.contextmanager
def process_state():
    """Puts back, when the block ends, what a training run changes in its process: the environment
    (``init_distributed`` sets RANK, WORLD_SIZE, MASTER_*), ``sys.argv``, the working directory, SIGTERM's
    handler, torch's RNG, thread count and TF32 flags. The one-rank process group a run starts stays for the
    session, as a process keeps it for its runs (DeepSpeed's communication backend holds it)."""
    import signal
    import torch
    saved = (dict(os.environ), sys.argv, os.getcwd(), signal.getsignal(signal.SIGTERM), torch.get_rng_state(),
             torch.get_num_threads(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved[0])
        sys.argv = saved[1]
        os.chdir(saved[2])
        if saved[3] is not None:
            signal.signal(signal.SIGTERM, saved[3])
        torch.set_rng_state(saved[4])
        torch.set_num_threads(saved[5])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[6], saved[7]


def train_on_shards(recipe: str, stream: str, urls, run, batch_size: int, env=None, extra=()) -> list[dict]:
    """``python train.py recipe=RECIPE data=real`` with stream ``stream`` on the shards ``urls``: two steps of a tiny
    random model, no evaluation (how a converter's or data step's test shows its shards train end to end). The run
    must succeed; its ledger's lines come back."""
    import json
    proc = run_here(["train.py", f"recipe={recipe}", "data=real", f"streams.{stream}.urls={urls}",
                     f"streams.{stream}.batch_size={batch_size}", "epochs=1", "train.steps_per_epoch=2",
                     "model.arch=negft-tiny", "model.pretrained=", "eval.suite=none", "patch.sweep=false",
                     "train.workers=0", "train.precision=fp32", "train.zero_stage=0", f"out={run}", *extra], env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (Path(run) / "ledger.jsonl").read_text().splitlines()]


def run_here(args, env=None):
    """``python train.py ARGS``, ``python eval.py ARGS`` or ``python -m negft ARGS`` run in this process, as its
    process would run it: the entry's own function with the ``sys.argv``, environment and working directory the
    process would have (SIGTERM's default handler too); its printed output and exit status come back as a
    CompletedProcess, with ``sigterm_handler``, SIGTERM's handler as the entry left it; what the run changed in the
    process is put back (``process_state``). A fresh process costs the torch, DeepSpeed and open_clip imports
    (seconds on 2 cores); a test that needs a process of its own (a signal, two ranks, a crash, a fresh
    interpreter) uses ``run_cli``."""
    import io
    import signal
    from negft.commands import cli, eval as eval_command, train as train_command
    entries = {"train.py": train_command.main, "eval.py": eval_command.main}
    if args[:1] and args[0] in entries:
        entry, argv0, rest = entries[args[0]], args[0], list(args[1:])
    elif args[:2] == ["-m", "negft"]:
        entry, argv0, rest = cli.main, "negft", list(args[2:])
    else:
        raise ValueError(f"run_here runs train.py, eval.py or -m negft, not {args[:2]}")
    out, err = io.StringIO(), io.StringIO()
    with process_state():
        os.environ.update(env or {})
        sys.argv = [argv0, *rest]
        os.chdir(REPO)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = entry(rest)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        handler = signal.getsignal(signal.SIGTERM)
    proc = subprocess.CompletedProcess([argv0, *rest], code, out.getvalue(), err.getvalue())
    proc.sigterm_handler = handler
    return proc


@pytest.fixture(scope="session")
def micro_arch() -> str:
    """``negft-micro`` (tests/model_configs): negft-tiny's kind of ViT with a tenth of its work per step, for the runs
    whose subject is not the model (a precision, a resume): bf16 matrix products on a CPU without AVX-512 take 25 to
    30 times as long as fp32 ones, and a bf16 step of negft-tiny 0.8 s."""
    import open_clip
    open_clip.add_model_config(REPO / "tests" / "model_configs")
    return "negft-micro"


@pytest.fixture(scope="session")
def bundle():
    """The tiny ViT with its transforms and tokenizer (random weights): what streams preprocess with."""
    from negft import models
    return models.build("negft-tiny", "")


def read_shards(folder) -> dict[str, dict[str, bytes]]:
    """{key: {ext: bytes}} of every sample in a folder's shards, in shard order."""
    samples: dict[str, dict[str, bytes]] = {}
    for shard in sorted(Path(folder).glob("shard-*.tar")):
        with tarfile.open(shard) as tf:
            for m in tf:
                key, ext = m.name.split(".", 1)
                samples.setdefault(key, {})[ext] = tf.extractfile(m).read()
    return samples


def write_shard(path, samples) -> str:
    """A webdataset tar of ``samples`` ([(key, {ext: bytes})], in that order) at ``path``; returns it as a str."""
    import io
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for key, members in samples:
            for ext, data in members.items():
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    return str(path)


# the files whose tests take longest (training runs, processes), longest first: `make test` hands whole files to
# its workers in collection order (pytest-xdist's loadfile with --no-loadscope-reorder; its default order, by
# number of tests, started these last and left one worker running alone at the end). Ranked by their time in
# `make test PYTEST_ARGS=--durations=0`; the other files follow in name order and fill the gaps.
LONGEST_FIRST = ("test_resume.py", "test_train.py", "test_launcher.py", "test_syncs.py", "test_speed.py",
                 "test_package.py", "test_towers.py", "test_baselines.py", "test_real_arch.py",
                 "test_benchmarks_real.py", "test_stages.py", "test_faults_data.py", "test_real_data.py",
                 "test_probes.py", "test_world.py", "test_cache_lock.py", "test_wandb.py", "test_any_model.py",
                 "test_release.py", "test_losses.py")


@pytest.hookimpl(hookwrapper=True)
def pytest_collection():
    """Collection imports torch, open_clip, DeepSpeed and every test module: about half a million objects that live
    as long as the worker. The garbage collector stays off while they are made (each full pass walks all of them
    again: seven passes, about a second) and then leaves them out of every later pass (``gc.freeze``)."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))    # stable: file order kept


# ----------------------------------------------------------------------------- two ranks, one pair of processes
# Each loss's two-rank test: a function ``case(rank, world)`` in its test module that computes its rank's share
# (collectives included) and returns tensors. One pair of gloo processes runs every case (forking the pair costs
# seconds; the cases milliseconds); each test compares its case's results with one process.
TWO_RANK_CASES = ("tests.test_losses:two_rank_case", "tests.test_loss_negclip:two_rank_case",
                  "tests.test_loss_conclip:two_rank_case", "tests.test_loss_fscclip:two_rank_case",
                  "tests.test_loss_ceclip:two_rank_case")


def _two_rank_main(rank, world, init_file, out_dir):
    import importlib

    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    results = {}
    for case in TWO_RANK_CASES:
        module, name = case.split(":")
        results[case] = getattr(importlib.import_module(module), name)(rank, world)
    torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


@pytest.fixture(scope="session")
def two_ranks(tmp_path_factory):
    """case -> [rank 0's results, rank 1's] of every ``TWO_RANK_CASES`` case, run in one pair of processes forked
    from a server that imported torch once."""
    import multiprocessing

    import torch
    import torch.multiprocessing as mp
    out = tmp_path_factory.mktemp("two-ranks")
    multiprocessing.set_forkserver_preload(PRELOAD)
    mp.start_processes(_two_rank_main, args=(2, str(out / "init"), str(out)), nprocs=2, join=True,
                       start_method="forkserver")
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=True) for r in range(2)]
    return {case: [r[case] for r in ranks] for case in TWO_RANK_CASES}


class RandomModel:
    """A model of fixed random unit features (images from seed 0, texts from seed 1): scores a benchmark's files
    end to end where only their reading is under test."""
    n_boot = 20

    def encode_images(self, paths):
        import torch
        return torch.nn.functional.normalize(torch.randn(len(paths), 8, generator=torch.Generator().manual_seed(0)),
                                             dim=-1)

    def encode_texts(self, texts):
        import torch
        return torch.nn.functional.normalize(torch.randn(len(texts), 8, generator=torch.Generator().manual_seed(1)),
                                             dim=-1)


def written_twice(root, tmp_path, writer, records_limit=None, ignore=()):
    """A world writer run twice on copies of the split ``root``'s images and annotations: the two split folders
    (to compare with each other and with ``root``, which the world build wrote)."""
    import json
    import shutil
    records = [json.loads(line) for line in (root / "annotations.jsonl").read_text().splitlines()
               if "zs_" not in line][:records_limit]
    outs = (tmp_path / "a" / "val", tmp_path / "b" / "val")
    for out in outs:
        shutil.copytree(root / "images", out / "images", ignore=shutil.ignore_patterns(*ignore))
        writer.write(out, records, [], seed=0)
    return outs


def planted_context(images: dict, texts: dict, n_boot: int = 50):
    """An evaluation context whose image and text features are the given vectors (key -> vector), normalised: a
    scorer's planted similarities, ties included, without a model."""
    import torch

    from negft.probes.base import EvalContext
    ctx = EvalContext(torch.nn.Linear(1, 1), None, None, "cpu", n_boot=n_boot)
    unit = lambda v: torch.nn.functional.normalize(torch.tensor(v, dtype=torch.float), dim=0)  # noqa: E731
    ctx._images.update({k: unit(v) for k, v in images.items()})
    ctx._texts.update({t: unit(v) for t, v in texts.items()})
    return ctx
