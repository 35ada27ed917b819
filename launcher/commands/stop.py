"""``launcher stop``: cancel runs' jobs; their directories (logs, checkpoints) stay.

``stop --sweep ID`` of a search stops the search itself, in this order: the study is marked stopped (under its
report lock, so no trial's last step submits another after it), then every active trial's job is cancelled, then
each trial the study still has RUNNING is told failed ("stopped"): a job cancelled before its batch script's last
step never tells its trial. Stopping one trial by name tells the study it failed ("stopped") and submits the trials
now owed from here, so the search goes on. A trial's own last step, should it still run, finds its trial told
already and changes nothing (launcher/search/trials.py tells a trial once).
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import List, Optional

from launcher.views.lookup import changeable, chosen_runs, roots_of
from launcher.views.search_summary import trials_text
from launcher.errors import LaunchError
from launcher.core.events import Cancelled
from launcher.core.rundir import TRIAL, append_event, is_search, search_path
from launcher.core.run_index import RunRecord
from launcher.slurm.client import Slurm, SlurmError
from launcher.status.job_state import job_states

CAUSE = "stopped"  # a trial's cause in the study when launcher stop ended it


def cancel(records: List[RunRecord]) -> List[RunRecord]:
    """scancel the active jobs among ``records``; returns the runs that were cancelled."""
    states = job_states(records)
    active = [rec for rec in records if states[rec.name].active]
    for rec in active:
        try:
            Slurm(rec.slurm_conf).cancel(str(rec.job_id))
        except SlurmError as err:
            raise LaunchError(f"could not cancel {rec.name} (job {rec.job_id}): {err}") from None
    return active


def run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="RUN", help="run names (or unique prefixes)")
    parser.add_argument("--sweep", help="every run of this sweep id")


def configure(parser: argparse.ArgumentParser) -> None:
    run_args(parser)


def main(args: argparse.Namespace) -> int:
    roots = roots_of(args)
    records = changeable(chosen_runs(roots, args.names, args.sweep))
    search = stop_search(roots, records[0].sweep) if args.sweep and records else None
    if search is not None:  # the trials a last step submitted before the stop took the lock are among these
        records = changeable(chosen_runs(roots, [], records[0].sweep))
    stopped = cancel(records)
    for rec in records:
        if rec in stopped:
            append_event(Path(rec.run_dir), Cancelled(job_id=rec.job_id))
            print(f"Stopped {rec.name} (job {rec.job_id}).")
        else:
            print(f"{rec.name} (job {rec.job_id}) is not active; nothing to stop.")
    if search is not None:
        from launcher.search.trials import fail_unended  # lazy: keeps omegaconf out of start-up

        running, waiting = fail_unended(search, CAUSE)
        if running:
            print(f"Told the study that {trials_text(running)} failed ({CAUSE}).")
        if waiting:
            print(f"Told the study that {trials_text(waiting)}, enqueued, failed ({CAUSE} before it ran).")
    else:
        report_stopped_trials(stopped)
    return 0


def stop_search(roots: List[Path], sweep_id: Optional[str]) -> Optional[Path]:
    """Mark search ``sweep_id`` stopped, so that it submits no more trials; its directory, or None for a grid
    sweep (nothing to mark)."""
    path = search_path(roots, sweep_id) if sweep_id else None
    if path is None:
        return None
    from launcher.search.trials import stop  # lazy: keeps omegaconf out of start-up

    stop(path)
    print(f"Stopped search {sweep_id}: it submits no more trials.")
    return path


def report_stopped_trials(stopped: List[RunRecord]) -> None:
    """Tell each search a trial among ``stopped`` belongs to that it failed ("stopped"), and submit the trials now
    owed in its place: the search goes on without it."""
    if not any((Path(rec.run_dir) / TRIAL).exists() for rec in stopped):
        return
    from launcher.search.study import trial_of  # lazy: keeps omegaconf out of start-up
    from launcher.search.submission import submit_trial  # lazy: keeps omegaconf out of start-up
    from launcher.search.trials import Result, report  # lazy: keeps omegaconf out of start-up

    for rec in stopped:
        trial = trial_of(Path(rec.run_dir))
        if trial is None:
            continue
        if not is_search(trial.path):
            print(f"{rec.name} was trial {trial.number} of search {trial.path.name}, whose study is gone; "
                  "nothing to tell it.")
            continue
        submitted = report(trial.path, trial.number, Result(None, CAUSE), submit_trial)
        then = f"submitted {trials_text(submitted)} in its place" if submitted else "no trial is owed in its place"
        print(f"Told search {trial.path.name} that trial {trial.number} failed ({CAUSE}); {then}.")
