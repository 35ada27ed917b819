"""A search's space as typed (Hydra's grammar, as its Optuna sweeper reads it) and its checks before anything is
submitted: every corner of the space is composed as a single run, so a bad bound is refused in one line, exit 2,
with no study directory or run left behind."""
from __future__ import annotations

import re

import pytest

from launcher import cli
from launcher.errors import LaunchError
from launcher.search.space import CHOICE, FLOAT, INT, Param, asked, from_dict, read_space, to_dict

LR = "train.lr=tag(log, interval(1e-4, 3e-3))"


def test_interval_range_and_choice_become_optuna_distributions_typed_by_the_setting():
    space = read_space(["search=optuna", "search.trials=8", LR, "train.warmup_steps=range(0, 200, 50)",
                        "model=choice(gpt_tiny, gpt_small)", "train.steps=20", "train.eval_every=interval(5, 10)"])
    lr, warmup, model, every = space.params
    assert lr == Param("train.lr", FLOAT, 1e-4, 3e-3, log=True)
    # range() means what a grid's range() enumerates: 0, 50, 100, 150 (the end excluded).
    assert warmup == Param("train.warmup_steps", INT, 0, 150, step=50)
    assert model == Param("model", CHOICE, choices=("gpt_tiny", "gpt_small"))
    assert every == Param("train.eval_every", INT, 5, 10)  # Hydra reads interval bounds as floats; the key is an int
    assert space.fixed == ("train.steps=20",) and space.settings == ("search=optuna", "search.trials=8")
    assert warmup.distribution().high == 150 and lr.distribution().log
    assert from_dict(to_dict(space)) == space


def test_the_corners_are_every_combination_of_each_parameters_extremes():
    space = read_space(["search=optuna", LR, "model=gpt_tiny,gpt_small"])
    assert space.corners() == [{"train.lr": 1e-4, "model": "gpt_tiny"}, {"train.lr": 1e-4, "model": "gpt_small"},
                               {"train.lr": 3e-3, "model": "gpt_tiny"}, {"train.lr": 3e-3, "model": "gpt_small"}]
    assert space.trial({"train.lr": 3e-3, "model": "gpt_small"}) == ["train.lr=0.003", "model=gpt_small"]


@pytest.mark.parametrize("line, words", [
    ("train.lr=tag(log, interval(0, 1e-3))", "positive lower bound"),
    ("train.lr=interval(3e-3, 1e-4)", "low < high"),
    ("train.lr=tag(lin, interval(1e-4, 1e-3))", "only the tag log"),
    ("train.warmup_steps=tag(log, range(1, 9, 2))", "interval() only"),
    ("train.warmup_steps=interval(0.5, 3)", "integer bounds"),
    ("train.warmup_steps=range(0.5, 3, 0.5)", "integer start"),
    ("parallel.sharding=interval(1, 2)", "holds no number"),
    ("model=interval(1, 2)", "choice(a, b)"),
    ("train.warmup_steps=range(5, 0)", "holds no value"),
])  # fmt: skip
def test_a_space_the_search_cannot_draw_from_is_one_line(line, words):
    with pytest.raises(LaunchError, match=re.escape(words)):
        read_space(["search=optuna", line])


def test_a_search_needs_a_parameter_and_a_search_setting_needs_a_search():
    with pytest.raises(LaunchError, match="needs a setting to search"):
        read_space(["search=optuna", "train.lr=1e-3"])
    with pytest.raises(LaunchError, match="add search=optuna"):
        asked(["search.trials=3", LR])
    assert asked(["search=optuna"]) and not asked(["search=none", "train.lr=1e-3"])


@pytest.fixture
def root(tmp_path, monkeypatch):
    """An empty run root (Slurm answers "unreachable" to an unmarked test: nothing may get that far)."""
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "runs"))
    (tmp_path / "runs").mkdir()
    return tmp_path / "runs"


@pytest.mark.parametrize("args, message", [
    (["search=optuna", LR], "add -m"),
    (["-m", "search=optuna", "train.lr=interval(0, 1e-3)"], "train.lr must be > 0, got 0.0"),
    (["-m", "search=optuna", LR, "train.warmup_steps=range(-50, 100, 50)"],
     "at the corner [train.lr=0.0001 train.warmup_steps=-50] of the search space: train.warmup_steps must be >= 0"),
    (["-m", "search=optuna", "search.trials=0", LR], "search.trials must be in [1, 10,000], got 0"),
    (["-m", "search=optuna", "search.parallel=0", LR], "search.parallel must be >= 1, got 0"),
    (["-m", "search=optuna", "search.max_failures=-1", LR], "search.max_failures must be >= 0"),
    (["-m", "search=optuna", "search.direction=up", LR], "search.direction must be one of minimize, maximize"),
    (["-m", "search=optunaa", LR], "unknown search 'optunaa' (did you mean 'optuna'?)"),
    (["-m", "search=optuna", "model=choice(gpt_tiny, gpt_nope)"], "unknown model 'gpt_nope'"),
    (["-m", "search=optuna", LR, "train.eval_every=0"], "search.metric=eval_loss needs an evaluation"),
    (["-m", "search=optuna", LR, "model=gpt_70b", "cluster.gpu_memory_gb=1"],
     "(2 of 2 runs refused; nothing was submitted)"),
])  # fmt: skip
def test_every_value_of_the_space_is_checked_before_anything_is_made(args, message, root, capsys):
    assert cli.main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and message in err, err
    assert list(root.iterdir()) == []


def test_a_run_file_holds_the_space_as_search_params(root, tmp_path, capsys):
    """``launcher -m -f search.yaml``: the space under ``search.params``, as Hydra's Optuna sweeper keeps it under
    ``hydra.sweeper.params``; the command line still wins over the file."""
    path = tmp_path / "search.yaml"
    path.write_text("model: gpt_tiny\nsearch: optuna\nsearch.trials: 4\nsearch.params:\n"
                    "  train.lr: tag(log, interval(1e-4, 3e-3))\n  train:\n    warmup_steps: range(0, 200, 50)\n")
    assert cli.main(["-m", "-f", str(path), "train.lr=interval(1e-4, 2e-4)", "dry_run=json"]) == 0
    import json

    corners = [json.loads(line)["overrides"] for line in capsys.readouterr().out.splitlines()]
    assert [[o for o in c if o.startswith(("train.lr", "train.warmup"))] for c in corners] == [
        ["train.warmup_steps=0", "train.lr=0.0001"], ["train.warmup_steps=0", "train.lr=0.0002"],
        ["train.warmup_steps=150", "train.lr=0.0001"], ["train.warmup_steps=150", "train.lr=0.0002"]]
    path.write_text("search: optuna\nsearch.params: {train.lr: 0.001}\n")
    assert cli.main(["-m", "-f", str(path)]) == 2
    assert "search.params.train.lr must be an expression" in capsys.readouterr().err
    assert list(root.iterdir()) == []


def test_what_a_job_could_resolve_otherwise_is_pinned_as_the_launch_composed_it(root, tmp_path, monkeypatch):
    """A trial composed in a job's last step sees another environment and current directory, and the frozen code's
    conf/: a relative data.path is made absolute (as run.yaml records it), and the run root and slurm.conf become
    the environment trials are composed in, so that a trial's run.yaml is a plain run's."""
    from launcher.search.start import check_search, pinned

    from dataclasses import replace

    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    checked = check_search(["search=optuna", LR, "train.steps=3"], multirun=True)
    for corner in checked.corners:  # as composed from data.path=tokens typed in tmp_path
        corner.config.data.path = str(tmp_path / "tokens.bin")
    typed = replace(checked.space, fixed=(*checked.space.fixed, "data.path=tokens.bin"))
    space, environment = pinned(typed, checked.corners, root)
    assert space.fixed == ("train.steps=3", f"data.path={tmp_path / 'tokens.bin'}")
    assert environment == {"LAUNCHER_RUN_ROOT": str(root), "SLURM_CONF": str(tmp_path / "slurm.conf")}


def test_a_launch_whose_first_trial_is_refused_leaves_no_study(root, monkeypatch):
    from launcher.search import start
    from launcher.submit import submitter as submitting

    def refused(search, number, values):
        raise LaunchError("sbatch: error: Batch job submission failed: Requested node configuration is not available")

    monkeypatch.setattr(submitting, "check_runs", lambda runs: ([root] * len(runs), [None] * len(runs)))
    monkeypatch.setattr(start, "submit_trial", refused)
    checked = start.check_search(["search=optuna", LR], multirun=True)
    with pytest.raises(LaunchError, match="node configuration is not available"):
        start.start_search(checked)
    assert list(root.iterdir()) == []
