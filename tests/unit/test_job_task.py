"""A run's job made and run the launcher's own way (launcher/job/task.py): its task pickled into the run's submitit
folder before sbatch, the script kept as ``JOB_submission.sh``, and ``python -m launcher.job.task FOLDER`` on every
task running the pickled call, Slurm's warning heard from its first line. Without a cluster: sbatch is answered
here (a job array's submission: test_job_arrays.py)."""
from __future__ import annotations

import functools
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import REPO

from launcher.compose.composer import compose_runs
from launcher.job.entry import TrainTask
from launcher.job.secret_store import secrets_dir
from launcher.job.submission import frozen_layout_problem, submit_job
from launcher.job.task import TASK
from launcher.slurm.batch import render_sbatch
from launcher.slurm.client import Slurm
from launcher.slurm.output import SlurmError
from launcher.submit.freeze import freeze


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(Slurm, "job_state", lambda self, job_id: "")
    (composed,) = compose_runs(["train.steps=3"])
    (tmp_path / "r").mkdir()
    return composed


def scripts_in(folder: Path) -> list:
    return sorted(path.name for path in folder.iterdir() if path.suffix == ".sh")


def test_a_runs_job_is_its_pickled_task_and_the_script_sbatch_got(run, tmp_path, monkeypatch):
    submitted = []
    monkeypatch.setattr(Slurm, "sbatch", lambda self, path, flags=(): submitted.append(Path(path).read_text()) or "42")
    run_dir = tmp_path / "r"
    assert submit_job(run.config, run.plan, run_dir, exclude=["gpu-3"], begin_s=30) == "42"
    script = render_sbatch(run.config, run.plan, "r", run_dir / "submitit", [str(secrets_dir())], ["gpu-3"], 30)
    assert submitted == [script] and (run_dir / "submitit" / "42_submission.sh").read_text() == script
    assert scripts_in(run_dir / "submitit") == ["42_submission.sh"]
    task = pickle.loads((run_dir / "submitit" / TASK).read_bytes())
    assert isinstance(task.func, TrainTask) and task.args == (str(run_dir),)
    assert task.func.secrets_store == str(tmp_path / "home" / "secrets")


def test_a_refused_submission_keeps_no_script(run, tmp_path, monkeypatch):
    def refuse(self, path, flags=()):
        raise SlurmError("sbatch: error: Invalid partition name specified")

    monkeypatch.setattr(Slurm, "sbatch", refuse)
    with pytest.raises(SlurmError, match="Invalid partition"):
        submit_job(run.config, run.plan, tmp_path / "r")
    assert scripts_in(tmp_path / "r" / "submitit") == []


def run_task(folder: Path, call) -> subprocess.CompletedProcess:
    """``python -m launcher.job.task FOLDER`` with ``call`` pickled as the task, as srun runs it."""
    folder.mkdir(exist_ok=True)
    (folder / TASK).write_bytes(pickle.dumps(call))
    return subprocess.run([sys.executable, "-u", "-m", "launcher.job.task", str(folder)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_every_task_runs_the_pickled_call_and_ends_with_its_error(tmp_path):
    done = run_task(tmp_path / "submitit", functools.partial(Path.write_text, tmp_path / "ran", "yes"))
    assert done.returncode == 0 and (tmp_path / "ran").read_text() == "yes", done.stderr
    failed = run_task(tmp_path / "submitit", functools.partial(int, "not a number"))
    assert failed.returncode == 1
    assert failed.stderr.rstrip().endswith("ValueError: invalid literal for int() with base 10: 'not a number'")


def test_slurms_signals_before_training_are_heard_not_fatal(tmp_path):
    """Slurm's warning (USR2) is kept for training's first step boundary (launcher/core/preemption.py); its SIGTERM
    is said in the task's stderr and left to its SIGKILL."""
    warned = run_task(tmp_path / "submitit", functools.partial(signal.raise_signal, signal.SIGUSR2))
    assert warned.returncode == 0, warned.stderr
    ended = run_task(tmp_path / "submitit", functools.partial(signal.raise_signal, signal.SIGTERM))
    assert ended.returncode == 0 and "launcher: signal SIGTERM before training began" in ended.stderr


def test_a_run_frozen_before_the_launchers_own_entry_point_is_named(tmp_path):
    freeze(tmp_path / "old")
    (tmp_path / "old" / "code" / "launcher" / "job" / "task.py").unlink()
    assert frozen_layout_problem(tmp_path / "old").startswith(
        "run old was frozen by an older launcher (its code has no launcher/job/task.py)")
