"""What the status commands read of one run directory, each file read at most once.

A listing asks about thousands of runs: the state shown beside Slurm's (launcher/status/job_state.py) and the
row of ``runs`` (launcher/commands/runs.py) both want a run's events and its latest metrics. A :class:`RunFiles`
reads each when first asked and keeps it, and travels with the run's :class:`~launcher.status.job_state.JobState`
so that the second reader does not read the file again. It lives as long as one answer (one listing, one
refresh of ``runs --watch``): a run directory changes between answers.
"""
from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Optional

from launcher.core.attempt_log import AttemptLog
from launcher.core.events import Event
from launcher.core.metrics import Row
from launcher.core.rundir import last_metrics, read_events


class RunFiles:
    """One run directory's event log and newest metrics, each read when first asked."""

    def __init__(self, run_dir: Path | str):
        self.run_dir = run_dir

    def __repr__(self) -> str:
        return f"RunFiles({str(self.run_dir)!r})"

    @cached_property
    def events(self) -> list[Event]:
        return read_events(self.run_dir)

    @cached_property
    def attempts(self) -> AttemptLog:
        return AttemptLog(self.events)

    @cached_property
    def last_metrics(self) -> Optional[Row]:
        return last_metrics(self.run_dir)
