"""Seeing a search without a cluster: a real Optuna study in a run root, its trials' runs as
records beside it, and what ``runs --sweep``, ``describe``, ``compare --plot`` and ``stop`` make of them.

The study is built by the launcher's own functions (start, report) with a stand-in submission that records each
trial's run, so its trials end as a search's do: completed with a value, failed with a cause, pruned (told by
Optuna directly, as the pruning step will), or still running. Their parameters are enqueued, so the values the
output shows are known."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from launcher import cli
from launcher.core.config import SearchConfig
from launcher.core.rundir import TRIAL
from launcher.search.space import read_space
from launcher.search.study import Search, create, load, open_study
from launcher.search.trials import STOPPED_BY, Result, fail_unended, owed, report, start, stop, tally_of
from launcher.core.run_index import RunRecord, save_record

SEARCH_ID = "sweep-20261201-000000-abcd"
# Trial n is drawn at POINTS[n]: enqueued, so Optuna's ask() hands these out in order.
POINTS = [(1.0e-3, 0), (5.0e-4, 100), (3.2e-4, 50), (2.0e-3, 150), (1.5e-4, 0), (8.0e-4, 50), (2.5e-4, 100),
          (6.0e-4, 0), (1.2e-3, 150)]


class Submitted:
    """A stand-in for submit_trial: each trial's run as the launcher records it (run.json in the sweep, trial.json),
    without Slurm."""

    def __init__(self, root: Path):
        self.root, self.numbers = root, []

    def __call__(self, search, number, values):
        name = f"run-{number}"
        run_dir = self.root / name
        run_dir.mkdir()
        save_record(RunRecord(name=name, run_dir=str(run_dir), model="gpt_tiny", gpus=1, nodes=1, gpus_per_node=1,
                              steps=40, cluster="local", submitted_at=1000.0 + number, sweep=search.id))
        (run_dir / TRIAL).write_text(json.dumps({"search": search.id, "trial": number}))
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 3.0, "step_time": 0.1}) + "\n")
        self.numbers.append(number)
        return name


def make_search(root: Path, trials: int = 9, parallel: int = 4, max_failures=3, direction="minimize") -> Path:
    space = read_space(["search=optuna", "train.lr=tag(log, interval(1e-4, 3e-3))",
                        "train.warmup_steps=range(0, 200, 50)", "train.steps=40"])
    settings = SearchConfig(backend="optuna", trials=trials, parallel=parallel, max_failures=max_failures,
                            direction=direction)
    path = create(Search(SEARCH_ID, str(root), space, settings, time.time(), {"LAUNCHER_RUN_ROOT": str(root)}))
    study = open_study(path, load(path))
    for lr, warmup in POINTS[:trials]:
        study.enqueue_trial({"train.lr": lr, "train.warmup_steps": warmup})
    return path


def prune(path: Path, number: int, value: float, step: int) -> None:
    """Trial ``number`` pruned at ``step`` after reporting ``value`` there (Optuna keeps it as its value)."""
    from optuna.trial import Trial, TrialState

    study = open_study(path, load(path))
    Trial(study, study.trials[number]._trial_id).report(value, step)
    study.tell(number, state=TrialState.PRUNED)


@pytest.fixture
def searched(tmp_path):
    """9 trials, 4 in parallel: 0 and 2 completed (2 the best), 1 failed, 3 pruned with a lower value than any
    (never the best), 4, 5 and 6 running; 7 and 8 enqueued (WAITING), not asked for yet."""
    path = make_search(tmp_path)
    submit = Submitted(tmp_path)
    assert start(path, submit) == [0, 1, 2, 3]
    assert report(path, 0, Result(2.5), submit) == [4]
    assert report(path, 1, Result(None, "failed: RuntimeError: boom"), submit) == [5]
    assert report(path, 2, Result(2.1), submit) == [6]
    prune(path, 3, 1.9, 10)
    return tmp_path, path, submit


def test_values_are_short_and_columns_are_named_by_the_keys_last_part():
    from launcher.views.search_summary import metric_text, param_names, short

    assert [short(v) for v in (3.2e-4, 1e-4, 0.25, 50, "gpt_small", 12345.0, 2.0)] == [
        "3.2e-04", "1e-04", "0.25", "50", "gpt_small", "1.2e+04", "2"]
    assert (short(0.0224), short(0.0224, log=True), short(8.9e-3, log=True)) == ("0.0224", "2.2e-02", "8.9e-03")
    assert [metric_text(v) for v in (2.1, None, 1.5e-5)] == ["2.1000", "", "1.5e-05"]
    assert param_names(["train.lr", "optim.lr", "train.warmup_steps", "model"]) == {
        "train.lr": "train.lr", "optim.lr": "optim.lr", "train.warmup_steps": "warmup_steps", "model": "model"}


def test_the_view_counts_every_state_and_the_best_is_a_completed_trial(searched):
    from launcher.search.view import view

    _, path, _ = searched
    seen = view(path)
    assert [(t.number, t.state, t.run) for t in seen.trials] == [
        (0, "COMPLETE", "run-0"), (1, "FAIL", "run-1"), (2, "COMPLETE", "run-2"), (3, "PRUNED", "run-3"),
        (4, "RUNNING", "run-4"), (5, "RUNNING", "run-5"), (6, "RUNNING", "run-6"), (7, "WAITING", None),
        (8, "WAITING", None)]
    assert seen.counts() == {"RUNNING": 3, "WAITING": 2, "COMPLETE": 2, "PRUNED": 1, "FAIL": 1}
    assert seen.trials[3].value == 1.9 and seen.best().number == 2  # a pruned trial's value is never the best
    assert seen.trials[1].cause == "failed: RuntimeError: boom" and seen.ended is None and not seen.stopped
    assert seen.trials[2].params == {"train.lr": 3.2e-4, "train.warmup_steps": 50}


def test_the_best_follows_the_direction(tmp_path):
    from launcher.search.view import view

    from launcher.views.search_summary import best_line

    path = make_search(tmp_path, trials=2, parallel=2, direction="maximize")
    submit = Submitted(tmp_path)
    start(path, submit)
    assert best_line(view(path)) == "Best so far: none yet; no trial has completed with its eval_loss"
    report(path, 0, Result(0.5), submit)
    report(path, 1, Result(0.7), submit)
    assert view(path).best().number == 1
    assert best_line(view(path)) == "Best: trial 1 (run-1), eval_loss 0.7000 at lr 5e-04 warmup_steps 100"


def test_runs_of_a_search_show_each_trials_parameters_state_and_value_then_the_best_and_progress(searched, capsys):
    root, _, _ = searched
    assert cli.main(["runs", "--sweep", "sweep-2026", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[-5:] == ["TRIAL", "STATE", "lr", "warmup_steps", "eval_loss"] and "TRIAL STATE" in lines[0]
    rows = {line.split()[0]: line.split() for line in lines[2:-2]}
    assert sorted(rows) == [f"run-{n}" for n in range(7)]
    assert rows["run-2"][-5:] == ["2", "COMPLETE", "3.2e-04", "50", "2.1000"]
    assert rows["run-1"][-4:] == ["1", "FAIL", "5e-04", "100"]
    assert rows["run-3"][-5:] == ["3", "PRUNED", "2e-03", "150", "1.9000"]
    assert rows["run-4"][-4:] == ["4", "RUNNING", "1.5e-04", "0"]
    assert lines[-2] == (f"Search {SEARCH_ID}: 4 of 9 trials ended, 1 failed (3 allowed), 1 pruned; 3 running, "
                         "2 waiting")
    assert lines[-1] == "Best so far: trial 2 (run-2), eval_loss 2.1000 at lr 3.2e-04 warmup_steps 50"


def test_runs_json_of_a_search_adds_the_trials_fields_and_keeps_every_other_key(searched, capsys):
    from launcher.commands.runs import RunRow, TRIAL_FIELDS

    root, _, _ = searched
    assert cli.main(["runs", "--sweep", SEARCH_ID, "--root", str(root), "--json"]) == 0
    rows = {row["name"]: row for row in json.loads(capsys.readouterr().out)}
    plain = [name for name in RunRow.__dataclass_fields__ if name not in TRIAL_FIELDS]
    assert all(list(row) == plain + list(TRIAL_FIELDS) for row in rows.values())
    assert {k: rows["run-2"][k] for k in TRIAL_FIELDS} == {
        "trial": 2, "params": {"train.lr": 3.2e-4, "train.warmup_steps": 50}, "trial_state": "COMPLETE", "value": 2.1}
    assert (rows["run-1"]["trial_state"], rows["run-1"]["value"]) == ("FAIL", None)
    assert rows["run-2"]["sweep"] == SEARCH_ID and rows["run-2"]["steps"] == 40


def test_a_grid_sweep_and_the_plain_listing_are_listed_as_before(searched, capsys):
    from launcher.commands.runs import RunRow, TRIAL_FIELDS

    root, _, _ = searched
    run_dir = root / "grid-0"
    run_dir.mkdir()
    save_record(RunRecord(name="grid-0", run_dir=str(run_dir), model="gpt_tiny", gpus=1, nodes=1, gpus_per_node=1,
                          steps=40, cluster="local", submitted_at=2000.0, sweep="sweep-grid"))
    assert cli.main(["runs", "--sweep", "sweep-grid", "--root", str(root)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3 and "TRIAL" not in lines[0] and lines[0].split()[-1] == "ELAPSED/ETA"
    assert cli.main(["runs", "--root", str(root), "--json"]) == 0  # trials outside --sweep: plain rows
    listed = json.loads(capsys.readouterr().out)
    plain = [name for name in RunRow.__dataclass_fields__ if name not in TRIAL_FIELDS]
    assert len(listed) == 8 and all(list(row) == plain for row in listed)


def test_describe_of_a_search_summarises_its_study(searched, capsys):
    root, _, _ = searched
    assert cli.main(["describe", "sweep-20261201", "--root", str(root)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0] == (f"Search {SEARCH_ID}: 9 trials, 4 in parallel, toward the lowest eval_loss (minimize); "
                        "more than 3 failed trials (search.max_failures) end it")
    assert "  train.lr  float in [1e-04, 3e-03], log scale" in lines
    assert "  train.warmup_steps  int in [0, 150] step 50" in lines
    assert "Shared: train.steps=40" in lines
    assert "Trials: RUNNING 3, WAITING 2, COMPLETE 2, PRUNED 1, FAIL 1" in lines
    assert "Best so far: trial 2 (run-2), eval_loss 2.1000 at lr 3.2e-04 warmup_steps 50" in lines
    trials = {line.split()[0]: line.split() for line in lines if line[:1].isdigit()}
    assert trials["1"] == ["1", "run-1", "FAIL", "lr", "5e-04", "warmup_steps", "100", "failed:", "RuntimeError:",
                           "boom"]
    assert trials["2"][:4] == ["2", "run-2", "COMPLETE", "2.1000"] and len(trials) == 9
    assert trials["7"][:4] == ["7", "(not", "submitted)", "WAITING"]

    assert cli.main(["describe", SEARCH_ID, "--root", str(root), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["settings"]["trials"] == 9 and info["failures_allowed"] == 3 and info["ended"] is None
    assert info["counts"]["PRUNED"] == 1 and info["best"]["number"] == 2 and len(info["trials"]) == 9
    assert [p["key"] for p in info["space"]] == ["train.lr", "train.warmup_steps"] and info["space"][0]["log"]


def test_describe_of_an_unknown_or_ambiguous_name_is_one_line_naming_it(searched, capsys):
    root, path, _ = searched
    assert cli.main(["describe", "sweep-nope", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'sweep-nope'" in err and "no search's sweep id starts with" in err
    create(Search("sweep-20261201-000000-beef", str(root), load(path).space, load(path).settings, time.time(), {}))
    assert cli.main(["describe", "sweep-2026", "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "search 'sweep-2026' is ambiguous" in err and SEARCH_ID in err


def test_describe_of_a_trial_run_names_its_search_and_number(searched):
    from launcher.commands.describe import trial_line
    from launcher.service.describe import trial_info

    root, _, _ = searched
    info = trial_info(root / "run-2")
    assert info == {"search": SEARCH_ID, "trial": 2, "state": "COMPLETE", "value": 2.1}
    assert trial_line(info) == (f"Trial 2 of search {SEARCH_ID}: COMPLETE, value 2.1000 (the whole search: "
                                f"launcher describe {SEARCH_ID})")
    (root / "plain").mkdir()
    assert trial_info(root / "plain") is None
    (root / "orphan").mkdir()  # a trial whose search's directory was removed
    (root / "orphan" / TRIAL).write_text(json.dumps({"search": "sweep-gone", "trial": 3}))
    assert trial_info(root / "orphan") == {"search": "sweep-gone", "trial": 3, "state": None, "value": None}
    assert trial_line(trial_info(root / "orphan")).startswith("Trial 3 of search sweep-gone: not in the study")


def test_the_plot_draws_the_value_against_each_parameter_and_marks_the_best(searched):
    from launcher.views.search_plot import figure, plotted
    from launcher.search.view import view

    _, path, _ = searched
    seen = view(path)
    drawn = plotted(seen)
    assert [t.number for t in drawn.shown] == [0, 2, 3]
    assert drawn.note("eval_loss") == ("left out of the plot, without eval_loss: trial 1 (FAIL), trial 4 "
                                       "(RUNNING), trial 5 (RUNNING), trial 6 (RUNNING), trial 7 (WAITING), "
                                       "trial 8 (WAITING)")
    fig = figure(seen, drawn)
    lr, warmup = fig.axes
    assert (lr.get_xscale(), warmup.get_xscale()) == ("log", "linear")
    assert (lr.get_xlabel(), lr.get_ylabel()) == ("train.lr (log scale)", "eval_loss")
    assert warmup.get_xlabel() == "train.warmup_steps" and warmup.get_title() == "eval_loss vs train.warmup_steps"
    assert [t.get_text() for t in lr.get_legend().get_texts()] == [
        "completed", "pruned (its last reported eval_loss)", "best: trial 2, eval_loss 2.1000"]
    completed, pruned, best = lr.collections
    assert sorted(map(tuple, completed.get_offsets().tolist())) == [(3.2e-4, 2.1), (1e-3, 2.5)]
    assert pruned.get_offsets().tolist() == [[2e-3, 1.9]] and best.get_offsets().tolist() == [[3.2e-4, 2.1]]
    assert sorted(t.get_text() for t in lr.texts) == ["trial 0", "trial 2", "trial 3"]  # each point labelled
    assert lr.get_xlim() == pytest.approx((1e-4 / 1.25, 3e-3 * 1.25))  # the whole space searched
    assert warmup.get_xlim() == pytest.approx((-7.5, 157.5))


def test_compare_of_a_search_writes_its_plot_and_says_what_it_left_out(searched, capsys):
    root, _, _ = searched
    png = root / "search.png"
    assert cli.main(["compare", "--sweep", SEARCH_ID, "--plot", str(png), "--root", str(root)]) == 0
    out = capsys.readouterr().out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"plot written to {png}; left out of the plot, without eval_loss: trial 1 (FAIL), trial 4" in out
    assert "Best so far: trial 2 (run-2)" in out
    assert cli.main(["compare", "--sweep", SEARCH_ID, "--plot", str(png), "--json", "--root", str(root)]) == 0
    captured = capsys.readouterr()
    assert len(json.loads(captured.out)) == 7 and captured.err.startswith("left out of the plot")
    bad = root / "no-such-dir" / "search.png"
    assert cli.main(["compare", "--sweep", SEARCH_ID, "--plot", str(bad), "--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--plot {bad}: cannot write it" in err


def test_a_stopped_search_owes_nothing_and_its_running_trials_are_told_failed(searched):
    from launcher.search.view import view

    root, path, submit = searched
    stop(path)
    study = open_study(path, load(path))
    assert owed(tally_of(study), load(path).settings) == 0 and study.user_attrs["ended"] == STOPPED_BY
    assert report(path, 4, Result(None, "stopped: its job was cancelled"), submit) == []  # a last step after it
    assert fail_unended(path, "stopped") == ([5, 6], [7, 8])
    seen = view(path)
    assert [(t.number, t.state, t.cause) for t in seen.trials[4:]] == [
        (4, "FAIL", "stopped: its job was cancelled"), (5, "FAIL", "stopped"), (6, "FAIL", "stopped"),
        (7, "FAIL", "stopped before it ran"), (8, "FAIL", "stopped before it ran")]
    assert seen.counts()["WAITING"] == 0 and seen.trials[7].run is None
    assert seen.stopped and seen.ended == STOPPED_BY
    # Idempotent with the trials' own last steps and with itself: nothing more is told or asked.
    assert report(path, 5, Result(2.0), submit) == [] and view(path).trials[5].value is None
    assert fail_unended(path, "stopped") == ([], []) and submit.numbers == list(range(7))
    stop(path)
    assert open_study(path, load(path)).user_attrs["ended"] == STOPPED_BY


def states_of(pending: set):
    """Slurm's part of ``launcher stop``: the jobs of the runs named ``pending`` wait in the queue (cancelled at once,
    with no save to wait for), the others have ended."""
    from launcher.status.job_state import JobState

    return lambda records: {rec.name: JobState("PENDING" if rec.name in pending else "COMPLETED") for rec in records}


def test_stop_sweep_marks_the_search_stopped_before_it_cancels_and_fails_the_running_trials(searched, monkeypatch,
                                                                                             capsys):
    from launcher.service import stop as stop_command

    root, path, _ = searched
    cancelled = []

    def scancel(rec):  # Slurm's part: the jobs of the trials still active, cancelled after the search stopped
        assert "stopped" in open_study(path, load(path)).user_attrs
        cancelled.append(rec.name)

    monkeypatch.setattr(stop_command, "job_states", states_of({"run-4", "run-5", "run-6"}))
    monkeypatch.setattr(stop_command, "scancel", scancel)
    assert cli.main(["stop", "--sweep", "sweep-2026", "--root", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Stopped search {SEARCH_ID}: it submits no more trials."
    assert out[-2:] == ["Told the study that trials 4, 5, 6 failed (stopped).",
                        "Told the study that trials 7, 8, enqueued, failed (stopped before it ran)."]
    assert sorted(cancelled) == ["run-4", "run-5", "run-6"]
    study = open_study(path, load(path))
    assert [t.state.name for t in study.trials] == ["COMPLETE", "FAIL", "COMPLETE", "PRUNED"] + ["FAIL"] * 5
    assert owed(tally_of(study), load(path).settings) == 0
    assert cli.main(["stop", "--sweep", SEARCH_ID, "--root", str(root)]) == 0  # again: nothing more to do
    assert "Told the study" not in capsys.readouterr().out
    assert [t.user_attrs["cause"] for t in open_study(path, load(path)).trials[4:]] == ["stopped"] * 3 + [
        "stopped before it ran"] * 2


def test_stopping_one_trial_fails_it_and_submits_the_trial_owed_in_its_place(searched, monkeypatch, capsys):
    from launcher.service import stop as stop_command
    from launcher.search import submission

    root, path, submit = searched
    monkeypatch.setattr(stop_command, "job_states", states_of({"run-4"}))
    monkeypatch.setattr(stop_command, "scancel", lambda rec: None)
    monkeypatch.setattr(submission, "submit_trial", submit)
    assert cli.main(["stop", "run-4", "--root", str(root)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["Stopped run-4 (job None).",
                   f"Told search {SEARCH_ID} that trial 4 failed (stopped); submitted trials 7, 8 in its place."]
    study = open_study(path, load(path))
    assert (study.trials[4].state.name, study.trials[4].user_attrs["cause"]) == ("FAIL", "stopped")
    assert [(t.state.name, t.user_attrs["run"]) for t in study.trials[7:]] == [("RUNNING", "run-7"),
                                                                               ("RUNNING", "run-8")]
    assert "ended" not in study.user_attrs  # the search goes on
    # The trial's own last step, reaching the study after this, changes nothing and submits nothing.
    assert report(path, 4, Result(None, "stopped: its job was cancelled"), submit) == []
    assert open_study(path, load(path)).trials[4].user_attrs["cause"] == "stopped"


def test_a_grid_sweeps_commands_load_neither_optuna_nor_the_searchs_modules(tmp_path):
    """Whether a sweep is a search is asked of its directory: a grid sweep's runs --sweep, compare and describe of
    a run pay nothing for searches."""
    import subprocess
    import sys

    run_dir = tmp_path / "grid-0"
    run_dir.mkdir()
    save_record(RunRecord(name="grid-0", run_dir=str(run_dir), model="gpt_tiny", gpus=1, nodes=1, gpus_per_node=1,
                          steps=40, cluster="local", submitted_at=2000.0, sweep="sweep-grid"))
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 10, "loss": 3.0, "step_time": 0.1}) + "\n")
    code = ("import sys; from launcher import cli; "
            f"assert cli.main(['runs', '--sweep', 'sweep-gr', '--root', {str(tmp_path)!r}]) == 0; "
            f"assert cli.main(['compare', '--sweep', 'sweep-gr', '--root', {str(tmp_path)!r}]) == 0; "
            "loaded = [m for m in sys.modules if m.startswith(('optuna', 'launcher.search'))]; "
            "assert not loaded, loaded")
    result = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "grid-0" in result.stdout and "Search" not in result.stdout and "TRIAL" not in result.stdout
