"""Slurm's time-limit and preemption signal, heard from the moment a task starts, and the time Slurm leaves the
tasks after its SIGTERM.

Slurm sends USR2 ``cluster.signal_delay_s`` before the time limit, give or take its 30-second scheduling
tick, so with a short limit it can arrive while a task is still importing torch or loading its checkpoint.
submitit's own handler would then requeue the job from rank 0 alone, outside the requeue budget. Listening
from the task's first line instead turns an early signal into the same agreed save-and-requeue at the first
step boundary (launcher/train/interrupt.py) as a late one.

Slurm's own end of a job (a scancel, an ``scontrol requeue``, a preemption that sends SIGTERM first, the time
limit's end) is a SIGTERM to every task and a SIGKILL ``KillWait`` seconds later. The batch script asks Slurm for
KillWait on the host, where Slurm's tools are (a task may run in a container without them), and hands it to the
tasks in :data:`KILL_WAIT` (launcher/slurm/batch.py); :func:`save_fits` is the rule by which the ranks save on
that SIGTERM or train on to the SIGKILL (launcher/train/interrupt.py).
"""
from __future__ import annotations

import os
import signal
from typing import Mapping, Optional

SIGNAL = signal.SIGUSR2
# Slurm checks time limits on a 30-second tick and signals when the limit is within the delay plus one tick.
TICK_S = 30
_heard = False


def listen() -> None:
    """From now on, note the signal instead of dying of it (USR2's default action); the task's first line
    (launcher/job/task.py), until training listens itself (launcher/train/interrupt.py)."""
    signal.signal(SIGNAL, _hear)


def _hear(signum: int, frame: object) -> None:
    global _heard
    _heard = True


def heard() -> bool:
    return _heard


KILL_WAIT = "LAUNCHER_KILL_WAIT_S"  # Slurm's KillWait in seconds, in every task's environment ("" when unknown)
# A save on Slurm's SIGTERM is taken to last this much longer than the longest timed (every rank writes at once, as
# at any save, but the file system may be busier), and the ranks need this long after it: rank 0's record, the
# process group's end.
SAVE_SLACK, AFTER_SAVE_S = 1.5, 2.0


def kill_wait_s(environ: Mapping[str, str] = os.environ) -> Optional[float]:
    """Slurm's KillWait as the batch script handed it to this task; None when it did not (unknown)."""
    text = environ.get(KILL_WAIT, "").strip()
    return float(text) if text.isdigit() else None


def save_fits(kill_wait: Optional[float], heard_s: float, save_s: Optional[float]) -> Optional[str]:
    """Whether the ranks save on Slurm's SIGTERM, heard ``heard_s`` seconds ago: None when a save of about ``save_s``
    (with :data:`SAVE_SLACK` and :data:`AFTER_SAVE_S`) fits in what is left of ``kill_wait`` (KillWait) before the
    SIGKILL; else why not, in words. A save that the SIGKILL cuts short saves nothing, so one that may not fit is
    not begun, nor one whose time cannot be told."""
    if kill_wait is None:
        return ("Slurm's KillWait is unknown here (the batch script could not ask Slurm, or the tasks' environment "
                f"lacks {KILL_WAIT}), so whether a save fits before the SIGKILL cannot be told")
    if save_s is None:
        return "no checkpoint was saved or loaded in this attempt yet, so how long a save takes cannot be told"
    left = kill_wait - heard_s
    if save_s * SAVE_SLACK + AFTER_SAVE_S > left:
        return (f"a save (about {save_s:.1f} s) would not fit in the {max(left, 0.0):.1f} s left of "
                f"KillWait={kill_wait:.0f} s")
    return None
