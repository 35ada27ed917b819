"""A sweep's runs submitted from the login node as one Slurm job array (one sbatch for the whole grid).

Only a launch does this; a job's retry (launcher/job/submission.py) submits one run as a job of its own.
"""
from __future__ import annotations

import contextlib
import secrets
from pathlib import Path
from typing import Sequence

from submitit.core.utils import DelayedSubmission

from launcher.core.config import RunConfig
from launcher.core.plan import Plan
from launcher.job.entry import TrainTask
from launcher.job.secret_store import secrets_dir
from launcher.slurm.batch import array_script
from launcher.slurm.client import for_cluster


def submit_array(cfg: RunConfig, plan: Plan, job_name: str, run_dirs: Sequence[Path], folder: Path) -> str:
    """Submit the runs in ``run_dirs``, whose request is ``cfg``'s, as one Slurm job array (one sbatch): element
    ``i`` runs ``run_dirs[i]`` (launcher/slurm/batch.py array_script), its pickled task in that run's submitit folder
    under its element's name, as submitit names an element's (``123_4_submitted.pkl``), so that every element is its
    run's job as :func:`submit_job` would submit it; a retry of one is a job of its own (:func:`resubmit`). The
    script is kept in ``folder`` as ``ARRAY_submission.sh``. Called inside the runs' :class:`RunFiles`
    (launcher/submit/submitter.py). Returns the array's job id."""
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
