"""The callable submitit pickles and every Slurm task runs.

It lives in the launcher, not in launcher/train/, so that submitting pickles a reference to this torch-free class
instead of importing launcher/train/ (and torch) on the login node. The task imports launcher/train/ when it starts.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any

import submitit

from launcher.core.heartbeats import steps_by_rank
from launcher.core import preemption
from launcher.core.events import Failed, Requeued
from launcher.core.rundir import append_event, read_events
from launcher.job.attempts import NO_TORCH
from launcher.job.secret_store import inject, secrets_dir


class NoTorch(RuntimeError):
    """The tasks' Python cannot import torch: the cluster's environment was installed without the ``[train]``
    extra (as a laptop's is). Its message is the whole cause, in the user's words: every node and every try
    would fail the same way, so the attempt ends with what to do and is not retried."""

    short = NO_TORCH

    def __init__(self, python: str) -> None:
        super().__init__(f"the tasks' Python {python} has no torch: install 'slurm-gpt-launcher[train]' there "
                         "(cluster.python, or cluster.container.python in a container)")


def being_requeued(run_dir: Path) -> bool:
    """True when rank 0 has requeued this job: the other ranks then die of their lost peer, which is
    part of the preemption, not a failure of the run."""
    record = read_events(run_dir)
    return bool(record) and isinstance(record[-1], Requeued) and record[-1].job_id == os.environ.get("SLURM_JOB_ID")


def record_failure(run_dir: Path, err: BaseException, secret_vars: list[str]) -> None:
    """The run's own record of this rank's failure: rank, node, step and the error's first line (never a
    secret's value), and the error's ``short`` words for `runs` where it has them ("loss nan"). Status
    commands read it once Slurm has forgotten the job, and the attempt's end (launcher/job/recovery.py) weighs
    it against the other ranks' to find the cause."""
    first_line = (str(err).strip().splitlines() or [""])[0][:300]
    error = f"{type(err).__name__}: {first_line}" if first_line else type(err).__name__
    if isinstance(err, NoTorch):
        error = first_line  # the cause in the user's words; no exception name before it
    for var in secret_vars:
        if os.environ.get(var):
            error = error.replace(os.environ[var], "***")
    rank = os.environ.get("SLURM_PROCID")
    step = getattr(err, "train_step", None)
    if step is None and rank is not None:
        step = steps_by_rank(run_dir).get(int(rank))
    append_event(run_dir, Failed(rank=rank, node=os.environ.get("SLURMD_NODENAME"), step=step,
                                 job_id=os.environ.get("SLURM_JOB_ID"), error=error,
                                 short=err.short if isinstance(getattr(err, "short", None), str) else None))


def training():
    """launcher/train/'s ``run``, imported here on the task; :class:`NoTorch` where this Python has no torch."""
    try:
        from launcher.train.task import run
    except ModuleNotFoundError as err:
        if err.name != "torch":  # torch there but broken, or another module missing: its own error says more
            raise
        raise NoTorch(sys.executable) from None
    return run


class TrainTask(submitit.helpers.Checkpointable):
    """Train the run in ``run_dir`` on this Slurm task.

    On preemption or an approaching time limit (USR2), every rank saves and rank 0 requeues the job
    (launcher/train/interrupt.py), listening from this method's first line (launcher/core/preemption.py); submitit's
    :meth:`checkpoint` remains for a signal in the instant before. The requeued tasks resume from the run's
    newest complete checkpoint.

    Before launcher/train/ is imported, the user's secrets (launcher/job/secret_store.py) are injected into this
    process's environment from the store whose path was fixed at submission; only the variables' names are printed.
    """

    def __init__(self, secrets_store: str | None = None) -> None:
        # Resolved on the submitting host ($LAUNCHER_HOME there); a path, never a value.
        self.secrets_store = secrets_store or str(secrets_dir())

    def __call__(self, run_dir: str) -> Any:
        names: list[str] = []
        preemption.listen()  # a signal that comes while torch loads is kept for the first step boundary
        try:
            names = inject(Path(getattr(self, "secrets_store", None) or secrets_dir()))
            if names:
                print(f"launcher: injected secrets: {', '.join(names)}", flush=True)
            return training()(run_dir)
        except BaseException as err:  # DCP's CheckpointException, among others, is not an Exception
            if not isinstance(err, (SystemExit, KeyboardInterrupt)) and not being_requeued(Path(run_dir)):
                record_failure(Path(run_dir), err, names)
            raise
        finally:
            # The work is over (finished, saved for a requeue, or failed): a time-limit signal from now on means
            # nothing. Ignored, not handled: Python puts the default action (death) back while it shuts down, and
            # a rank killed by a late USR2 after the run finished made a completed attempt read as failed.
            signal.signal(preemption.SIGNAL, signal.SIG_IGN)

    def checkpoint(self, run_dir: str) -> submitit.helpers.DelayedSubmission:  # type: ignore[override]
        append_event(Path(run_dir), Requeued(job_id=os.environ.get("SLURM_JOB_ID")))
        return submitit.helpers.DelayedSubmission(TrainTask(getattr(self, "secrets_store", None)), run_dir)
