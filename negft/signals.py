"""The signals that stop a run at its next step's end: a scheduler's SIGTERM (before its SIGKILL), Slurm's
``--signal=USR1@S`` (before the time limit) and Ctrl-C (SIGINT) in a terminal. The training process handles them
(``negft.train.stop``); the loader workers, which get them too (Ctrl-C reaches the terminal's whole process group),
ignore them (``negft.data.pipeline``): a worker killed by one would print its traceback and fail the step."""
import signal

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
