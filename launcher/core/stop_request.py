"""A user's request that a running job of a run save the step its ranks are at and end: the file ``launcher stop``
writes into the run directory (launcher/service/stop.py), and the job it names.

Only rank 0 looks for it, with one ``stat`` at each agreement of the ranks (launcher/train/interrupt.py, every few
seconds of steps), and its answer joins the flags the ranks all-reduce there, so every rank saves and ends at the
same step: nothing per rank or per step reaches the shared file system. The request names its job, as the run's
record does (:func:`this_job`), so that one left behind (a stop interrupted before it tidied up) never stops a later
job of the run.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from launcher.core.rundir import write_json_atomic

REQUEST = "stop_request.json"


@dataclass(frozen=True)
class StopRequest:
    """Job ``job_id`` is asked to save and end, by ``by``, at ``time``; ``wait_s``: how long the asker waits for
    that before it cancels the job."""

    job_id: str
    by: str
    time: float
    wait_s: float


def this_job() -> Optional[str]:
    """The job this process runs in as the run's record names it: ``123``, or ``123_4`` for an array's element
    (whose own ``SLURM_JOB_ID`` is another number); None outside a job."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")


def ask(run_dir: Path, job_id: str, by: str, wait_s: float) -> StopRequest:
    """Ask job ``job_id`` of the run in ``run_dir`` to save and end at its ranks' next agreement."""
    request = StopRequest(job_id=job_id, by=by, time=time.time(), wait_s=wait_s)
    write_json_atomic(Path(run_dir) / REQUEST, asdict(request))
    return request


def asked(run_dir: Path) -> Optional[StopRequest]:
    """The request to this job (:func:`this_job`), or None: none there (one failed ``stat``), one for another job,
    or one that cannot be read (the next agreement looks again)."""
    path = Path(run_dir) / REQUEST
    if not path.exists():
        return None
    try:
        request = StopRequest(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None
    return request if request.job_id == this_job() else None


def withdraw(run_dir: Path) -> None:
    """Remove the request, answered or not (its job has ended)."""
    (Path(run_dir) / REQUEST).unlink(missing_ok=True)
