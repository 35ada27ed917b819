"""Telling the study how a trial ended and asking for the trials still owed: the whole of a search's progress.

Nothing runs between trials. The launch asks for the first ``search.parallel`` trials; each trial's job, in its
last step, tells the study its result and asks for the trials now owed (:func:`report`). Both happen under the
study's report lock, and what is owed is counted from the study itself (:func:`owed`), never remembered, so two
trials ending at the same moment submit exactly the trials still owed between them: one counts after the other
has told and asked.

``launcher stop --sweep`` ends a search from outside (:func:`stop`): the study is marked stopped first, under the
same lock, so that no trial's last step asks for another afterwards, and the trials its cancelled jobs leave
RUNNING, and the trials enqueued that never ran, are then told failed (:func:`fail_unended`): a job killed before
its last step tells nothing itself.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from launcher.core.config import SearchConfig
from launcher.core.metrics import Row
from launcher.errors import LaunchError
from launcher.search.study import Search, load, locked, open_study

# Submits trial ``number`` of a search at the drawn values; returns its run's name, or raises LaunchError.
Submit = Callable[[Search, int, Dict[str, Any]], str]

STOPPED = "stopped"  # the study's user attribute once ``launcher stop --sweep`` stopped the search (its time)
STOPPED_BY = "stopped by launcher stop"


@dataclass(frozen=True)
class Tally:
    """A study's trials: asked for (submitted or refused), ended (told, failed or not), failed; and whether the
    search was stopped (then nothing more is owed)."""

    asked: int
    ended: int
    failed: int
    stopped: bool = False


PRUNED = "PRUNED"  # how a pruned trial's outcome begins (launcher/search/hook.py)


@dataclass(frozen=True)
class Result:
    """How a trial ended: its metric, or None and why it failed, or ``pruned`` (the study holds its values)."""

    value: Optional[float]
    cause: str = ""
    pruned: bool = False


def owed(tally: Tally, settings: SearchConfig) -> int:
    """How many trials to ask for now: enough to have ``parallel`` in flight, never beyond ``trials``, none
    once the search has ended."""
    if ended_because(tally, settings):
        return 0
    in_flight = tally.asked - tally.ended
    return max(0, min(settings.parallel - in_flight, settings.trials - tally.asked))


def ended_because(tally: Tally, settings: SearchConfig) -> Optional[str]:
    """Why the search has ended, or None while it goes on."""
    if tally.stopped:
        return STOPPED_BY
    allowed = settings.failures_allowed()
    if tally.failed > allowed:
        return f"{tally.failed} trials failed, more than search.max_failures={allowed}"
    if tally.ended >= settings.trials:
        return f"all {settings.trials} trials ended"
    return None


def tally_of(study: Any) -> Tally:
    from optuna.trial import TrialState  # lazy: keeps optuna, numpy out of start-up

    trials = study.get_trials(deepcopy=False)
    # A trial enqueued (WAITING) is not asked for yet: the next ask() hands it out, and only then is it submitted.
    return Tally(asked=sum(t.state != TrialState.WAITING for t in trials),
                 ended=sum(t.state.is_finished() for t in trials),
                 failed=sum(t.state == TrialState.FAIL for t in trials), stopped=STOPPED in study.user_attrs)


def start(path: Path, submit: Submit) -> List[int]:
    """The launch: ask for the first trials. When the first cannot be submitted, the launch is refused
    (LaunchError); a later one fails as in a trial's job, and the search goes on."""
    with locked(path):
        search = load(path)
        return ask_owed(open_study(path, search), search, submit, strict=True)


def report(path: Path, number: int, result: Result, submit: Submit) -> List[int]:
    """A trial's last step: tell the study how trial ``number`` ended, then ask for the trials now owed.
    Returns the numbers of the trials submitted. A trial told already (its step run twice) is not told again."""
    with locked(path):
        search = load(path)
        study = open_study(path, search)
        frozen = study.get_trials(deepcopy=False)[number]
        if not frozen.state.is_finished():
            if result.value is None:
                fail(study, frozen, result.cause, pruned=result.pruned)
            else:
                study.tell(number, result.value)
        return ask_owed(study, search, submit)


def fail(study: Any, frozen: Any, cause: str, pruned: bool = False) -> None:
    """Tell the study that a trial failed (or was pruned), and why (its ``cause``)."""
    from optuna.trial import Trial, TrialState  # lazy: keeps optuna, numpy out of start-up

    Trial(study, frozen._trial_id).set_user_attr("cause", cause)
    study.tell(frozen.number, state=TrialState.PRUNED if pruned else TrialState.FAIL)


def stop(path: Path) -> None:
    """Stop the search: once this returns, no trial's last step (nor anyone) asks for another trial. The study
    records the time (``stopped``) and why it ended, unless it had ended already."""
    with locked(path):
        search = load(path)
        study = open_study(path, search)
        if STOPPED not in study.user_attrs:
            study.set_user_attr(STOPPED, time.time())
        note_end(study, search)


def fail_unended(path: Path, cause: str) -> Tuple[List[int], List[int]]:
    """Tell every trial the stopped search leaves unended that it failed; the numbers of those that were running and
    of those that never ran. After :func:`stop`
    cancelled their jobs: a trial still RUNNING fails with ``cause`` (a job killed before its last step never tells
    its trial itself, and one that reaches it later finds its trial told already: :func:`report` tells a trial
    once), and one enqueued and never run (WAITING) with ``cause`` "before it ran". Optuna tells a trial only once
    it is asked for, so each of those is asked for first, at its enqueued point."""
    from optuna.trial import TrialState  # lazy: keeps optuna, numpy out of start-up

    with locked(path):
        search = load(path)
        study = open_study(path, search)
        running = [t.number for t in study.get_trials(deepcopy=False) if t.state == TrialState.RUNNING]
        for number in running:
            fail(study, study.get_trials(deepcopy=False)[number], cause)
        waiting = []
        while any(t.state == TrialState.WAITING for t in study.get_trials(deepcopy=False)):
            trial = study.ask(distributions(search))
            trial.set_user_attr("cause", f"{cause} before it ran")
            study.tell(trial, state=TrialState.FAIL)
            waiting.append(trial.number)
        return running, waiting


def distributions(search: Search) -> Dict[str, Any]:
    """The space as Optuna asks for a trial in it."""
    return {param.key: param.distribution() for param in search.space.params}


def ask_owed(study: Any, search: Search, submit: Submit, strict: bool = False) -> List[int]:
    """Ask for and submit the trials owed (the caller holds the lock). A trial that cannot be submitted is
    failed with why, and the next one asked for (``strict``: the first one's LaunchError is raised instead).
    When the search has ended, the study records why (:func:`note_end`)."""
    from optuna.trial import TrialState  # lazy: keeps optuna, numpy out of start-up

    submitted: List[int] = []
    while owed(tally_of(study), search.settings):
        trial = study.ask(distributions(search))
        try:
            run = submit(search, trial.number, trial.params)
        except LaunchError as err:
            trial.set_user_attr("cause", f"not submitted: {err.message}")
            study.tell(trial, state=TrialState.FAIL)
            if strict and not submitted:
                raise
            continue
        trial.set_user_attr("run", run)
        submitted.append(trial.number)
    note_end(study, search)
    return submitted


def note_end(study: Any, search: Search) -> None:
    """When the search has ended, record why in the study (``ended``), once; ended by failures: with the last
    one's cause (the caller holds the lock)."""
    from optuna.trial import TrialState  # lazy: keeps optuna, numpy out of start-up

    end = ended_because(tally_of(study), search.settings)
    if end and "ended" not in study.user_attrs:
        failed = sorted((t for t in study.get_trials(deepcopy=False) if t.state == TrialState.FAIL),
                        key=lambda t: t.datetime_complete)
        if failed and tally_of(study).failed > search.settings.failures_allowed():
            end += f"; the last: trial {failed[-1].number} {failed[-1].user_attrs.get('cause', '')}"
        study.set_user_attr("ended", end)


def result_of(rows: List[Row], metric: str, outcome: str) -> Result:
    """A trial's result from its final outcome (COMPLETED, or the cause of a failure or stop) and its own
    metrics rows: the last finite value of ``metric``. A pruned trial's values are the study's already."""
    if outcome.startswith(PRUNED):
        return Result(None, outcome.lower(), pruned=True)
    if outcome != "COMPLETED":
        return Result(None, outcome)
    values = [value for value in (row.value(metric) for row in rows)
              if isinstance(value, (int, float)) and not isinstance(value, bool)]
    if not values:
        return Result(None, f"completed without {metric} in its metrics.jsonl")
    if not math.isfinite(values[-1]):
        return Result(None, f"completed with {metric}={values[-1]}")
    return Result(float(values[-1]))
