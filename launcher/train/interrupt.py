"""Lose nothing to a time limit or a preemption.

Slurm sends USR2 to every task ``cluster.signal_delay_s`` before the time limit (and on preemption, where
the site sends it). submitit's own handler checkpoints and requeues from rank 0 alone, while the other ranks
die of their lost peer: the steps since the last periodic checkpoint are gone. Instead, every rank notes the
signal; at each step boundary the ranks agree (an all-reduce of one flag) whether any heard it, then all of
them save a checkpoint of the step just done and end (:class:`Requeue`). The requeue itself, and the budget of
requeues that made no progress (``cluster.max_requeues``), are the batch script's, on the host
(launcher/job/recovery.py): a rank may run in a container that has no Slurm client.
"""
from __future__ import annotations

import logging
import signal

import torch
import torch.distributed as dist

from launcher.core import preemption
from launcher.train.dist import DistEnv

log = logging.getLogger(__name__)


class Requeue(Exception):
    """Training stopped at a step boundary to be requeued; ``step`` is saved."""

    def __init__(self, step: int) -> None:
        super().__init__(f"requeued after step {step}")
        self.step = step


class Interrupt:
    """Hears Slurm's signal on this rank; :meth:`agreed` tells every rank whether any rank heard it."""

    def __init__(self, env: DistEnv) -> None:
        self.env = env
        self.heard = preemption.heard()  # it may have come before training began
        self._flag = torch.zeros(1, device=env.device)
        signal.signal(preemption.SIGNAL, self._hear)  # replaces submitit's rank-0-only checkpoint-and-requeue

    def _hear(self, signum: int, frame: object) -> None:
        self.heard = True
        log.warning("signal %s: saving and requeuing at the next step boundary", signal.Signals(signum).name)

    def agreed(self) -> bool:
        self._flag.fill_(float(self.heard))
        dist.all_reduce(self._flag, op=dist.ReduceOp.MAX)
        return bool(self._flag.item())
