"""The signals that stop a run at its next step's end: a scheduler's SIGTERM (before its SIGKILL) and Slurm's
``--signal=USR1@S`` (before the time limit). The training process handles them (``negft.train.stop``); the
loader workers, which get them too, ignore them (``negft.data.pipeline``)."""
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
