"""A run's Slurm job, made and run the launcher's own way: its task pickled into the run's submitit folder, its batch
script (launcher/slurm/batch.py) submitted with sbatch, and on every Slurm task ``python -m launcher.job.task FOLDER``
(:func:`main`), which runs the pickled task.

Why not submitit's executor: its public API (``SlurmExecutor.submit`` and ``batch``) cannot say what a run's job
needs. It runs sbatch with this process's environment, where the launcher runs it with the cluster's
(launcher/slurm/client.py ``Slurm.env``: its slurm.conf, neither an array element's variables nor the object store's
credentials), and refuses to start on a host without srun; and its job array keeps every element's pickle and
output in the executor's one folder, where an element of a sweep's array is its own run's job, with its files in
that run's folder. Reaching into its internals instead (its submission hooks, its pickle names, its
``submitit.core._submit`` runner) breaks silently when a release renames them. So the script and the pickle are
written here under names of the launcher's own (``task.pkl``; the script kept as ``JOB_submission.sh``, an array's
as ``ARRAY_submission.sh`` in the sweep's folder), a single run and a job array alike, each pickle before sbatch so
that no task waits for one. Of submitit the job uses only what it makes public: ``SlurmJobEnvironment`` reads
Slurm's variables in the tasks (launcher/train/dist.py).
"""
from __future__ import annotations

import functools
import pickle
import secrets
import signal
import sys
from pathlib import Path
from typing import Sequence

from launcher.core import preemption
from launcher.job import stage
from launcher.job.entry import TrainTask
from launcher.slurm.client import Slurm

TASK = "task.pkl"  # in the run's submitit folder


def submit(slurm: Slurm, script: str, folder: Path, run_dirs: Sequence[Path]) -> str:
    """Submit ``script`` (a run's job, or a job array whose element ``i`` runs ``run_dirs[i]``), each run's task
    pickled first; the script is kept in ``folder`` as ``JOB_submission.sh``. Returns the job id. Called inside the
    run's :class:`launcher.core.privacy.RunWriter`, whose umask the files and the job take."""
    for run_dir in run_dirs:
        write_task(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f".submission_{secrets.token_hex(8)}.sh"
    path.write_text(script)
    try:
        job_id = slurm.sbatch(path)
    except BaseException:
        path.unlink()
        raise
    path.rename(folder / f"{job_id}_submission.sh")
    return job_id


def write_task(run_dir: Path) -> None:
    """Pickle the run's task into its submitit folder: ``TrainTask`` (the secrets store's path fixed here) called
    with the run directory, as every job of the run runs it. No task of the run reads it meanwhile: another job of
    the run is not alive (launcher/job/claim.py), or it is the one submitting its own retry from its end step."""
    folder = Path(run_dir) / "submitit"
    folder.mkdir(exist_ok=True)  # where the job's tasks and batch shell write their output
    (folder / TASK).write_bytes(pickle.dumps(functools.partial(TrainTask(), str(run_dir))))


def main(argv: Sequence[str]) -> None:
    """Run the task pickled in the submitit folder ``argv[0]`` on this Slurm task. Slurm's warning of the time limit
    is heard from this first line on (launcher/core/preemption.py), and a SIGTERM before training begins is logged
    and otherwise left to Slurm's SIGKILL, as by submitit's runner; training then listens for both itself
    (launcher/train/interrupt.py). An error ends the task with its traceback and exit status 1."""
    preemption.listen()
    signal.signal(signal.SIGTERM, _before_training)
    stage.remember_sources(getattr(__spec__.loader, "archive", None))  # where the job staged the run's code
    (folder,) = argv
    with open(Path(folder) / TASK, "rb") as f:
        task = pickle.load(f)
    task()


def _before_training(signum: int, frame: object) -> None:
    print(f"launcher: signal {signal.Signals(signum).name} before training began: left to Slurm's SIGKILL",
          file=sys.stderr, flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
