"""Run roots: a cluster's ``run_root`` (its shared scratch) is where its runs go unless ``run_root=`` or
``$LAUNCHER_RUN_ROOT`` says otherwise, and status commands find runs in every root a launch used, not only in
the default one (no cluster needed: runs are composed, and recorded by hand)."""
from __future__ import annotations

import json

import pytest

from launcher import cli
from launcher.service.delete import remove
from launcher.compose.composer import compose_runs
from launcher.core.run_index import RunRecord, known_roots, remember_root, save_record


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home" / ".launcher"))
    monkeypatch.delenv("LAUNCHER_RUN_ROOT", raising=False)
    return tmp_path / "home"


def root_of(*overrides):
    (run,) = compose_runs(["gpus=2", *overrides])
    return run.config.run_root


def test_a_clusters_run_root_is_used_unless_the_user_names_one(home, tmp_path, monkeypatch):
    assert root_of() == "~/.launcher/runs"
    assert root_of(f"cluster.run_root={tmp_path}/scratch") == f"{tmp_path}/scratch"
    assert root_of(f"cluster.run_root={tmp_path}/scratch", f"run_root={tmp_path}/mine") == f"{tmp_path}/mine"
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "env"))
    assert root_of(f"cluster.run_root={tmp_path}/scratch") == str(tmp_path / "env")


def record(root, name, submitted):
    run_dir = root / name
    run_dir.mkdir(parents=True)
    save_record(RunRecord(name=name, run_dir=str(run_dir), model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2,
                          steps=40, cluster="local", submitted_at=submitted, job_id=None))


def test_status_commands_find_runs_in_every_root_a_launch_used(home, tmp_path, capsys):
    default, scratch = home / ".launcher" / "runs", tmp_path / "scratch"
    record(default, "here", 1.0)
    record(scratch, "there", 2.0)
    assert known_roots() == [default]
    remember_root(scratch)
    remember_root(scratch)  # once
    assert known_roots() == [default, scratch]
    assert (home / ".launcher" / "roots").read_text() == f"{scratch}\n"
    assert cli.main(["runs", "--json"]) == 0
    assert [row["name"] for row in json.loads(capsys.readouterr().out)] == ["there", "here"]  # newest first
    assert cli.main(["describe", "there"]) == 2  # found in the second root: its record has no config beside it
    assert capsys.readouterr().err == f"error: run there is damaged: {scratch}/there/config.yaml is missing\n"
    assert cli.main(["runs", "--json", "--root", str(default)]) == 0  # --root: that root alone
    assert [row["name"] for row in json.loads(capsys.readouterr().out)] == ["here"]
    assert cli.main(["describe", "nowhere"]) == 2
    assert capsys.readouterr().err.startswith(f"error: no run named 'nowhere' in {default}")


def test_a_root_from_the_environment_is_remembered_for_a_shell_without_it(home, tmp_path, monkeypatch, capsys):
    """A launch with $LAUNCHER_RUN_ROOT set remembers that root; a new shell without the variable finds its runs."""
    scratch = tmp_path / "scratch"
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(scratch))
    record(scratch, "there", 2.0)
    remember_root(scratch)  # what the submission does for each run's root
    remember_root(home / ".launcher" / "runs")  # the built-in root is always looked in: never listed
    assert (home / ".launcher" / "roots").read_text() == f"{scratch}\n"
    monkeypatch.delenv("LAUNCHER_RUN_ROOT")
    assert known_roots() == [home / ".launcher" / "runs", scratch]
    assert cli.main(["runs", "--json"]) == 0
    assert [row["name"] for row in json.loads(capsys.readouterr().out)] == ["there"]


def test_no_runs_says_where_it_looked(home, capsys):
    assert cli.main(["runs"]) == 0
    assert capsys.readouterr().out == f"No runs (looked in {home}/.launcher/runs; --root names another).\n"


def test_delete_moves_a_run_aside_so_a_late_writer_cannot_recreate_part_of_it(tmp_path):
    """A writer holding the run's path (a watcher's judgement, an end step's event) after delete began finds no
    directory, instead of leaving a half-removed one that runs would list as DAMAGED."""
    run_dir = tmp_path / "gpt-tiny-1g-5000"
    (run_dir / "checkpoints" / "step_00000010").mkdir(parents=True)
    (run_dir / "events.jsonl").write_text("{}\n")
    assert remove(run_dir) is True
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing left aside either
    with pytest.raises(FileNotFoundError):
        (run_dir / "events.jsonl").open("a")  # the late writer's append
    assert remove(run_dir) is True  # gone already: nothing to do
