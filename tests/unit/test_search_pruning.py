"""Pruning a search's trial while it trains (search.pruner=median): real ranks on gloo train a trial whose study
already holds an ended trial with a far lower evaluation loss; the trial stops at its first evaluation, recorded
as pruned, and its study holds the values it was told. A trial numbered below search.startup_trials trains on.
Also the points a search tries first (search.enqueue), checked against the space before anything is submitted."""
from __future__ import annotations

import json
import time

import pytest

from support import train_workers
from support.helpers import events
from launcher.core.config import SearchConfig
from launcher.core.rundir import TRIAL
from launcher.errors import LaunchError
from launcher.search.space import checked_point, read_space
from launcher.search.study import Search, create, load, open_study
from launcher.search.submission import trial_file
from launcher.search.trials import Result, report, result_of, start, tally_of
from support.searches import Submitted
from support.train_harness import launch_forked, make_run_dir, make_tokens, metrics, tiny_config

SPACE = ["search=optuna", "train.lr=tag(log, interval(1e-4, 3e-3))"]


def pruned_search(root, startup_trials, enqueue=()):
    settings = SearchConfig(backend="optuna", trials=3, parallel=1, pruner="median", startup_trials=startup_trials,
                            enqueue=list(enqueue))
    return create(Search("sweep-20261201-000000-beef", str(root), read_space(SPACE), settings, time.time(), {}))


def second_trial(tmp_path, startup_trials):
    """Trial 0 ended with eval_loss 0.5 at every evaluation; trial 1 trains 6 steps, evaluating every 2."""
    root = tmp_path / "runs"
    root.mkdir()
    path = pruned_search(root, startup_trials)
    assert start(path, Submitted()) == [0]
    study = open_study(path, load(path))
    import optuna

    first = optuna.trial.Trial(study, study.trials[0]._trial_id)
    for step in (2, 4, 6):
        first.report(0.5, step)
    assert report(path, 0, Result(0.5), Submitted()) == [1]
    config = tiny_config(make_tokens(tmp_path / "tokens.bin"), steps=6, eval_every=2, eval_batches=1)
    run_dir = make_run_dir(root / "trial-1", config, world_size=2, micro_batch=2)
    (run_dir / TRIAL).write_text(json.dumps(trial_file(load(path), 1)))
    launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    return path, run_dir


def test_a_trial_worse_than_the_median_stops_at_its_first_evaluation(tmp_path):
    path, run_dir = second_trial(tmp_path, startup_trials=1)
    rows = metrics(run_dir)
    assert rows[-1]["final"] and rows[-1]["pruned"] and rows[-1]["step"] == 2 and rows[-1]["steps_run"] == 2
    assert max(row["step"] for row in rows) == 2  # not one step past the evaluation that pruned it
    finished = [e for e in events(run_dir) if e["event"] == "finished"]
    assert len(finished) == 1 and finished[0]["pruned"] is True and finished[0]["step"] == 2
    told = open_study(path, load(path)).trials[1].intermediate_values
    assert told == {2: pytest.approx(rows[-1]["eval_loss"])} and told[2] > 0.5


def test_a_trial_below_startup_trials_is_never_pruned(tmp_path):
    path, run_dir = second_trial(tmp_path, startup_trials=2)
    rows = metrics(run_dir)
    assert rows[-1]["step"] == 6 and "pruned" not in rows[-1]
    assert sorted(open_study(path, load(path)).trials[1].intermediate_values) == [2, 4, 6]  # every one told


def test_the_points_enqueued_are_asked_first_and_count_as_trials_only_once_asked(tmp_path):
    path = pruned_search(tmp_path, 0, enqueue=[{"train.lr": 1e-3}, {"train.lr": 2e-4}])
    study = open_study(path, load(path))
    assert tally_of(study).asked == 0  # waiting: not yet asked for
    assert start(path, Submitted()) == [0]
    assert report(path, 0, Result(1.0), Submitted()) == [1]
    study = open_study(path, load(path))
    assert [t.params["train.lr"] for t in study.trials] == [1e-3, 2e-4] and tally_of(study).asked == 2


@pytest.mark.parametrize("point, words", [
    ({"train.lr": 1e-2}, "search.enqueue: train.lr=0.01 is outside the space (float from 0.0001 to 0.003 (log scale))"),
    ({"train.warmup_steps": 5}, "search.enqueue: train.warmup_steps is not a parameter of the search (its "
                                "parameters: train.lr)"),
    ([1e-3], "search.enqueue takes points such as {train.lr: VALUE}, got [0.001]"),
])
def test_an_enqueued_point_outside_the_space_is_refused_naming_it(point, words):
    with pytest.raises(LaunchError) as err:
        checked_point(read_space(SPACE), point)
    assert err.value.message == words


def test_an_enqueued_point_fills_the_parameters_it_leaves_out_for_the_launch_check():
    space = read_space([*SPACE, "train.warmup_steps=range(0, 200, 50)"])
    assert checked_point(space, {"train.lr": 1e-3}) == {"train.lr": 1e-3, "train.warmup_steps": 0}


def test_a_pruned_trial_is_told_pruned_with_its_step_and_the_next_one_asked(tmp_path):
    from optuna.trial import TrialState

    path = pruned_search(tmp_path, 0)
    assert start(path, Submitted()) == [0]
    assert report(path, 0, result_of([], "eval_loss", "PRUNED at step 2"), Submitted()) == [1]
    trial = open_study(path, load(path)).trials[0]
    assert trial.state == TrialState.PRUNED and trial.user_attrs["cause"] == "pruned at step 2"
