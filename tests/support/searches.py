"""A search's study made without a launch, and a stand-in for a trial's submission: the search tests' shared
parts."""
from __future__ import annotations

import time
from pathlib import Path

from launcher.core.config import SearchConfig
from launcher.search.space import read_space
from launcher.search.study import Search, create


def make_search(root: Path, trials: int = 3, parallel: int = 2, max_failures=None) -> Path:
    space = read_space(["search=optuna", "train.lr=tag(log, interval(1e-4, 3e-3))", "train.steps=5"])
    settings = SearchConfig(backend="optuna", trials=trials, parallel=parallel, max_failures=max_failures)
    return create(Search("sweep-20261201-000000-abcd", str(root), space, settings, time.time(),
                         {"LAUNCHER_RUN_ROOT": str(root)}))


class Submitted:
    """A stand-in for the trial's submission: records what was asked, refuses the numbers it is told to."""

    def __init__(self, refuse=()):
        self.numbers, self.refuse = [], set(refuse)

    def __call__(self, search, number, values):
        from launcher.errors import LaunchError

        if number in self.refuse:
            raise LaunchError("sbatch: error: Batch job submission failed: invalid partition")
        assert 1e-4 <= values["train.lr"] <= 3e-3
        self.numbers.append(number)
        return f"run-{number}"


SPACE = ["search=optuna", "train.lr=tag(log, interval(1e-4, 3e-3))"]


def pruned_search(root, startup_trials, enqueue=()):
    """A search of three trials, one at a time, pruned by the median after ``startup_trials``."""
    settings = SearchConfig(backend="optuna", trials=3, parallel=1, pruner="median", startup_trials=startup_trials,
                            enqueue=list(enqueue))
    return create(Search("sweep-20261201-000000-beef", str(root), read_space(SPACE), settings, time.time(), {}))
