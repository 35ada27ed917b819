"""The callable submitit pickles and every Slurm task runs.

It lives in the launcher, not in train/, so that submitting pickles a reference to this torch-free class
instead of importing train/ (and torch) on the login node. The task imports train/ when it starts.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import submitit

from launcher.runs import append_event


class TrainTask(submitit.helpers.Checkpointable):
    """Train the run in ``run_dir`` on this Slurm task.

    On preemption or an approaching time limit (USR2), submitit calls :meth:`checkpoint` on global rank 0
    and requeues the job; the requeued tasks resume from the run's newest complete checkpoint.
    """

    def __call__(self, run_dir: str) -> Any:
        from train.task import run

        return run(run_dir)

    def checkpoint(self, run_dir: str) -> submitit.helpers.DelayedSubmission:  # type: ignore[override]
        append_event(Path(run_dir), "requeued", job_id=os.environ.get("SLURM_JOB_ID"))
        return submitit.helpers.DelayedSubmission(TrainTask(), run_dir)
