"""Lose nothing to a time limit or a preemption.

Slurm sends USR2 to every task ``cluster.signal_delay_s`` before the time limit (and on preemption, where
the site sends it). submitit's own handler checkpoints and requeues from rank 0 alone, while the other ranks
die of their lost peer: the steps since the last periodic checkpoint are gone. Instead, every rank notes the
signal; at each step boundary the ranks agree (an all-reduce of one flag) whether any heard it, then all of
them save a checkpoint of the step just done, and rank 0 requeues the job (same job id, a new attempt).

The requeue budget (``cluster.max_requeues``) counts only requeues that made no progress, so a long run cut
into many time-limited attempts is never stopped by a fixed cap, while one that can no longer train a step
within its time limit is.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path

import torch
import torch.distributed as dist

from launcher.core import preemption
from launcher.core.rundir import append_event, read_events
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


def requeue(run_dir: Path, step: int, max_requeues: int, patience_s: float) -> bool:
    """Rank 0: requeue this job after saving ``step``, unless ``max_requeues`` requeues in a row made no
    progress; ask a controller that does not answer again for ``patience_s``. Returns whether the job was
    requeued (else the run ends with a final ``failed`` event, or this attempt fails and is retried)."""
    job_id = os.environ.get("SLURM_JOB_ID", "")
    steps = [e.get("step") for e in read_events(run_dir) if e.get("event") == "requeued"]
    stuck = 0
    for earlier in reversed(steps):
        if earlier != step:
            break
        stuck += 1
    if stuck >= max_requeues:
        append_event(run_dir, "failed", final=True, job_id=job_id, step=step, short="no progress",
                     error=f"{stuck + 1} attempts in a row ended at step {step} without training a step",
                     reason=f"cluster.max_requeues={max_requeues} requeues without progress")
        return False
    append_event(run_dir, "requeued", job_id=job_id, step=step, by="signal")  # before Slurm ends the tasks
    error = scontrol_requeue(job_id, patience_s)
    if error:  # the attempt fails instead, and recovery retries it from the step just saved
        log.error("could not requeue job %s: %s", job_id, error)
        append_event(run_dir, "failed", job_id=job_id, rank=0, node=os.environ.get("SLURMD_NODENAME"), step=step,
                     short="requeue failed", error=f"ConnectionError: scontrol requeue {job_id} failed: {error}")
        return False
    log.info("requeued job %s after saving step %d", job_id, step)
    return True


def scontrol_requeue(job_id: str, patience_s: float) -> str:
    """Requeue the job, trying again while the controller is unreachable; the error if it never worked."""
    deadline, error = time.monotonic() + patience_s, ""
    while True:
        try:
            subprocess.run(["scontrol", "requeue", job_id], check=True, capture_output=True, text=True, timeout=30)
            return ""
        except subprocess.CalledProcessError as err:
            error = ((err.stderr or "").strip().splitlines() or [f"exit status {err.returncode}"])[-1]
        except (OSError, subprocess.SubprocessError) as err:
            error = str(err)
        if time.monotonic() > deadline:
            return error
        time.sleep(3)
