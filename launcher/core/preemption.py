"""Slurm's time-limit and preemption signal, heard from the moment a task starts.

Slurm sends USR2 ``cluster.signal_delay_s`` before the time limit, give or take its 30-second scheduling
tick, so with a short limit it can arrive while a task is still importing torch or loading its checkpoint.
submitit's own handler would then requeue the job from rank 0 alone, outside the requeue budget. Listening
from the task's first line instead turns an early signal into the same agreed save-and-requeue at the first
step boundary (launcher/train/interrupt.py) as a late one.
"""
from __future__ import annotations

import signal

SIGNAL = signal.SIGUSR2
# Slurm checks time limits on a 30-second tick and signals when the limit is within the delay plus one tick.
TICK_S = 30
_heard = False


def listen() -> None:
    """From now on, note the signal instead of letting submitit act on it."""
    signal.signal(SIGNAL, _hear)


def _hear(signum: int, frame: object) -> None:
    global _heard
    _heard = True


def heard() -> bool:
    return _heard
