"""Lose nothing to a time limit, a preemption, a user's stop, or Slurm's end of the job when there is time.

Slurm sends USR2 to every task ``cluster.signal_delay_s`` before the time limit (and on preemption, where
the site sends it). A handler that checkpoints and requeues from rank 0 alone (submitit's ``Checkpointable``)
would leave the other ranks to die of their lost peer, and the steps since the last periodic checkpoint lost.
Instead, every rank notes the signal; at step boundaries the ranks agree (an all-reduce of a few flags) whether
any heard it, then all of them save a checkpoint of the step just done and end (:class:`Interrupted`). They agree
at every save, and between
saves after as many steps as take :func:`within_s` (10 s, less if Slurm's warning is short) at the step time
measured since the last agreement (growing by doubling from one step): on a GPU an agreement is a host sync
(launcher/train/host_sync.py), too costly for every step, and 10 s is well inside the warning, less the time a
save takes. The requeue itself, and
the budget of requeues that made no progress (``cluster.max_requeues``), are the batch script's, on the host
(launcher/job/recovery.py): a rank may run in a container that has no Slurm client.

``launcher stop`` asks through the run's files (launcher/core/stop_request.py): rank 0 alone looks for its request
at each agreement, and its flag joins the same all-reduce, so every rank saves the step just done and ends, and
rank 0 records ``stopped``; the attempt ends CANCELLED, never requeued or retried.

A SIGTERM is Slurm's own end of the job (a scancel, an ``scontrol requeue``, a preemption that sends it first, the
time limit's end) when every rank heard it: Slurm signals all of a job's tasks within milliseconds, and kills them
``KillWait`` later (handed to the tasks by the batch script, launcher/core/preemption.py). Once any rank has heard
one, the ranks agree at every step boundary (decided from the all-reduced flags, so alike on every rank) until
they can tell: at the first agreement that finds every rank heard it, they save the step just done and end when
the save fits in what is left of KillWait (:func:`launcher.core.preemption.save_fits`), else train on until the
SIGKILL, as a SIGTERM was answered before; rank 0 records either (``terminated``). A SIGTERM that reaches some ranks
only comes from outside (a user's ``kill``, a site's clean-up script): once the others have not heard one for
``TERM_GRACE_S``, each rank that did records it (:class:`Signalled`) and training goes on.
"""
from __future__ import annotations

import logging
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.core import preemption, stop_request
from launcher.core.events import Event, Requeued, Signalled, Stopped, Terminated
from launcher.core.rundir import append_event
from launcher.train import host_sync
from launcher.train.dist import DistEnv

log = logging.getLogger(__name__)
# Slurm signals all of a job's tasks within milliseconds: a SIGTERM that the other ranks have not heard this long
# after came from outside.
TERM_GRACE_S = 2.0
CHECK_WITHIN_S = 10.0  # a signal, or a NaN (launcher/train/guard.py), is acted on within this many seconds of steps
# What each rank adds to the agreement's all-reduce: heard USR2; heard a SIGTERM not yet judged; heard it
# TERM_GRACE_S ago; seconds per step since the last agreement; a stop asked (rank 0); seconds since the SIGTERM;
# the longest save timed; whether one was.
FLAGS = ("usr2", "term", "late", "per_step", "stop", "term_s", "save_s", "timed")


def within_s(signal_delay_s: float) -> float:
    """How soon after Slurm's signal the ranks act on it: :data:`CHECK_WITHIN_S`, or a quarter of the warning
    (``cluster.signal_delay_s``) when that is shorter, so that the save still fits in what is left; at least a
    step (the ranks agree after the step in progress)."""
    return min(CHECK_WITHIN_S, signal_delay_s / 4)


class Interrupted(Exception):
    """Training stopped at a step boundary, ``step`` saved on every rank; ``event`` is rank 0's record of why:
    ``requeued`` (Slurm's warning: the batch script requeues the job), ``stopped`` (a user's stop) or ``terminated``
    (Slurm's SIGTERM)."""

    def __init__(self, step: int, event: Event) -> None:
        super().__init__(f"{event.kind} after step {step}")
        self.step, self.event = step, event


class Interrupt:
    """Hears Slurm's signals on this rank; :meth:`agreed` tells every rank whether to save and end, and records a
    SIGTERM that only some ranks heard, or Slurm's that leaves no time to save."""

    def __init__(self, env: DistEnv, run_dir: Path, signal_delay_s: float) -> None:
        self.env, self.run_dir, self.within_s = env, run_dir, within_s(signal_delay_s)
        self.heard = preemption.heard()  # it may have come before training began
        self.terminated: float | None = None  # when this rank heard a SIGTERM not yet judged (time.time())
        self.kill_wait_s = preemption.kill_wait_s()
        self.save_s: float | None = None  # the longest save of this attempt (before one: the checkpoint's load)
        self._said = False  # this rank's Signalled is written
        self._request: stop_request.StopRequest | None = None  # rank 0's: the stop asked of this job
        self._flags = torch.zeros(len(FLAGS), dtype=torch.float64, device=env.device)
        self._last: tuple[int, float] | None = None  # the step boundary of the last agreement, and when
        self._every, self._next = 1, 0  # steps between agreements; the ranks agree at the first boundary from _next
        signal.signal(preemption.SIGNAL, self._hear)  # replaces the task's start-up listener (launcher/job/task.py)
        signal.signal(signal.SIGTERM, self._hear_term)  # replaces the task's, which only logs it

    def _hear(self, signum: int, frame: object) -> None:
        self.heard = True
        log.warning("signal %s: saving and requeuing at the next step boundary", signal.Signals(signum).name)

    def _hear_term(self, signum: int, frame: object) -> None:
        self.terminated = self.terminated or time.time()
        log.warning("signal SIGTERM: at the next agreement the ranks tell whether Slurm sent it (to every rank) and "
                    "save if the save fits before its SIGKILL; else training goes on")

    def saved_in(self, seconds: float) -> None:
        """A save (or the checkpoint's load, before the first save) took ``seconds`` on this rank."""
        self.save_s = max(self.save_s or 0.0, seconds)

    def due(self, done: int) -> bool:
        """Whether the ranks agree at this step boundary between saves (the same answer on every rank)."""
        return done >= self._next

    def agreed(self, step: int) -> Event | None:
        """What every rank does after ``step``, the step just done (the same answer on every rank): save it and end,
        with the event rank 0 records of why (Slurm's SIGTERM that leaves time to save, a user's stop, Slurm's
        warning), or train on (None). Sets the next boundary to agree at (:meth:`_schedule`)."""
        sums = dict(zip(FLAGS, self._reduce(step)))
        world = self.env.world_size
        self._schedule(step, sums["per_step"] / world, every_step=sums["term"] > 0)
        if sums["term"] == world:  # Slurm's: every rank heard it
            ended = self._slurms_end(step, sums["term_s"] / world,
                                     sums["save_s"] / world if sums["timed"] == world else None)
            return ended if ended.saved else None  # too late to save: trained on until the SIGKILL
        if sums["term"] and sums["late"]:
            self._from_outside(step, int(sums["term"]))
        job_id = os.environ.get("SLURM_JOB_ID")
        if sums["stop"]:
            return Stopped(job_id=job_id, step=step, by=self._request.by if self._request else None)
        return Requeued(job_id=job_id, step=step, by="signal") if sums["usr2"] else None

    def _reduce(self, step: int) -> list[float]:
        """This rank's :data:`FLAGS` after ``step``, added up over the ranks."""
        now, clock = time.perf_counter(), time.time()
        per_step = (now - self._last[1]) / (step - self._last[0]) if self._last and step > self._last[0] else 0.0
        self._last = (step, now)
        heard_s = clock - self.terminated if self.terminated is not None else 0.0
        if self.env.is_main:  # one stat of the run directory per agreement, on one rank
            self._request = stop_request.asked(self.run_dir)
        mine = {"usr2": self.heard, "term": self.terminated is not None, "late": heard_s >= TERM_GRACE_S,
                "per_step": per_step, "stop": self._request is not None, "term_s": heard_s,
                "save_s": self.save_s or 0.0, "timed": self.save_s is not None}
        self._flags.copy_(torch.tensor([float(mine[name]) for name in FLAGS], dtype=torch.float64))
        dist.all_reduce(self._flags)
        return host_sync.read(self._flags)

    def _schedule(self, step: int, mean: float, every_step: bool) -> None:
        """The next boundary to agree at: at every step while a SIGTERM is not judged, else as many steps as fit
        in :attr:`within_s` at the ranks' mean step time since the last agreement, but at most twice as many as
        last time (one step's time is a poor guide to the next hundred's), so the bound holds while the steps keep
        their pace; steps that slow down stretch it for an interval or two, until an agreement has measured them
        (tests/unit/test_train_dist.py)."""
        fits = max(1, int(self.within_s / mean)) if mean > 0 else 1
        self._every = 1 if every_step else min(fits, 2 * self._every)
        self._next = step + self._every

    def _slurms_end(self, step: int, heard_s: float, save_s: float | None) -> Terminated:
        """Slurm's SIGTERM, heard ``heard_s`` ago on average: whether the save of ``step`` fits before the SIGKILL
        (``save_s``: the ranks' mean longest save; None where a rank timed none). Rank 0 records now one that does
        not; one that does is recorded once saved (launcher/train/task.py)."""
        why = preemption.save_fits(self.kill_wait_s, heard_s, save_s)
        self.terminated = None  # judged
        left = None if self.kill_wait_s is None else round(self.kill_wait_s - heard_s, 1)
        ended = Terminated(job_id=os.environ.get("SLURM_JOB_ID"), signal="SIGTERM", step=step, saved=why is None,
                           reason=why, kill_wait_s=self.kill_wait_s, left_s=left,
                           save_s=None if save_s is None else round(save_s, 2))
        if why is not None:
            log.warning("Slurm's SIGTERM: not saving (%s); training goes on until its SIGKILL", why)
            if self.env.is_main:
                append_event(self.run_dir, ended)
        return ended

    def _from_outside(self, step: int, heard: int) -> None:
        """A SIGTERM that ``heard`` ranks of all got, the others not within :data:`TERM_GRACE_S`: each rank that
        did records it once per attempt (:class:`Signalled`), and training goes on."""
        if self.terminated is None:
            return
        if not self._said:
            self._said = True
            append_event(self.run_dir, Signalled(
                time=self.terminated, job_id=os.environ.get("SLURM_JOB_ID"), signal="SIGTERM", rank=self.env.rank,
                node=self.env.node, pid=os.getpid(), step=step,
                action=f"ignored: training went on ({heard} of {self.env.world_size} ranks got one)"))
        self.terminated = None  # judged: the agreements keep their pace again
