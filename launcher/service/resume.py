"""Resuming a run, for ``launcher resume`` and the console's Resume: a failed, stopped or finished-early run goes on
from its newest good checkpoint.

The run keeps its directory, config and name; it goes on as a new attempt, a new Slurm job submitted exactly
as the run was composed (launcher.job.submission.resubmit, the same path automatic recovery takes). Training picks
the newest checkpoint whose files check out (launcher/train/checkpoint.py), so its losses go on as if never stopped.
With ``gpus=N`` it goes on on N GPUs, its global batch kept (launcher/submit/relayout.py). A resume comes in two
parts, :func:`ready` and :func:`submit`, so that a new layout's warnings are said before the submission, whose
refusal may follow them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from launcher.core.checkpoints import latest_checkpoint, step_of
from launcher.core.events import Resubmitted
from launcher.core.metrics import FinalRow, Row
from launcher.core.rundir import append_event, last_metrics
from launcher.core.run_index import RunRecord
from launcher.errors import LaunchError
from launcher.job.submission import resubmit, watch
from launcher.slurm.client import SlurmError
from launcher.status.job_state import ACTIVE, JobState, job_states
from launcher.views.lookup import changeable, lookup


@dataclass
class Resuming:
    """A run found resumable: its record, its state, its newest checkpoint (None: none), the new layout in words
    (None: its own) and that layout's checks' warnings."""

    rec: RunRecord
    state: JobState
    newest: Optional[Path]
    layout: Optional[str] = None
    warnings: List[str] = field(default_factory=list)


@dataclass
class Resumed:
    """A run resumed: as which job, on which layout, from which checkpoint step, and what it was."""

    name: str
    job_id: str
    was: str
    layout: Optional[str]
    step: Optional[int]  # None: from the start, it had no checkpoint

    def line(self) -> str:
        start = f"from its checkpoint of step {self.step}" if self.step is not None else \
            "from the start (it has no checkpoint)"
        on = f" on {self.layout}" if self.layout else ""
        return f"Resumed {self.name} as Slurm job {self.job_id}{on}, {start}; it was {self.was}."


def ready(roots: Sequence[Path], name: str, layout: Sequence[str] = ()) -> Resuming:
    """The run ``name``, checked resumable (not active, not trained to its end), and rewritten for the layout
    ``layout`` asks (``["gpus=N"]``; none: its own). LaunchError in one line when it cannot be."""
    (rec,) = changeable([lookup(roots, name)])
    run_dir = Path(rec.run_dir)
    state = job_states([rec])[rec.name]
    refused = unresumable(rec.name, rec.job_id, state.state, rec.steps, last_metrics(run_dir))
    if refused:
        raise LaunchError(refused)
    resuming = Resuming(rec, state, latest_checkpoint(run_dir))
    if layout:
        from launcher.job.secret_store import secrets_dir, store_secrets  # lazy: only a new layout checks data
        from launcher.submit.relayout import gpus_asked, relayout  # lazy: keeps hydra out of start-up

        store_secrets(secrets_dir())  # a bucket's data is checked again, with the credentials its tasks will have
        resuming.layout, resuming.warnings = relayout(rec, gpus_asked(list(layout)))
    return resuming


def unresumable(name: str, job_id: Optional[str], state: str, steps: int, newest: Optional[Row]) -> Optional[str]:
    """Why a run in ``state`` whose newest metrics row is ``newest`` cannot be resumed (its job is active, or it
    trained all its ``steps``), in the words ``resume`` refuses it with (the console's Resume says them before it
    is pressed); None when it can be."""
    if state in ACTIVE:
        return f"{name} is {state} (job {job_id}); nothing to resume (stop it first to restart it)"
    if isinstance(newest, FinalRow) and newest.step >= steps:
        return f"{name} already trained all {steps} steps; nothing to resume"
    return None


def submit(resuming: Resuming) -> Resumed:
    """Submit the run's next attempt and record it; LaunchError in one line when Slurm refuses it."""
    rec, run_dir = resuming.rec, Path(resuming.rec.run_dir)
    try:
        job_id = resubmit(run_dir)
    except SlurmError as err:
        raise LaunchError(f"could not resubmit {rec.name}: {err}") from None
    append_event(run_dir, Resubmitted(job_id=job_id, previous_job_id=rec.job_id, by="user", layout=resuming.layout))
    watch(run_dir, job_id)
    return Resumed(rec.name, job_id, resuming.state.state, resuming.layout,
                   step_of(resuming.newest) if resuming.newest else None)
