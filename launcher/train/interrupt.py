"""Lose nothing to a time limit or a preemption.

Slurm sends USR2 to every task ``cluster.signal_delay_s`` before the time limit (and on preemption, where
the site sends it). submitit's own handler checkpoints and requeues from rank 0 alone, while the other ranks
die of their lost peer: the steps since the last periodic checkpoint are gone. Instead, every rank notes the
signal; at step boundaries the ranks agree (an all-reduce of a few flags) whether any heard it, then all of
them save a checkpoint of the step just done and end (:class:`Requeue`). They agree at every save, and between
saves after as many steps as take :func:`within_s` (10 s, less if Slurm's warning is short) at the step time
measured since the last agreement (growing by doubling from one step): on a GPU an agreement is a host sync
(launcher/train/host_sync.py), too costly for every step, and 10 s is well inside the warning, less the time a
save takes. The requeue itself, and
the budget of requeues that made no progress (``cluster.max_requeues``), are the batch script's, on the host
(launcher/job/recovery.py): a rank may run in a container that has no Slurm client.

A SIGTERM, by contrast, is ignored (as submitit's own handler does): at Slurm's own end of the job (a scancel, the
time limit, a node's shutdown) every rank gets it and the SIGKILL that follows after ``KillWait`` ends the attempt,
whose end the batch script records. A SIGTERM that reaches some ranks only comes from outside (a user's ``kill``, a
site's clean-up script): the same all-reduce counts the ranks that heard one, and once the others have not for
``TERM_GRACE_S`` each rank that did records it (:class:`Signalled`), so that ``describe`` says what happened to it.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.core import preemption
from launcher.core.events import Signalled
from launcher.core.rundir import append_event
from launcher.train import host_sync
from launcher.train.dist import DistEnv

log = logging.getLogger(__name__)
# Slurm signals all of a job's tasks within milliseconds: a SIGTERM that the other ranks have not heard this long
# after came from outside.
TERM_GRACE_S = 2.0
CHECK_WITHIN_S = 10.0  # a signal, or a NaN (launcher/train/guard.py), is acted on within this many seconds of steps


def within_s(signal_delay_s: float) -> float:
    """How soon after Slurm's signal the ranks act on it: :data:`CHECK_WITHIN_S`, or a quarter of the warning
    (``cluster.signal_delay_s``) when that is shorter, so that the save still fits in what is left; at least a
    step (the ranks agree after the step in progress)."""
    return min(CHECK_WITHIN_S, signal_delay_s / 4)


class Requeue(Exception):
    """Training stopped at a step boundary to be requeued; ``step`` is saved."""

    def __init__(self, step: int) -> None:
        super().__init__(f"requeued after step {step}")
        self.step = step


class Interrupt:
    """Hears Slurm's signal on this rank; :meth:`agreed` tells every rank whether any rank heard it, and records a
    SIGTERM that only some ranks heard."""

    def __init__(self, env: DistEnv, run_dir: Path, signal_delay_s: float) -> None:
        self.env, self.run_dir, self.within_s = env, run_dir, within_s(signal_delay_s)
        self.heard = preemption.heard()  # it may have come before training began
        self.terminated: float | None = None  # when this rank heard a SIGTERM (time.time())
        self._said = False  # this rank's Signalled is written
        # heard USR2, heard SIGTERM, heard it TERM_GRACE_S ago, seconds per step since the last agreement
        self._flags = torch.zeros(4, dtype=torch.float64, device=env.device)
        self._last: tuple[int, float] | None = None  # the step boundary of the last agreement, and when
        self._every, self._next = 1, 0  # steps between agreements; the ranks agree at the first boundary from _next
        signal.signal(preemption.SIGNAL, self._hear)  # replaces submitit's rank-0-only checkpoint-and-requeue
        signal.signal(signal.SIGTERM, self._hear_term)  # replaces submitit's, which only logs it

    def _hear(self, signum: int, frame: object) -> None:
        self.heard = True
        log.warning("signal %s: saving and requeuing at the next step boundary", signal.Signals(signum).name)

    def _hear_term(self, signum: int, frame: object) -> None:
        self.terminated = self.terminated or time.time()
        log.warning("signal SIGTERM: ignored, training goes on (Slurm's end of the job kills every rank)")

    def due(self, done: int) -> bool:
        """Whether the ranks agree at this step boundary between saves (the same answer on every rank)."""
        return done >= self._next

    def agreed(self, step: int) -> bool:
        """Whether any rank heard Slurm's signal (the same answer on every rank); ``step`` is the step just done.
        Sets the next boundary to agree at: as many steps as fit in :attr:`within_s` at the ranks' mean step
        time since the last agreement, but at most twice as many as last time (one step's time is a poor guide to
        the next hundred's), so the bound holds while the steps keep their pace; steps that slow down stretch it for
        an interval or two, until an agreement has measured them (tests/unit/test_train_dist.py)."""
        now = time.perf_counter()
        per_step = (now - self._last[1]) / (step - self._last[0]) if self._last and step > self._last[0] else 0.0
        self._last = (step, now)
        late = self.terminated is not None and time.time() - self.terminated >= TERM_GRACE_S
        self._flags.copy_(torch.tensor([float(self.heard), float(self.terminated is not None), float(late), per_step],
                                       dtype=torch.float64))
        dist.all_reduce(self._flags)
        heard, terminated, late_anywhere, seconds = host_sync.read(self._flags)
        mean = seconds / self.env.world_size
        self._every = min(max(1, int(self.within_s / mean)) if mean > 0 else 1, 2 * self._every)
        self._next = step + self._every
        if self.terminated is not None and not self._said and late_anywhere and terminated < self.env.world_size:
            self._said = True
            append_event(self.run_dir, Signalled(
                time=self.terminated, job_id=os.environ.get("SLURM_JOB_ID"), signal="SIGTERM", rank=self.env.rank,
                node=self.env.node, pid=os.getpid(), step=step,
                action=f"ignored: training went on ({int(terminated)} of {self.env.world_size} ranks got one)"))
        return heard > 0
