"""Submitting one trial: composed from the search's definition at the values drawn, submitted as any run is.

The launch submits the first trials; every later one is submitted from the last step of an earlier trial's job
(launcher/search/hook.py): the one step inside a job that composes a run (Hydra, never torch).
"""
from __future__ import annotations

from typing import Any, Dict

from launcher.search.study import Search

TRIAL = "trial.json"  # in a trial's run directory: the search it belongs to and its number


def submit_trial(search: Search, number: int, values: Dict[str, Any]) -> str:
    """Compose and submit trial ``number`` at ``values``; its run's name, or a one-line LaunchError."""
    from launcher.compose.runs import compose_runs
    from launcher.submit.launch import check_runs, submit_one

    runs = compose_runs(search.space.trial(values))
    roots, parts = check_runs(runs)
    record = submit_one(runs[0], roots[0], search.id, parts[0], files={TRIAL: {"search": search.id, "trial": number}})
    return record.name
