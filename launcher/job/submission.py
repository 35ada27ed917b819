"""Submit a composed run's directory as one Slurm job: the first time (a launch) and again (automatic recovery,
``launcher resume``). It reads only the run's own files and the Slurm adapter, never the composer or the CLI,
so that the batch script's recovery step (launcher/job/recovery.py) resubmits without loading Hydra.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from launcher.core.config import RunConfig, load_run_config
from launcher.core.plan import Plan, read_plan
from launcher.core.privacy import run_umask
from launcher.core.rundir import CONFIG, RECORD, code_dir, write_json_atomic
from launcher.errors import LaunchError
from launcher.status.index import RunRecord, load_or_damage
from launcher.slurm.client import for_cluster

# A file of this layout's task entry in a run's frozen code: a run frozen before the launcher's packages
# were laid out by concern (launcher/entry.py) cannot be submitted by this launcher (see frozen_layout_problem).
ENTRY = Path("launcher") / "job" / "entry.py"


def submit_job(cfg: RunConfig, plan: Plan, run_dir: Path, exclude: Sequence[str] = (), begin_s: int = 0) -> str:
    """Submit the run in ``run_dir`` as one Slurm job (submitit pickles the task), eligible ``begin_s`` from now;
    returns its job id."""
    from launcher.job.entry import TrainTask
    from launcher.job.secret_store import secrets_dir
    from launcher.slurm.batch import executor_params, task_python

    with run_umask(cfg.share_group):  # submitit's files, and the job (sbatch hands the umask to it)
        executor = for_cluster(cfg.cluster).executor(run_dir / "submitit", cfg.cluster.max_requeues,
                                                     task_python(cfg.cluster))
        executor.update_parameters(**executor_params(cfg, plan, run_dir.name, run_dir, exclude,
                                                     mounts=[str(secrets_dir())], begin_s=begin_s))
        return executor.submit(TrainTask(), str(run_dir)).job_id


def submit_array(cfg: RunConfig, plan: Plan, job_name: str, run_dirs: Sequence[Path], folder: Path) -> str:
    """Submit the runs in ``run_dirs``, whose request is ``cfg``'s, as one Slurm job array (one sbatch): element
    ``i`` runs ``run_dirs[i]`` (launcher/slurm/batch.py array_script), its pickled task in that run's submitit folder
    under its element's name, as submitit names an element's (``123_4_submitted.pkl``), so that every element is its
    run's job as :func:`submit_job` would submit it; a retry of one is a job of its own (:func:`resubmit`). The
    script is kept in ``folder`` as ``ARRAY_submission.sh``. Returns the array's job id."""
    import secrets

    from submitit.core.utils import DelayedSubmission

    from launcher.job.entry import TrainTask
    from launcher.job.secret_store import secrets_dir
    from launcher.slurm.batch import array_script

    with run_umask(cfg.share_group):
        for run_dir in run_dirs:
            (run_dir / "submitit").mkdir(exist_ok=True)  # where the element's batch shell writes from its first line
        script = folder / f".submission_{secrets.token_hex(8)}.sh"
        script.write_text(array_script(cfg, plan, job_name, run_dirs, folder, mounts=[str(secrets_dir())]))
        slurm = for_cluster(cfg.cluster)
        try:
            array_id = slurm.sbatch(script)
        except BaseException:
            script.unlink()
            with contextlib.suppress(OSError):
                folder.rmdir()  # the sweep's folder, unless another array of it is there
            raise
        try:
            script.rename(folder / f"{array_id}_submission.sh")
            # After sbatch, as submitit does for its arrays: an element that starts first waits for its pickle.
            for index, run_dir in enumerate(run_dirs):
                task = DelayedSubmission(TrainTask(), str(run_dir))
                task.set_timeout(cfg.cluster.time_limit_min, cfg.cluster.max_requeues)
                task.dump(run_dir / "submitit" / f"{array_id}_{index}_submitted.pkl")
        except BaseException:
            slurm.cancel(array_id)  # no element may start without its task
            raise
    return array_id


def frozen_layout_problem(run_dir: Path) -> str | None:
    """Why this launcher cannot submit the run again, or None. Its batch script runs ``launcher.job.recovery``
    and its pickled task is ``launcher.job.entry.TrainTask``, both imported from the run's frozen code; a
    run frozen by a launcher before 0.2 has them as ``launcher.recovery`` and ``launcher.entry``."""
    frozen = code_dir(run_dir)
    if not frozen.is_dir() or (frozen / ENTRY).is_file():
        return None
    return (f"run {Path(run_dir).name} was frozen by an older launcher (its code has no {ENTRY.as_posix()}), which "
            f"this one cannot resubmit; resume it from a checkout of the commit in {frozen}/source.json, or launch "
            f"it anew with: launcher -f {Path(run_dir)}/run.yaml")


def resubmit(run_dir: Path, exclude: Sequence[str] = (), begin_s: int = 0) -> str:
    """Submit the run in ``run_dir`` again, as it was composed, as a new job that resumes from its newest good
    checkpoint (automatic recovery, ``launcher resume``) with the code frozen at its first submission; the
    record follows the new job. Returns its id; LaunchError when the frozen code is of an older layout."""
    problem = frozen_layout_problem(run_dir)
    if problem:
        raise LaunchError(problem)
    cfg, plan = load_run_config(run_dir / CONFIG), read_plan(run_dir)
    job_id = submit_job(cfg, plan, run_dir, exclude, begin_s)
    record = load_or_damage(run_dir)
    if isinstance(record, RunRecord):
        record.job_id = job_id
        write_json_atomic(run_dir / RECORD, asdict(record))
    return job_id
