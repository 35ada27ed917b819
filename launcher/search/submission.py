"""Submitting one trial: composed from the search's definition at the values drawn, submitted as any run is.

The launch submits the first trials; every later one is submitted from the last step of an earlier trial's job
(launcher/search/hook.py): the one step inside a job that composes a run (Hydra, never torch).
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Dict, Iterator

from launcher.core.rundir import TRIAL
from launcher.search.study import Search


def submit_trial(search: Search, number: int, values: Dict[str, Any]) -> str:
    """Compose and submit trial ``number`` at ``values`` in the search's environment (sbatch, and so the job,
    inherit it); its run's name, or a one-line LaunchError."""
    from launcher.compose.composer import compose_runs  # lazy: keeps hydra out of start-up
    from launcher.submit.submitter import check_runs, submit_one  # lazy: keeps hydra, submitit out of start-up

    with environment(search.environment):
        runs = compose_runs(search.space.trial(values))
        roots, parts = check_runs(runs)
        record = submit_one(runs[0], roots[0], search.id, parts[0],
                            files={TRIAL: trial_file(search, number)})
    return record.name


def trial_file(search: Search, number: int) -> Dict[str, Any]:
    """What a trial's run directory says of it (trial.json): its search and number, and, with a pruner, what its
    training tells the study at each evaluation (launcher/train/trial.py)."""
    settings = search.settings
    trial: Dict[str, Any] = {"search": search.id, "trial": number}
    if settings.pruner != "none":
        trial["prune"] = {"metric": settings.metric, "startup_trials": settings.startup_trials}
    return trial


@contextmanager
def environment(values: Dict[str, str]) -> Iterator[None]:
    """``os.environ`` with ``values`` set, restored afterwards."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
