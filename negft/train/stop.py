"""SIGTERM, a cluster scheduler's notice before its SIGKILL: the run finishes its step, writes a checkpoint and
exits (``Stopped``; the command line exits 143 = 128 + SIGTERM with the command that continues the run)."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import torch
import torch.distributed as dist


class Stopped(RuntimeError):
    """The run stopped on SIGTERM after step ``step``; ``checkpoint`` holds it, complete."""

    def __init__(self, checkpoint: Path, step: int):
        super().__init__(f"stopped by SIGTERM after step {step}; its checkpoint is {checkpoint}")
        self.checkpoint, self.step = Path(checkpoint), step


class StopRequest:
    """While in its ``with`` block, SIGTERM only sets ``requested`` (the handler that was there before comes back
    when the block ends); the loop asks ``agreed`` at step ends and stops there."""

    def __init__(self):
        self.requested = False
        self._installed, self._previous = False, None

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():     # signal handlers live in the main thread
            self._previous = signal.signal(signal.SIGTERM, self._handle)
            self._installed = True
        return self

    def __exit__(self, *exc) -> None:
        if self._installed:         # None: a handler set outside Python, which cannot be put back; the default then
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self._previous is None else self._previous)
            self._installed = False

    def _handle(self, signum, frame) -> None:
        self.requested = True

    def agreed(self, device) -> bool:
        """Whether any rank got SIGTERM. Ranks may get it at different steps and a checkpoint is a collective, so
        on several ranks this is one (every rank calls it at the same steps) and they stop together."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return self.requested
        flag = torch.tensor(float(self.requested), device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

