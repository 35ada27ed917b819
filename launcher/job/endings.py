"""The words of an attempt that the user or Slurm ended, not a failure: stopped by ``launcher stop``, cancelled,
or requeued from outside the run, and whether its ranks saved the step they were at first.

The ranks record what they did (launcher/train/interrupt.py): ``stopped`` when they saved and ended on a user's
stop, ``terminated`` when Slurm's SIGTERM reached them all, saved or why not; ``launcher stop`` records
``stop_asked``. Whoever judges the attempt reads them here: the batch script's end step, the watcher of a job whose
batch shell Slurm killed (a cancel), or the next attempt's begin step (a requeue; launcher/job/recovery.py).
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional

from launcher.core.attempt_log import AttemptLog
from launcher.core.events import AttemptEnded, Event, Failed, Outcome, StopAsked, Stopped, Terminated


def stop_asked(since: List[Event]) -> bool:
    """Whether the user asked this attempt to stop: then it ends CANCELLED, whatever its ranks did, and is never
    requeued or retried."""
    return any(isinstance(e, (StopAsked, Stopped)) for e in since)


def on_sigterm(run_dir: Path, term: Terminated) -> str:
    """What the ranks did on Slurm's SIGTERM, in words: saved, or why not and what is trained again."""
    if term.saved:
        return "every rank saved it on Slurm's SIGTERM, nothing is trained again"
    from launcher.core.checkpoints import latest_checkpoint, step_of  # lazy: keeps omegaconf out of start-up

    latest = latest_checkpoint(run_dir)
    again = f"the steps after step {step_of(latest)} (the newest checkpoint) are" if latest else \
        "with no checkpoint, every step is"
    return f"not saved on Slurm's SIGTERM: {term.reason}; {again} trained again"


def cancelled(run_dir: Path, since: List[Event], number: Optional[int], job_id: str) -> AttemptEnded:
    """The end of an attempt the user stopped or Slurm cancelled: CANCELLED, at the step its ranks saved if they
    did, with who ended it and how."""
    log = AttemptLog(since)
    asked, stopped, term = log.newest(StopAsked), log.newest(Stopped), log.newest(Terminated)
    who = (stopped and stopped.by) or (asked and asked.by) or "the user"
    if stopped is not None:
        return AttemptEnded(attempt=number, job_id=job_id, outcome=Outcome.CANCELLED, step=stopped.step,
                            short=f"stopped at step {stopped.step}",
                            cause=f"stopped by {who} (launcher stop) at step {stopped.step}: every rank saved it, "
                                  "and 'launcher resume' continues from there")
    within = f" within {asked.wait_s:.0f} s" if asked and asked.wait_s else ""
    how = (f"stopped by {who} (launcher stop, which cancels a job whose ranks have not saved{within})" if asked
           else "cancelled (launcher stop --now, scancel, or Slurm)")
    if term is None:  # cancelled before its ranks agreed on anything, or they ended otherwise first
        failed = log.newest(Failed)
        ended = f": its ranks ended before they saved ({failed.short or failed.error})" if failed else ""
        return AttemptEnded(attempt=number, job_id=job_id, outcome=Outcome.CANCELLED,
                            cause=how + ended if asked else None, short="stopped" if asked else None)
    return AttemptEnded(attempt=number, job_id=job_id, outcome=Outcome.CANCELLED, step=term.step,
                        short=f"{'stopped' if asked else 'cancelled'} at step {term.step}"
                              f"{', saved' if term.saved else ''}",
                        cause=f"{how} at step {term.step}: {on_sigterm(run_dir, term)}")


def requeued_from_outside(run_dir: Path, since: List[Event], step: int) -> tuple[int, str]:
    """The step and cause of an attempt Slurm requeued with every node well (``scontrol requeue``, a preemption),
    ``step`` the last its ranks reached: the step they saved on Slurm's SIGTERM, if they did."""
    term = AttemptLog(since).newest(Terminated)
    if term is None:
        return step, f"requeued from outside the run at step {step} (scontrol requeue, or a node that came back)"
    step = term.step if term.saved and term.step is not None else step
    return step, (f"requeued from outside the run (scontrol requeue, a preemption, or a node that came back) at "
                  f"step {step}: {on_sigterm(run_dir, term)}")
