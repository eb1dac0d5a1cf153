"""Counting a training step's work on any machine, a CPU included: the ops it dispatches (a proxy for the kernels
it launches on a GPU) and the ops that would make the host wait for the device there (a device → host round trip:
the host reads a value the device computes, so the GPU's queue drains and the next kernels wait for Python).

On a CPU every tensor is the host's and nothing waits, so an op is flagged by what it would do on a GPU
(``host_sync``) unless every tensor it reads is the host's own: made where the host builds a batch
(``HostSyncs.on_host``) or computed from such tensors alone (``is_host``). The flagged ops: ``aten._local_scalar_dense`` (``.item()``, ``.tolist()``, ``bool()``, ``int()``, ``float()`` of a
tensor, ``if tensor:``), ops whose output size depends on the values (``nonzero``, ``masked_select``, ``unique``,
``repeat_interleave`` without ``output_size``, indexing with a boolean mask, ...), ``equal``, and copies from a
device to the CPU. Each is recorded with the lines of negft (and of the caller's own scripts) that issued it.

    with HostSyncs() as count:
        for batch in batches:
            count.begin("step")          # a new bucket: the ops and syncs until the next begin
            step(batch)
    assert not count.syncs, count.report()
"""
from __future__ import annotations

import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parents[2]      # the repository: negft/, bench/, tests/
SYNC_OPS = {        # op (overload packet) -> what it does on a GPU
    "_local_scalar_dense": "reads a value to the host (.item(), .tolist(), bool(), int(), float(), `if tensor`)",
    "item": "reads a value to the host (.item())",
    "is_nonzero": "reads a value to the host (bool(tensor))",
    "equal": "reads a value to the host (torch.equal)",
    "nonzero": "sizes its output by the values (the host waits for the count)",
    "argwhere": "sizes its output by the values (the host waits for the count)",
    "masked_select": "sizes its output by the values (the host waits for the count)",
    "unique": "sizes its output by the values (the host waits for the count)",
    "_unique": "sizes its output by the values (the host waits for the count)",
    "_unique2": "sizes its output by the values (the host waits for the count)",
    "unique_dim": "sizes its output by the values (the host waits for the count)",
    "unique_consecutive": "sizes its output by the values (the host waits for the count)",
    "bincount": "sizes its output by the values (the host waits for the largest)",
}
INDEX_OPS = ("index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put")

# The runs that between them train every objective of the recipes on the world (tests/test_syncs.py counts them
# here, bench/gpu_syncs.py on a GPU): clip (negcap, world-pretrain), mcq (negmcq), relcomp, negfull on the
# text tower over frozen image features (demo), and negfull-guarded with every term on (the hard negatives, the
# text→image term over every option, each part of the drift guard) training both towers, whose terms are a superset
# of the negfull and negfull-guarded recipes'
EVERY_TERM = ["loss.negfull.hard_negatives=1", "loss.negfull.t2i_options=1", "loss.guard.options=1",
              "loss.guard.kl=1", "loss.guard.l2sp=1", "tower=vt"]
# and the baselines': FSC-CLIP's token-patch term where it acts, on a ViT
BASELINES = ("negclip", "tripletclip", "conclip", "negationclip", "fscclip", "ceclip")
RUNS = {**{r: [f"recipe={r}"] for r in ("negcap", "negmcq", "relcomp", "demo", "world-pretrain", *BASELINES)},
        "negfull-every-term": ["recipe=negfull-guarded", *EVERY_TERM],
        "fscclip-token-patch": ["recipe=fscclip", "loss.fscclip.w_local=0.2", "model.world_arch=negft-tiny"]}


def _tensors(x):
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)


def host_sync(func, args, kwargs) -> str | None:
    """What ``func`` (an aten op overload) would make the host wait for on a GPU, or None if nothing."""
    name = func.overloadpacket.__name__
    if name in SYNC_OPS:
        return SYNC_OPS[name]
    if name == "repeat_interleave" and kwargs.get("output_size") is None and (
            len(args) < 3 or args[2] is None) and isinstance(args[0], torch.Tensor) and (
            len(args) > 1 and isinstance(args[1], torch.Tensor) or args[0].dtype in (torch.int64, torch.int32)):
        return "sizes its output by the repeats (the host waits for their sum; pass output_size)"
    if name in INDEX_OPS and len(args) > 1 and any(t.dtype in (torch.bool, torch.uint8)
                                                   for t in _tensors(args[1])):
        return "indexes with a boolean mask (a nonzero: the host waits for the count)"
    if name in ("_to_copy", "copy_", "to"):
        src = args[1] if name == "copy_" else args[0]
        dst = args[0].device if name == "copy_" else kwargs.get("device")
        if isinstance(src, torch.Tensor) and dst is not None and torch.device(dst).type == "cpu" \
                and src.device.type != "cpu":
            return "copies from the device to the host"
    return None


def mark_host(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t`` as the host's own (made on the host: ``HostSyncs.on_host``, or from host tensors alone)."""
    t._negft_host = True
    return t


def is_host(t: torch.Tensor) -> bool:
    """Whether ``t`` is the host's own tensor, which no op has to wait for a device to read. On a CPU every tensor
    is the host's; the mode tells the host's apart from those a GPU would hold by where they were made."""
    return getattr(t, "_negft_host", False)


def issuers(skip: int = 2, roots: tuple[Path, ...] = (ROOT,)) -> list[str]:
    """The stack's frames under ``roots`` (the repository), innermost first: ``path:line in function``. Installed
    packages are not the repository's, also where its virtual environment lives inside it (``make``'s .venv)."""
    out, frame = [], sys._getframe(skip)
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        if any(path.is_relative_to(r) for r in roots) and path.name != "syncs.py" \
                and not {"site-packages", "dist-packages"} & set(path.parts):
            where = path.relative_to(next(r for r in roots if path.is_relative_to(r)))
            out.append(f"{where}:{frame.f_lineno} in {frame.f_code.co_name}")
        frame = frame.f_back
    return out


@dataclass
class Sync:
    """One op that would make the host wait for the device."""
    op: str                 # aten.nonzero.default
    why: str                # what it does on a GPU
    stack: list[str]        # the repository's frames that issued it, innermost first
    bucket: str = ""        # the ``HostSyncs.begin`` label it ran under

    def __str__(self) -> str:
        where = self.stack[0] if self.stack else "(no frame of the repository)"
        callers = "; called from " + " <- ".join(self.stack[1:4]) if len(self.stack) > 1 else ""
        return f"{self.op} at {where} [{self.bucket}]: {self.why}{callers}"


@dataclass
class Bucket:
    """The ops and syncs between two ``HostSyncs.begin`` calls; ``host_ops``: those run on the host's own tensors
    (``HostSyncs.on_host``), counted apart and never syncs."""
    label: str
    ops: int = 0
    host_ops: int = 0
    by_op: Counter = field(default_factory=Counter)
    syncs: list[Sync] = field(default_factory=list)


class HostSyncs(TorchDispatchMode):
    """A dispatch mode that counts every aten op dispatched on this thread (autograd's backward on a CPU included)
    and records each op that would make the host wait for the device on a GPU (``host_sync``), with the
    repository's frames that issued it. ``begin(label)`` starts a new bucket (a training step, say); ``on_host()``
    marks a block that works on the host's own tensors (a batch read and collated before its transfer to the
    device: nothing there waits for a device); ``pause()`` leaves a block uncounted. The ops run unchanged:
    results are the same with the mode on."""

    def __init__(self, roots: tuple[Path, ...] = (ROOT,)):
        super().__init__()
        self.roots = roots
        self.buckets: list[Bucket] = [Bucket("")]
        self._paused = self._host = 0

    def begin(self, label: str) -> Bucket:
        self.buckets.append(Bucket(label))
        return self.buckets[-1]

    @contextmanager
    def pause(self):
        self._paused += 1
        try:
            yield
        finally:
            self._paused -= 1

    @contextmanager
    def on_host(self):
        self._host += 1
        try:
            yield
        finally:
            self._host -= 1

    @property
    def ops(self) -> int:
        return sum(b.ops for b in self.buckets)

    @property
    def syncs(self) -> list[Sync]:
        return [s for b in self.buckets for s in b.syncs]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._paused:
            return func(*args, **kwargs)
        inputs = list(_tensors(list(args) + list(kwargs.values())))
        on_host = self._host or (inputs and all(is_host(t) for t in inputs))
        out = func(*args, **kwargs)
        if on_host:         # the host's own tensors, and what is computed from them alone: host tensors
            self.buckets[-1].host_ops += 1
            for t in _tensors(out if isinstance(out, (list, tuple)) else [out]):
                mark_host(t)
            return out
        bucket = self.buckets[-1]
        bucket.ops += 1
        bucket.by_op[func.overloadpacket.__name__] += 1
        why = host_sync(func, args, kwargs)
        if why is not None:
            bucket.syncs.append(Sync(str(func), why, issuers(2, self.roots), bucket.label))
        return out

    def report(self, syncs: list[Sync] | None = None) -> str:
        """One line per distinct sync (op and frames), with how many times it ran."""
        syncs = self.syncs if syncs is None else syncs
        seen = Counter((s.op, tuple(s.stack[:4])) for s in syncs)
        first = {}
        for s in syncs:
            first.setdefault((s.op, tuple(s.stack[:4])), s)
        return "\n".join(f"{n}× {first[k]}" for k, n in seen.items()) or "no host syncs"
