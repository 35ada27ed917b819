"""Stopping runs, for ``launcher stop`` and the console's Stop; their directories (logs, checkpoints) stay.

A running run is first asked to save the step its ranks are at and end (launcher/core/stop_request.py: a file rank 0
looks for at the ranks' next agreement, every few seconds of steps): its attempt then ends CANCELLED with that step
saved (launcher/job/endings.py), and ``launcher resume`` continues from it. The stop waits for that up to
``wait_s`` seconds, then cancels a job still there (its ranks then get Slurm's SIGTERM, on which they still save
when the save fits before Slurm's SIGKILL: launcher/train/interrupt.py). A job that is not running (pending,
requeued, a retry waiting) is cancelled at once, and so is every job stopped ``now``. The stop comes in three parts,
:func:`ask`, :func:`wait` and :func:`finish`, so that the console waits without holding its lock on the actions
(launcher/console/actions.py); each part's words are in what it returns, for the CLI to print and the console to
answer.

Stopping a search (``sweep``) stops the search itself, in this order: the study is marked stopped (under its
report lock, so no trial's last step submits another after it), then every active trial's job is stopped, then
each trial the study still has RUNNING is told failed ("stopped"): a job cancelled before its batch script's last
step never tells its trial. Stopping one trial by name tells the study it failed ("stopped") and submits the trials
now owed from here, so the search goes on. A trial's own last step, should it still run, finds its trial told
already and changes nothing (launcher/search/trials.py tells a trial once).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from launcher.core import stop_request
from launcher.core.attempt_log import AttemptLog
from launcher.core.events import AttemptEnded, Cancelled, Outcome, StopAsked, Stopped
from launcher.core.rundir import TRIAL, append_event, is_search, read_events, search_path
from launcher.core.run_index import RunRecord
from launcher.errors import LaunchError
from launcher.slurm.client import Slurm, SlurmError, user_name
from launcher.status.job_state import ACTIVE, JobState, job_states
from launcher.views.lookup import changeable, chosen_runs
from launcher.views.search_summary import trials_text

CAUSE = "stopped"  # a trial's cause in the study when launcher stop ended it
# How long a running run has to save and end before its job is cancelled: its ranks agree within about 10 s of
# steps (launcher/train/interrupt.py), and the save of a large model on a busy file system takes minutes.
WAIT_S = 300
SETTLE_S = 60  # once its ranks saved, how much longer the job may take to end (the batch script's last step)
POLL_S = 1.0  # how often the run's record is read while waiting (one file on the login node, not the ranks')
ALIVE_EVERY = 5  # and every so many reads, Slurm is asked whether the job is still there


def unstoppable(name: str, job_id: Optional[str], state: str) -> Optional[str]:
    """Why a run in ``state`` has nothing to stop (its job is not active), in the words a stop of it ends with (the
    console's Stop says them before it is pressed); None when it has."""
    return None if state in ACTIVE else nothing_to_stop(name, job_id)


def nothing_to_stop(name: str, job_id: Optional[str]) -> str:
    return f"{name} (job {job_id}) is not active; nothing to stop."


def cancel(records: Sequence[RunRecord]) -> List[RunRecord]:
    """scancel the active jobs among ``records``; returns the runs that were cancelled."""
    states = job_states(records)
    active = [rec for rec in records if states[rec.name].active]
    for rec in active:
        scancel(rec)
    return active


def scancel(rec: RunRecord) -> None:
    try:
        Slurm(rec.slurm_conf).cancel(str(rec.job_id))
    except SlurmError as err:
        raise LaunchError(f"could not cancel {rec.name} (job {rec.job_id}): {err}") from None


@dataclass
class Asked:
    """A running run asked to save and end within ``wait_s``: its events up to the ask (``seen``), and what came
    of it."""

    rec: RunRecord
    seen: int
    wait_s: int
    stopped: Optional[Stopped] = None  # its ranks saved
    ended: Optional[AttemptEnded] = None  # its attempt was judged
    gone: bool = False  # its job is no longer active
    cancelled: bool = False  # not done in time: its job was cancelled

    def look(self) -> Optional[AttemptEnded]:
        """Read what the run recorded since the ask: whether its ranks saved, whether its attempt was judged."""
        since = AttemptLog(read_events(Path(self.rec.run_dir))[self.seen:])
        self.stopped, self.ended = since.newest(Stopped), since.last_ended()
        return self.ended

    def line(self) -> str:
        return (f"Asked {self.rec.name} (job {self.rec.job_id}) to save the step it is at and end; waiting up to "
                f"{self.wait_s} s before cancelling it (--now: at once).")


@dataclass
class Stopping:
    """A stop under way: the runs chosen, their states when it began, those asked to save, the search being stopped
    (its directory, named by its sweep id; None: none), and until when the asked ones have."""

    records: List[RunRecord]
    states: Dict[str, JobState]
    asked: List[Asked] = field(default_factory=list)
    search: Optional[Path] = None
    deadline: float = 0.0

    def lines(self) -> List[str]:
        """What the ask did: the search it stopped, then each run it asked to save."""
        stopped = [f"Stopped search {self.search.name}: it submits no more trials."] if self.search else []
        return stopped + [asked.line() for asked in self.asked]


def ask(roots: Sequence[Path], names: Sequence[str], sweep: Optional[str], wait_s: Optional[int] = None,
        now: bool = False) -> Stopping:
    """Choose the runs (``names``, or every run of ``sweep``), ask each running one to save and end within
    ``wait_s`` (default :data:`WAIT_S`; none asked when ``now``), and cancel every other active job at once."""
    records = changeable(chosen_runs(roots, list(names), sweep))
    search = stop_search(roots, records[0].sweep) if sweep and records else None
    if search is not None:  # the trials a last step submitted before the stop took the lock are among these
        records = changeable(chosen_runs(roots, [], records[0].sweep))
    wait_s = wait_s or WAIT_S
    stopping = Stopping(list(records), job_states(records), search=search, deadline=time.monotonic() + wait_s)
    for rec in records:
        state = stopping.states[rec.name]
        if state.state == "RUNNING" and not state.ending and not now:
            stopping.asked.append(ask_one(rec, wait_s))
        elif state.active:
            scancel(rec)
    return stopping


def ask_one(rec: RunRecord, wait_s: int) -> Asked:
    """Ask the running job of ``rec`` to save and end (the request, and its record in the run's events)."""
    by = user_name()
    stop_request.ask(Path(rec.run_dir), str(rec.job_id), by, wait_s)
    append_event(Path(rec.run_dir), StopAsked(job_id=rec.job_id, by=by, wait_s=wait_s))
    return Asked(rec, len(read_events(Path(rec.run_dir))), wait_s)


def wait(stopping: Stopping) -> None:
    """Until every run asked has ended (its attempt judged, or its job gone), or the time is up: a run whose ranks
    saved has :data:`SETTLE_S` more for its job to end. Holds no lock."""
    polls = 0
    while True:
        now = time.monotonic()
        waiting = [asked for asked in stopping.asked if not (asked.ended or asked.gone)
                   and now <= stopping.deadline + (SETTLE_S if asked.stopped else 0)]
        if not waiting:
            return
        for asked in waiting:
            asked.look()
        polls += 1
        if polls % ALIVE_EVERY == 0:
            states = job_states([asked.rec for asked in waiting])
            for asked in waiting:
                asked.gone = not states[asked.rec.name].active
        time.sleep(POLL_S)


@dataclass
class RunStopped:
    """What became of one run of a stop: not active (nothing to stop), or stopped, asked to save first or not."""

    rec: RunRecord
    active: bool
    asked: Optional[Asked] = None

    def line(self) -> str:
        rec, asked = self.rec, self.asked
        head = f"Stopped {rec.name} (job {rec.job_id})"
        if not self.active:
            return nothing_to_stop(rec.name, rec.job_id)
        if asked is None:
            return f"{head}."
        if asked.stopped is not None:
            return (f"{head} at step {asked.stopped.step}: every rank saved it; 'launcher resume {rec.name}' "
                    "continues from there.")
        if asked.cancelled:
            return (f"{head}: its ranks did not save within the wait, so its job was cancelled; 'launcher resume "
                    f"{rec.name}' continues from its newest checkpoint.")
        if asked.ended is not None and asked.ended.outcome == Outcome.COMPLETED:
            return f"{rec.name} (job {rec.job_id}) completed before it could stop."
        ended = asked.ended.cause if asked.ended and asked.ended.cause else "its job ended without saving"
        return f"{head}: {ended}."


@dataclass
class TrialTold:
    """A stopped run that was trial ``number`` of ``search``: the trials submitted in its place, or None when the
    study is gone (nothing told)."""

    run: str
    number: int
    search: str
    submitted: Optional[List[int]]

    def line(self) -> str:
        if self.submitted is None:
            return (f"{self.run} was trial {self.number} of search {self.search}, whose study is gone; nothing to "
                    "tell it.")
        then = (f"submitted {trials_text(self.submitted)} in its place" if self.submitted
                else "no trial is owed in its place")
        return f"Told search {self.search} that trial {self.number} failed ({CAUSE}); {then}."


@dataclass
class StopEnd:
    """A stop's end: each run's, then what the searches were told: the stopped search's trials told failed
    (running, and enqueued that never ran), or each stopped trial's search."""

    runs: List[RunStopped]
    failed_running: List[int] = field(default_factory=list)
    failed_waiting: List[int] = field(default_factory=list)
    trials: List[TrialTold] = field(default_factory=list)

    def lines(self) -> List[str]:
        return [*(run.line() for run in self.runs),
                *([f"Told the study that {trials_text(self.failed_running)} failed ({CAUSE})."]
                  if self.failed_running else []),
                *([f"Told the study that {trials_text(self.failed_waiting)}, enqueued, failed ({CAUSE} before it "
                   "ran)."] if self.failed_waiting else []),
                *(trial.line() for trial in self.trials)]


def finish(stopping: Stopping) -> StopEnd:
    """Cancel the jobs of the runs asked that did not end in time, record what became of every run, withdraw the
    requests, and tell the searches."""
    for asked in stopping.asked:
        if not (asked.ended or asked.gone or asked.look()):  # a last look: it may have ended since the wait's
            scancel(asked.rec)
            asked.cancelled = True
        stop_request.withdraw(Path(asked.rec.run_dir))
    asked_by_name = {asked.rec.name: asked for asked in stopping.asked}
    end = StopEnd([])
    for rec in stopping.records:
        asked = asked_by_name.get(rec.name)
        if asked is None and not stopping.states[rec.name].active:
            end.runs.append(RunStopped(rec, active=False))
            continue
        if asked is None or asked.cancelled:
            append_event(Path(rec.run_dir), Cancelled(job_id=rec.job_id))
        end.runs.append(RunStopped(rec, active=True, asked=asked))
    stopped = [run.rec for run in end.runs if run.active]
    if stopping.search is None:
        end.trials = report_stopped_trials(stopped)
    else:
        from launcher.search.trials import fail_unended  # lazy: keeps omegaconf out of start-up

        end.failed_running, end.failed_waiting = fail_unended(stopping.search, CAUSE)
    return end


def stop_search(roots: Sequence[Path], sweep_id: Optional[str]) -> Optional[Path]:
    """Mark search ``sweep_id`` stopped, so that it submits no more trials; its directory, or None for a grid
    sweep (nothing to mark)."""
    path = search_path(roots, sweep_id) if sweep_id else None
    if path is None:
        return None
    from launcher.search.trials import stop  # lazy: keeps omegaconf out of start-up

    stop(path)
    return path


def report_stopped_trials(stopped: List[RunRecord]) -> List[TrialTold]:
    """Tell each search a trial among ``stopped`` belongs to that it failed ("stopped"), and submit the trials now
    owed in its place: the search goes on without it."""
    if not any((Path(rec.run_dir) / TRIAL).exists() for rec in stopped):
        return []
    from launcher.search.study import trial_of  # lazy: keeps omegaconf out of start-up
    from launcher.search.submission import submit_trial  # lazy: keeps omegaconf out of start-up
    from launcher.search.trials import Result, report  # lazy: keeps omegaconf out of start-up

    told = []
    for rec in stopped:
        trial = trial_of(Path(rec.run_dir))
        if trial is None:
            continue
        submitted = report(trial.path, trial.number, Result(None, CAUSE), submit_trial) \
            if is_search(trial.path) else None
        told.append(TrialTold(rec.name, trial.number, trial.path.name, submitted))
    return told
