"""Lose nothing to a time limit or a preemption.

Slurm sends USR2 to every task ``cluster.signal_delay_s`` before the time limit (and on preemption, where
the site sends it). submitit's own handler checkpoints and requeues from rank 0 alone, while the other ranks
die of their lost peer: the steps since the last periodic checkpoint are gone. Instead, every rank notes the
signal; at each step boundary the ranks agree (an all-reduce of one flag) whether any heard it, then all of
them save a checkpoint of the step just done and end (:class:`Requeue`). The requeue itself, and the budget of
requeues that made no progress (``cluster.max_requeues``), are the batch script's, on the host
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
from launcher.train.dist import DistEnv

log = logging.getLogger(__name__)
# Slurm signals all of a job's tasks within milliseconds: a SIGTERM that the other ranks have not heard this long
# after came from outside.
TERM_GRACE_S = 2.0


class Requeue(Exception):
    """Training stopped at a step boundary to be requeued; ``step`` is saved."""

    def __init__(self, step: int) -> None:
        super().__init__(f"requeued after step {step}")
        self.step = step


class Interrupt:
    """Hears Slurm's signal on this rank; :meth:`agreed` tells every rank whether any rank heard it, and records a
    SIGTERM that only some ranks heard."""

    def __init__(self, env: DistEnv, run_dir: Path) -> None:
        self.env, self.run_dir = env, run_dir
        self.heard = preemption.heard()  # it may have come before training began
        self.terminated: float | None = None  # when this rank heard a SIGTERM (time.time())
        self._said = False  # this rank's Signalled is written
        self._flags = torch.zeros(3, device=env.device)  # heard USR2, heard SIGTERM, heard it TERM_GRACE_S ago
        signal.signal(preemption.SIGNAL, self._hear)  # replaces submitit's rank-0-only checkpoint-and-requeue
        signal.signal(signal.SIGTERM, self._hear_term)  # replaces submitit's, which only logs it

    def _hear(self, signum: int, frame: object) -> None:
        self.heard = True
        log.warning("signal %s: saving and requeuing at the next step boundary", signal.Signals(signum).name)

    def _hear_term(self, signum: int, frame: object) -> None:
        self.terminated = self.terminated or time.time()
        log.warning("signal SIGTERM: ignored, training goes on (Slurm's end of the job kills every rank)")

    def agreed(self, step: int) -> bool:
        """Whether any rank heard Slurm's signal (the same answer on every rank); ``step`` is the step just done."""
        late = self.terminated is not None and time.time() - self.terminated >= TERM_GRACE_S
        self._flags.copy_(torch.tensor([float(self.heard), float(self.terminated is not None), float(late)]))
        dist.all_reduce(self._flags)
        heard, terminated, late_anywhere = (int(v) for v in self._flags.tolist())
        if self.terminated is not None and not self._said and late_anywhere and terminated < self.env.world_size:
            self._said = True
            append_event(self.run_dir, Signalled(
                time=self.terminated, job_id=os.environ.get("SLURM_JOB_ID"), signal="SIGTERM", rank=self.env.rank,
                node=self.env.node, pid=os.getpid(), step=step,
                action=f"ignored: training went on ({terminated} of {self.env.world_size} ranks got one)"))
        return heard > 0
