"""Pruning a search's trial while it trains (search.pruner=median): real ranks on gloo train a trial whose study
already holds an ended trial with a far lower evaluation loss; the trial stops at its first evaluation, recorded
as pruned, and its study holds the values it was told. A trial numbered below search.startup_trials trains on.
(The points a search tries first, and what a pruned trial is told: tests/unit/test_search_pruning.py.)"""
from __future__ import annotations

import json

import pytest

from support import train_workers
from support.helpers import events
from launcher.core.rundir import TRIAL
from launcher.search.study import load, open_study
from launcher.search.submission import trial_file
from launcher.search.trials import Result, report, start
from support.searches import Submitted, pruned_search
from support.train_harness import launch_forked, make_run_dir, make_tokens, metrics, tiny_config

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm


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
