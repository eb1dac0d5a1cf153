"""A scheduler's notice before its SIGKILL: SIGTERM (scancel, preemption, most schedulers at a time limit) or
SIGUSR1 (Slurm's ``--signal=USR1@SECONDS`` before the time limit), and a user's Ctrl-C (SIGINT). The run finishes
its step, writes a checkpoint and exits (``Stopped``; the command line exits 128 + the signal's number, as if killed
by it: 143 for SIGTERM, 138 for SIGUSR1, 130 for SIGINT, with the command that continues the run). A second Ctrl-C
does not wait for the step: it raises ``KeyboardInterrupt`` at once (the command line then names the last complete
checkpoint)."""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import torch
import torch.distributed as dist

from negft.signals import STOP_SIGNALS


class Stopped(RuntimeError):
    """The run stopped on signal ``signum`` after step ``step``; ``checkpoint`` holds it, complete."""

    def __init__(self, checkpoint: Path, step: int, signum: int = signal.SIGTERM):
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}; its checkpoint is {checkpoint}")
        self.checkpoint, self.step, self.signum = Path(checkpoint), step, int(signum)

    @property
    def exit_code(self) -> int:
        """128 + the signal's number: what a shell reports for a process the signal ended."""
        return 128 + self.signum


class StopRequest:
    """While in its ``with`` block, the ``STOP_SIGNALS`` only set ``signum`` (the handlers that were there before
    come back when the block ends); the loop asks ``agreed`` at step ends and stops there."""

    def __init__(self):
        self.signum = 0            # the stop signal received (SIGTERM over SIGUSR1 over SIGINT), 0 for none
        self._previous: dict = {}

    @property
    def requested(self) -> bool:
        return self.signum != 0

    def __enter__(self) -> "StopRequest":
        if threading.current_thread() is threading.main_thread():     # signal handlers live in the main thread
            self._previous = {s: signal.signal(s, self._handle) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc) -> None:
        for s, previous in self._previous.items():  # None: set outside Python, cannot be put back; the default then
            signal.signal(s, signal.SIG_DFL if previous is None else previous)
        self._previous = {}

    def _handle(self, signum, frame) -> None:
        if signum == signal.SIGINT and self.signum == signal.SIGINT:
            raise KeyboardInterrupt             # a second Ctrl-C: the user will not wait for the step's end
        self.signum = max(self.signum, signum)

    def agreed(self, device) -> bool:
        """Whether any rank got a stop signal; ``signum`` becomes the greatest any rank got (SIGTERM, which asks
        for no requeue, over SIGUSR1), so every rank exits with the same code. Ranks may get it at different steps
        and a checkpoint is a collective, so on several ranks this is one (every rank calls it at the same steps)
        and they stop together."""
        if not (dist.is_initialized() and dist.get_world_size() > 1):
            return self.requested
        flag = torch.tensor(float(self.signum), device=device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        self.signum = int(flag.item())
        return self.requested
