"""A grid sweep's runs of one resource shape go to Slurm as one job array (launcher/submit/submitter.py arrays,
launcher/slurm/batch.py array_script, launcher/submit/array.py submit_array), each element its run's job: its
own directory, files, record and job name (``123_4``). Without a cluster: Slurm's answers are given here."""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from launcher.compose.composer import compose_runs
from launcher.job import recovery
from launcher.slurm.batch import array_script
from launcher.slurm.client import Slurm
from launcher.submit import submitter as submit


# The progress follower reaped before the shell ends.
REAP = 'ENDED=$?; kill $LAUNCHER_PROGRESS 2>/dev/null; wait $LAUNCHER_PROGRESS 2>/dev/null; exit $ENDED'


def grid(*overrides: str):
    return compose_runs(["train.steps=3", *overrides], multirun=True)


def test_the_array_script_runs_each_element_in_its_own_run_directory(tmp_path):
    """The script's first lines, run as Slurm runs element 1: it finds the second run directory (a space in its
    path) and writes its batch output there, under the element's name, as submitit names an element's files."""
    runs = grid("train.lr=1e-3,2e-3,3e-3", "sweep.parallel=2")
    run_dirs = [tmp_path / "run a", tmp_path / "run b", tmp_path / "run c"]
    for run_dir in run_dirs:
        (run_dir / "submitit").mkdir(parents=True)
    script = array_script(runs[0].config, runs[0].plan, "sweep-x", run_dirs, tmp_path / ".sweeps" / "sweep-x")
    lines = script.splitlines()
    assert "#SBATCH --array=0-2%2" in lines and "#SBATCH --job-name=sweep-x" in lines
    assert f"#SBATCH --error={tmp_path}/.sweeps/sweep-x/%A_%a_0_log.err" in lines
    assert lines[-2].endswith('-m launcher.job.recovery end "$RUN_DIR" $?') and lines[-1] == REAP
    assert any(line.endswith('-m launcher.job.recovery begin "$RUN_DIR")') for line in lines)
    assert 'export PYTHONPATH="$RUN_DIR"/code${PYTHONPATH:+:$PYTHONPATH} PYTHONSAFEPATH=1' in lines
    srun = next(line for line in lines if line.startswith("srun "))
    assert '--output "$RUN_DIR/submitit/%A_%a_%t_log.out"' in srun and "--kill-on-bad-exit=1" in srun
    assert srun.endswith('-u -m launcher.job.task "$RUN_DIR/submitit"')
    setup = lines[lines.index("# setup") + 1:lines.index("# setup") + 4]
    shell = "\n".join([*setup, 'echo "found $RUN_DIR"', 'echo oops >&2'])
    env = {"SLURM_ARRAY_JOB_ID": "123", "SLURM_ARRAY_TASK_ID": "1", "PATH": "/usr/bin:/bin"}
    subprocess.run(["bash", "-c", shell], env=env, check=True)
    assert (run_dirs[1] / "submitit" / "123_1_0_log.out").read_text() == f"found {run_dirs[1]}\n"
    assert (run_dirs[1] / "submitit" / "123_1_0_log.err").read_text() == "oops\n"
    assert not list((run_dirs[0] / "submitit").iterdir()) and not list((run_dirs[2] / "submitit").iterdir())


def test_an_element_reads_its_batch_log_by_its_element_name(tmp_path, monkeypatch):
    """Its SLURM_JOB_ID is a number of its own (127); its files are named 123_4 (the batch script's ``exec``)."""
    assert recovery.batch_log(tmp_path, "127") == tmp_path / "submitit" / "127_0_log.err"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "123")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "4")
    assert recovery.batch_log(tmp_path, "127") == tmp_path / "submitit" / "123_4_0_log.err"


@pytest.fixture
def max_array_size(monkeypatch):
    """The cluster's MaxArraySize, as the test sets it (``sizes[0]``); asked only for shapes of several runs."""
    sizes = [1001]
    monkeypatch.setattr(Slurm, "max_array_size", lambda self: sizes[0])
    return sizes


def test_runs_of_one_shape_are_one_array_others_their_own(tmp_path, max_array_size):
    """lr and steps do not change the request; gpus does; a container's work directory is its run's."""
    runs = grid("gpus=1,2", "train.lr=1e-3,2e-3")  # the grid's order: (1, 1e-3), (1, 2e-3), (2, 1e-3), (2, 2e-3)
    roots = [tmp_path] * len(runs)
    assert submit.arrays(runs, roots, "sweep-x") == [[0, 1], [2, 3]]
    assert submit.arrays(runs, [tmp_path, tmp_path / "other", tmp_path, tmp_path], "sweep-x") == [[0], [1], [2, 3]]
    boxed = grid("gpus=1", "train.lr=1e-3,2e-3", "cluster.container.image=img.sqsh")
    assert submit.arrays(boxed, [tmp_path] * 2, "sweep-x") == [[0], [1]]
    parallel = grid("gpus=1", "train.lr=1e-3,2e-3", "sweep.parallel=1,2")  # an odd grid, but each keeps its own
    assert submit.arrays(parallel, [tmp_path] * 4, "sweep-x") == [[0, 2], [1, 3]]


def test_an_array_is_cut_at_max_array_size_and_none_is_made_where_arrays_are_off(tmp_path, max_array_size):
    runs = grid("train.lr=1e-3,2e-3,3e-3,4e-3,5e-3")
    max_array_size[0] = 2
    assert submit.arrays(runs, [tmp_path] * 5, "sweep-x") == [[0, 1], [2, 3], [4]]
    max_array_size[0] = 0  # MaxArraySize=0: the cluster takes no arrays
    assert submit.arrays(runs, [tmp_path] * 5, "sweep-x") == [[0], [1], [2], [3], [4]]


def test_a_four_point_grid_is_one_sbatch_and_four_runs_named_by_their_elements(tmp_path, monkeypatch, max_array_size):
    """The launch with sbatch answered here: one script, four run directories, each with its own record
    (``77_i``), pickled task, frozen code and sbatch.sh, listed as one sweep."""
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home"))
    scripts = []
    watchers = []  # the array's one watcher: sbatch with flags (launcher/job/submission.py watch_array)
    monkeypatch.setattr(Slurm, "sbatch", lambda self, path, flags=(): (watchers.append(list(flags)) or "78") if flags
                        else (scripts.append(Path(path).read_text()) or "77"))
    monkeypatch.setattr(submit, "check_cluster", lambda runs: [None] * len(runs))
    runs = grid("train.lr=1e-3,2e-3,3e-3,4e-3")
    launched = submit.launch(runs, sweep=True)
    assert len(scripts) == 1 and "#SBATCH --array=0-3%4" in scripts[0]
    assert len(watchers) == 1 and "--dependency=afternotok:77" in watchers[0]
    assert [rec.job_id for rec in launched.records] == ["77_0", "77_1", "77_2", "77_3"]
    assert {rec.sweep for rec in launched.records} == {launched.sweep_id}
    for index, rec in enumerate(launched.records):
        run_dir = Path(rec.run_dir)
        assert json.loads((run_dir / "run.json").read_text())["job_id"] == f"77_{index}"
        assert (run_dir / "submitit" / "task.pkl").is_file()
        assert (run_dir / "code" / "launcher" / "job" / "entry.py").is_file()
        assert (run_dir / "sbatch.sh").read_text() == scripts[0]
        assert "RUN_DIRS=(" in scripts[0] and str(run_dir) in scripts[0]
        (watching,) = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()
                       if json.loads(line)["event"] == "watching"]
        assert (watching["job_id"], watching["watcher"]) == (f"77_{index}", "78")
    sweep_dir = tmp_path / "runs" / ".sweeps" / launched.sweep_id
    assert (sweep_dir / "77_submission.sh").read_text() == scripts[0]
    assert sorted(p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")) == \
        sorted(Path(rec.run_dir).name for rec in launched.records)


def test_a_refused_array_leaves_no_run_directory(tmp_path, monkeypatch, max_array_size):
    from launcher.errors import LaunchError
    from launcher.slurm.output import SlurmError

    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "runs"))
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home"))

    def refuse(self, path):
        raise SlurmError("Invalid job array specification")

    monkeypatch.setattr(Slurm, "sbatch", refuse)
    monkeypatch.setattr(submit, "check_cluster", lambda runs: [None] * len(runs))
    with pytest.raises(LaunchError, match="Invalid job array specification"):
        submit.launch(grid("train.lr=1e-3,2e-3"), sweep=True)
    assert [p.name for p in (tmp_path / "runs").iterdir() if p.name != ".index"] == [".sweeps"]
    assert list((tmp_path / "runs" / ".sweeps").iterdir()) == []


def test_a_sweeps_dry_run_shows_each_shape_as_the_one_array_script_it_submits(capsys, tmp_path, monkeypatch):
    """What the dry run prints is what the launch submits: one array script per resource shape, after the plans
    of its runs, with their directories in order; a container run is a job of its own, as it is submitted."""
    from launcher import cli

    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path))
    assert cli.main(["-m", "gpus=1,2", "model=gpt_tiny", "train.lr=1e-3,2e-3", "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash") == 2 and out.count("\n#SBATCH --array=0-1") == 2 and out.count("# run ") == 4
    array_lines = [line for line in out.splitlines() if line.startswith("RUN_DIRS=(")]
    assert array_lines == [f"RUN_DIRS=({tmp_path}/gpt-tiny-{g}g {tmp_path}/gpt-tiny-{g}g) "
                           "&& RUN_DIR=${RUN_DIRS[$SLURM_ARRAY_TASK_ID]}" for g in (1, 2)]
    assert out.index("# run gpt-tiny-1g") < out.index("# sbatch script of one job array for gpt-tiny-1g, gpt-tiny-1g")
    assert cli.main(["-m", "gpus=1", "model=gpt_tiny", "train.lr=1e-3,2e-3", "cluster.container.image=/x.sqsh",
                     "dry_run=true"]) == 0
    out = capsys.readouterr().out
    assert out.count("#!/bin/bash") == 2 and "#SBATCH --array" not in out
