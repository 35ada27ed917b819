"""What a search has done so far, as its study says: each trial's state, value and parameters, the best trial, and
how far the search has gone. ``runs --sweep``, ``describe`` and ``compare --plot`` print it
(launcher/views/search_summary.py); nothing here writes.

The study is read without the report lock: Optuna's journal is appended whole records at a time, and a view taken
while a trial reports is the study just before or just after that report.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from launcher.search.study import Search, load, open_study
from launcher.search.trials import STOPPED

# Every state a trial can be in, in the order a summary counts them. WAITING: asked for and not yet running
# (Optuna's, for a trial enqueued; the launcher itself asks only for trials it submits at once).
STATES = ("RUNNING", "WAITING", "COMPLETE", "PRUNED", "FAIL")
ENDED = ("COMPLETE", "PRUNED", "FAIL")


@dataclass(frozen=True)
class TrialView:
    """One trial: its number, Optuna state, value (None while it has none), drawn parameters, the run that trains
    it (None for a trial sbatch refused) and, for a failed one, why."""

    number: int
    state: str
    value: Optional[float]
    params: Dict[str, Any]
    run: Optional[str]
    cause: str


@dataclass(frozen=True)
class SearchView:
    """A search's definition and its study's trials, as read at one moment."""

    search: Search
    trials: Tuple[TrialView, ...]
    ended: Optional[str]  # why the search ended, once it has (the study's ``ended``)
    stopped: bool  # by ``launcher stop --sweep``

    @property
    def metric(self) -> str:
        return self.search.settings.metric

    def counts(self) -> Dict[str, int]:
        """How many trials are in each state (every state, 0 where none)."""
        return {state: sum(t.state == state for t in self.trials) for state in STATES}

    def ended_count(self) -> int:
        """How many trials have ended, whatever their end."""
        return sum(t.state in ENDED for t in self.trials)

    def best(self) -> Optional[TrialView]:
        """The completed trial with the best value in the search's direction; None before one completed. A pruned
        trial's value (its last intermediate one) is not its metric at the end and is never the best."""
        done = [t for t in self.trials if t.state == "COMPLETE" and t.value is not None and math.isfinite(t.value)]
        if not done:
            return None
        pick = max if self.search.settings.direction == "maximize" else min
        return pick(done, key=lambda t: t.value)

    def by_run(self) -> Dict[str, TrialView]:
        return {t.run: t for t in self.trials if t.run}

    def to_dict(self) -> Dict[str, Any]:
        best = self.best()
        return {"id": self.search.id, "space": [asdict(p) for p in self.search.space.params],
                "fixed": list(self.search.space.fixed), "settings": asdict(self.search.settings),
                "failures_allowed": self.search.settings.failures_allowed(), "counts": self.counts(),
                "ended": self.ended, "stopped": self.stopped, "best": None if best is None else asdict(best),
                "trials": [asdict(t) for t in self.trials]}


def view(path: Path) -> SearchView:
    """The search whose directory is ``path``, with its study's trials in order."""
    search = load(path)
    study = open_study(path, search)
    trials = tuple(trial_view(t) for t in study.get_trials(deepcopy=False))
    attrs = study.user_attrs
    return SearchView(search, trials, attrs.get("ended"), STOPPED in attrs)


def trial_view(frozen: Any) -> TrialView:
    """An Optuna FrozenTrial as a TrialView: plain values only."""
    value = frozen.value if frozen.values else None
    return TrialView(frozen.number, frozen.state.name, value, dict(frozen.params), frozen.user_attrs.get("run"),
                     frozen.user_attrs.get("cause", ""))
