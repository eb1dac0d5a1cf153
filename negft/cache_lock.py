"""One builder per cache entry: jobs started together on a cold cache (a Slurm array over points of one world seed,
two lanes of the selection protocol) would each build the same world and train the same base into the same
folder. The first job takes the entry's lock; the others wait, saying whose build they wait for, then reuse it.

The lock is ``filelock.FileLock`` (``flock``): the kernel drops it when its holder dies, so a killed job's lock
never blocks the next one. In a multi-rank job rank 0 takes it; every rank polls together (a short collective per
try), so the other ranks never sit in one collective for longer than a try lasts, however long the wait.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from filelock import FileLock, Timeout

POLL_S = 5.0


def lock_path(entry: Path) -> Path:
    return entry.parent / f".{entry.name}.lock"


def owner_path(entry: Path) -> Path:
    return entry.parent / f".{entry.name}.owner.json"


def _all_ranks_agree(mine: bool) -> bool:
    """True when every rank says True (rank 0's try, the others' yes); one process alone decides alone."""
    import torch
    import torch.distributed as dist
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return mine
    flag = torch.tensor([1 if mine else 0], dtype=torch.int32)
    if dist.get_backend() == "nccl":
        flag = flag.cuda()
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _holder(entry: Path) -> str:
    try:
        o = json.loads(owner_path(entry).read_text())
        return f"pid {o['pid']} on {o['host']} since {o['since']} ({o['command']})"
    except (OSError, ValueError, KeyError):
        return "another job (it has not said who yet)"


@contextmanager
def cache_lock(entry: str | Path, what: str, rank: int = 0, collective: bool = False,
               poll_s: float = POLL_S) -> Iterator[None]:
    """Hold the lock of cache entry ``entry`` (a folder) while the block checks for it and builds it. ``what``
    names the entry in the waiting message. Only rank 0 takes the lock; with ``collective`` every rank of the job
    calls this and all leave the wait together (without it, rank 0 alone calls it)."""
    entry = Path(entry)
    entry.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(lock_path(entry))) if rank == 0 else None
    said = False
    while True:
        got = True
        if lock is not None:
            try:
                lock.acquire(timeout=0 if not said else poll_s)
            except Timeout:
                got = False
                if not said:
                    print(f"[negft] waiting for {what}: {_holder(entry)} is building it into {entry} "
                          f"(lock {lock_path(entry)})", flush=True)
                    said = True
        if (_all_ranks_agree(got) if collective else got):
            break
    try:
        if lock is not None:
            owner_path(entry).write_text(json.dumps({
                "pid": os.getpid(), "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300]}))
            if said:
                print(f"[negft] {what}: the lock is ours now", flush=True)
        yield
    finally:
        if lock is not None:
            owner_path(entry).unlink(missing_ok=True)
            lock.release()
