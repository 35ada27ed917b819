"""A sweep's runs submitted from the login node as one Slurm job array (one sbatch for the whole grid).

Only a launch does this; a job's retry (launcher/job/submission.py) submits one run as a job of its own. Both are
submitted the same way (launcher/job/task.py).
"""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Sequence

from launcher.core.config import RunConfig
from launcher.core.plan import Plan
from launcher.job import task
from launcher.job.secret_store import secrets_dir
from launcher.slurm.batch import array_script
from launcher.slurm.client import for_cluster


def submit_array(cfg: RunConfig, plan: Plan, job_name: str, run_dirs: Sequence[Path], folder: Path) -> str:
    """Submit the runs in ``run_dirs``, whose request is ``cfg``'s, as one Slurm job array (one sbatch): element
    ``i`` runs ``run_dirs[i]`` (launcher/slurm/batch.py array_script), its pickled task in that run's submitit folder
    as :func:`submit_job` pickles a run's, so that every element is its run's job as :func:`submit_job` would submit
    it; a retry of one is a job of its own (:func:`resubmit`). The script is kept in ``folder`` as
    ``ARRAY_submission.sh``. Called inside the runs' :class:`RunWriter` (launcher/submit/submitter.py). Returns the
    array's job id."""
    script = array_script(cfg, plan, job_name, run_dirs, folder, mounts=[str(secrets_dir())])
    try:
        return task.submit(for_cluster(cfg.cluster), script, folder, run_dirs)
    except BaseException:
        with contextlib.suppress(OSError):
            folder.rmdir()  # the sweep's folder, unless another array of it is there
        raise
