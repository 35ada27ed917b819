"""The requeue the ranks ask for: on Slurm's time-limit or preemption signal they save and record ``requeued``
(launcher/train/interrupt.py), and the batch script's end step (launcher/job/recovery.py) puts the same job back
in the queue, on the host, not in a rank: ranks may run in a container without Slurm's client or munge.

A requeue keeps the job id and starts a new attempt from the step just saved. It is not a retry: nothing
failed, no node is blamed and ``cluster.max_retries`` is not spent; ``cluster.max_requeues`` requeues in a row
without progress end the run instead (docs/recovery.md).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, List, Optional

from launcher.core.events import Event, Failed, Fault, Requeued
from launcher.core.rundir import append_event
from launcher.slurm import probes
from launcher.slurm.client import Slurm
from launcher.slurm.output import SlurmError

# A job that Slurm has put back in the queue while the old batch script may still be running.
REQUEUED_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}
# A requeued job started within the second its old instance's credential was revoked is refused by slurmd ("Killing
# non-startable batch JobId: Job credential revoked", then FAILED: seen in CI); two seconds later it starts.
REQUEUE_SETTLE_S = 2.0


def requeue_cause(requeued: Requeued) -> str:
    """Why an attempt was requeued, in the user's words, from its ``requeued`` event."""
    if requeued.by == "signal":
        saved = f" at step {requeued.step}, saved" if requeued.step is not None else ""
        return f"time limit or preemption signal{saved}"
    return "requeued by submitit"  # a record of an older launcher's run (launcher/core/events.py Requeued)


def requeue_asked(since: List[Event]) -> Optional[int]:
    """The step saved for a requeue the ranks asked for in this attempt (``requeued`` by the signal, nothing
    failed after it), or None."""
    last = next((e for e in reversed(since) if isinstance(e, (Requeued, Failed))), None)
    return last.step if isinstance(last, Requeued) and last.by == "signal" else None


@dataclass(frozen=True)
class Clock:
    """The time a wait with back-off reads and sleeps on: the real one, or a test's, which moves when slept on."""

    now: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep


def requeue(run_dir: Path, job_id: str, step: int, events: List[Event], clock: Clock = Clock()) -> Optional[Failed]:
    """Requeue this job (same job id, a new attempt) after its ranks saved ``step`` on Slurm's signal.

    Returns None when Slurm requeued the job; else the ``failed`` event recorded: final when
    ``cluster.max_requeues`` requeues in a row made no progress (a long run cut into many time-limited attempts
    is never stopped by a fixed cap, while one that can no longer train a step within its limit is), or the
    controller's refusal, which the attempt's judgement then retries as a new job from the step just saved."""
    from launcher.core.config import load_run_config  # lazy: keeps omegaconf out of start-up

    cluster = load_run_config(Path(run_dir) / "config.yaml").cluster
    earlier = [e.step for e in events if isinstance(e, Requeued) and e.by == "signal"][:-1]
    stuck = next((n for n, seen in enumerate(reversed(earlier)) if seen != step), len(earlier))
    node = os.environ.get("SLURMD_NODENAME")
    if stuck >= cluster.max_requeues:
        failure = Failed(job_id=job_id, final=True, short="no progress", step=step,
                         error=f"{stuck + 1} attempts in a row ended at step {step} without training a step",
                         reason=f"cluster.max_requeues={cluster.max_requeues} requeues without progress")
    else:
        # Until shortly before the time limit: the signal came at least signal_delay_s before it.
        deadline = clock.now() + max(5, cluster.signal_delay_s - 15)
        while True:
            try:
                Slurm(None, timeout=30).requeue(job_id)
                start_at_once(job_id, time.monotonic())
                return None
            except SlurmError as err:
                error = str(err)
            if clock.now() > deadline:
                break
            clock.sleep(3)
        failure = Failed(job_id=job_id, short="requeue failed", step=step, node=node, fault=Fault.INFRASTRUCTURE,
                         error=f"scontrol requeue {job_id} failed: {error}")
    append_event(run_dir, failure)
    return failure


def start_at_once(job_id: str, requeued: float, within_s: float = 4.0) -> None:
    """Once the requeued job is back in the queue, make it eligible :data:`REQUEUE_SETTLE_S` after the requeue
    (``requeued``, a monotonic time) rather than at the begin time Slurm gives it. Slurm ends this batch script
    a few seconds after the requeue (``KillWait``): this asks within that, and gives up quietly, leaving Slurm's
    own begin time, when the job is not pending by then. (A begin time set a few seconds ahead instead waits for
    the backfill scheduler's tick, up to 30 s: the update at the moment wakes the main scheduler.)"""
    while time.monotonic() < requeued + within_s:
        state = probes.queue_state(job_id)
        if state == "PENDING":
            time.sleep(max(0.0, requeued + REQUEUE_SETTLE_S - time.monotonic()))
            try:
                Slurm(None, timeout=5).start_now(job_id)
            except SlurmError:
                pass
        if state in ("PENDING", ""):  # done, or the queue cannot be asked
            return
        time.sleep(0.2)
