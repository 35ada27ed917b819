"""A search's study on the file system and its progress without any process between trials: the study directory
beside the runs, Optuna's journal file storage with a lock that plants no symlink, the count of trials owed, a
report (tell, then ask for what is owed), and two trials ending at the same moment, as real processes on real
files, submitting exactly the trials still owed."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher.core.config import SearchConfig
from launcher.core.metrics import decode
from launcher.core.rundir import SWEEPS
from launcher.train.trial import JOURNAL
from launcher.search.study import DEFINITION, load, open_study
from launcher.search.trials import Result, Tally, ask_owed, owed, report, result_of, start, tally_of
from launcher.core.run_index import record_names
from support.helpers import REPO
from support.searches import Submitted, make_search


def test_the_study_lives_in_a_dot_directory_of_the_run_root_that_the_listing_skips(tmp_path):
    path = make_search(tmp_path)
    assert path == tmp_path / SWEEPS / "sweep-20261201-000000-abcd"
    assert sorted(p.name for p in path.iterdir()) == [JOURNAL, DEFINITION]
    assert load(path).settings.trials == 3 and load(path).space.fixed == ("train.steps=5",)
    assert record_names(tmp_path) == []  # not a run
    assert start(path, Submitted()) == [0, 1]
    # The journal's lock and the report lock were files created O_EXCL, removed when released: no symlink planted.
    assert not [p for p in tmp_path.rglob("*") if p.is_symlink()] and sorted(p.name for p in path.iterdir()) == [
        JOURNAL, DEFINITION]
    assert [t.user_attrs["run"] for t in open_study(path, load(path)).trials] == ["run-0", "run-1"]


@pytest.mark.parametrize("tally, expected", [
    (Tally(asked=0, ended=0, failed=0), 2),  # the launch: parallel
    (Tally(asked=2, ended=1, failed=0), 1),  # one ended: one more
    (Tally(asked=2, ended=2, failed=0), 1),  # two ended at once, one trial left of 3
    (Tally(asked=3, ended=2, failed=0), 0),  # every trial asked for
    (Tally(asked=2, ended=1, failed=1), 0),  # more failures than max_failures=0
])  # fmt: skip
def test_what_is_owed_is_counted_from_the_study(tally, expected):
    assert owed(tally, SearchConfig(backend="optuna", trials=3, parallel=2, max_failures=0)) == expected


def test_a_failed_trial_is_told_with_its_cause_and_too_many_end_the_search(tmp_path):
    path = make_search(tmp_path, trials=6, parallel=2, max_failures=2)
    submit = Submitted(refuse={2})
    start(path, submit)
    # Trial 0 failed: told FAIL with why; trial 2 is refused by sbatch (failed too), so trial 3 takes its place.
    assert report(path, 0, Result(None, "failed: RuntimeError: boom"), submit) == [3]
    study = open_study(path, load(path))
    assert [t.state.name for t in study.trials] == ["FAIL", "RUNNING", "FAIL", "RUNNING"]
    assert study.trials[0].user_attrs["cause"] == "failed: RuntimeError: boom"
    assert "invalid partition" in study.trials[2].user_attrs["cause"] and "ended" not in study.user_attrs
    # A third failure is more than search.max_failures=2: the search ends with that cause, asking for no more.
    assert report(path, 1, Result(None, "stopped: its job was cancelled"), submit) == []
    assert open_study(path, load(path)).user_attrs["ended"] == ("3 trials failed, more than search.max_failures=2; "
                                                                "the last: trial 1 stopped: its job was cancelled")
    assert report(path, 3, Result(0.5), submit) == [] and report(path, 3, Result(0.7), submit) == []  # told once
    assert open_study(path, load(path)).trials[3].value == 0.5 and submit.numbers == [0, 1, 3]


def test_a_launch_whose_first_trial_cannot_be_submitted_is_refused(tmp_path):
    from launcher.errors import LaunchError

    path = make_search(tmp_path)
    with pytest.raises(LaunchError, match="invalid partition"):
        start(path, Submitted(refuse={0}))


def test_the_result_is_the_last_value_of_the_metric_in_the_trials_own_metrics():
    metrics = [decode(m) for m in [{"step": 5, "eval_loss": 3.0}, {"step": 10, "eval_loss": None},
                                    {"step": 20, "eval_loss": 2.5}]]
    assert result_of(metrics, "eval_loss", "COMPLETED") == Result(2.5)
    assert result_of(metrics[1:2], "eval_loss", "COMPLETED") == Result(None, "completed without eval_loss in its "
                                                                                "metrics.jsonl")
    assert result_of([decode({"step": 1, "eval_loss": float("nan")})], "eval_loss", "COMPLETED").value is None
    assert result_of(metrics, "eval_loss", "stopped: its job was cancelled") == Result(None, "stopped: its job was "
                                                                                             "cancelled")


# Two trials' last steps as two processes, started at the same instant. Counting the study is made slow (0.5 s
# after each count), so that without the report lock both would count before either asks, and ask one trial each.
REPORTER = """
import contextlib, sys, time
from pathlib import Path
from launcher.search import trials
path, number, at, unlocked = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
count = trials.tally_of
def slow_count(study):
    tally = count(study)
    time.sleep(0.5)
    return tally
trials.tally_of = slow_count
if unlocked:
    trials.locked = lambda path: contextlib.nullcontext()
def submit(search, n, values):
    with open(path / "asked", "a") as f:
        f.write(f"{n}\\n")
    return f"run-{n}"
while time.time() < at:
    time.sleep(0.001)
trials.report(path, number, trials.Result(1.0 + number), submit)
"""


def two_reporters_at_once(path: Path, unlocked: bool) -> list:
    at = time.time() + 3  # both have imported Optuna by then
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", REPORTER, str(path), str(n), str(at), str(int(unlocked))],
                              env=env) for n in (0, 1)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    return sorted(int(n) for n in (path / "asked").read_text().split())


@pytest.mark.parametrize("unlocked, asked", [(False, [2]), (True, [2, 3])], ids=["locked", "without-the-lock"])
def test_two_trials_ending_at_once_submit_exactly_the_trials_still_owed(tmp_path, unlocked, asked):
    """3 trials, 2 in parallel: trials 0 and 1 end at the same instant; one trial is owed between them. Under the
    report lock exactly one is asked for; without it (the control) both reporters ask for one, 4 trials of 3."""
    path = make_search(tmp_path, trials=3, parallel=2)
    start(path, Submitted())
    assert two_reporters_at_once(path, unlocked) == asked
    study = open_study(path, load(path))
    assert tally_of(study) == Tally(asked=2 + len(asked), ended=2, failed=0)
    if not unlocked:
        assert report(path, 2, Result(0.5), Submitted()) == []
        study = open_study(path, load(path))
        assert study.user_attrs["ended"] == "all 3 trials ended" and study.best_trial.number == 2
        assert ask_owed(study, load(path), Submitted()) == []
