"""A search's points tried first (search.enqueue), checked against the space before anything is submitted, and
what a pruned trial is told (a trial pruned while it trains on real ranks: tests/cluster/training)."""
from __future__ import annotations


import pytest

from launcher.errors import LaunchError
from launcher.search.space import checked_point, read_space
from launcher.search.study import load, open_study
from launcher.search.trials import Result, report, result_of, start, tally_of
from support.searches import SPACE, Submitted, pruned_search


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
