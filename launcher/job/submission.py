"""Submit a composed run's directory as one Slurm job: the first time (a launch) and again (automatic recovery,
with :func:`submit_retry`'s backoff, and ``launcher resume``). It reads only the run's own files and the Slurm
adapter, never the composer or the CLI, so that the batch script's recovery step (launcher/job/recovery.py)
resubmits without loading Hydra.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional, Sequence

from launcher.core.config import RunConfig, load_run_config
from launcher.core.plan import Plan, read_plan
from launcher.core.privacy import RunWriter
from launcher.core.events import Watching
from launcher.core.attempt_log import AttemptLog
from launcher.core.rundir import CONFIG, RECORD, append_event, code_dir, read_events, write_json_atomic
from launcher.errors import LaunchError
from launcher.job import claim, task
from launcher.core.run_index import RunRecord, load_or_damage
from launcher.job.secret_store import secrets_dir
from launcher.slurm.batch import render_sbatch, watcher
from launcher.slurm.client import for_cluster
from launcher.slurm.output import SlurmError

# The modules a job of this launcher runs from the run's frozen code: the pickled task (entry), what every task runs
# (task), the batch script's steps (recovery, comment). A run frozen when one of them was elsewhere cannot be
# submitted by this launcher.
ENTRY_POINTS = tuple(Path("launcher") / "job" / name for name in ("entry.py", "recovery.py", "comment.py", "task.py"))
SUBMIT_BACKOFF_S = (2, 4, 8, 16, 30, 60, 60, 60, 60)  # about five minutes of asking a silent controller


def submit_job(cfg: RunConfig, plan: Plan, run_dir: Path, exclude: Sequence[str] = (), begin_s: int = 0,
               by: str = "launch", holder: Optional[str] = None, taken: Optional[claim.Claim] = None) -> str:
    """Submit the run in ``run_dir`` as one Slurm job (launcher/job/task.py), eligible ``begin_s`` from now, under
    the run's claim (launcher/job/claim.py: ClaimHeld when another job of the run is alive), taken for ``by``
    (``holder``: the job submitting its own retry), or ``taken`` already (a move's); returns its job id. The claim,
    the task's pickle, the script and the job are the run's files (:class:`RunWriter`; sbatch hands the umask to the
    job)."""
    slurm = for_cluster(cfg.cluster)
    with RunWriter(cfg.share_group):
        taken = claim.take(run_dir, by, slurm.job_state, holder) if taken is None else taken
        try:
            script = render_sbatch(cfg, plan, run_dir.name, run_dir / "submitit", [str(secrets_dir())], exclude,
                                   begin_s)
            job_id = task.submit(slurm, script, run_dir / "submitit", [run_dir])
        except BaseException:
            claim.drop(run_dir, taken)
            raise
        claim.name(run_dir, taken, job_id)
        return job_id


def watch(run_dir: Path, job_id: str) -> None:
    """Submit the job that judges job ``job_id``'s attempt should its batch step die before its end step
    (launcher/slurm/batch.py ``watcher``), and record it, or why Slurm refused it (the run goes on unwatched:
    such an attempt is then judged when the run is next resumed). Called once the submission is recorded."""
    _watch(load_run_config(run_dir / CONFIG), [(run_dir, job_id)], job_id, run_dir.name,
           run_dir / "submitit" / f"watch_{job_id}.sh")


def watch_array(run_dirs: Sequence[Path], array_id: str, folder: Path) -> None:
    """:func:`watch` for a job array's elements (element ``i`` runs ``run_dirs[i]``): one watcher for the whole
    array, which Slurm starts once every element has ended and one did not complete; each element's run records
    it. An element whose batch step died is judged then, not at once (docs/recovery.md)."""
    cfg = load_run_config(run_dirs[0] / CONFIG)  # one request for every element (launcher/submit/array.py)
    _watch(cfg, [(run_dir, f"{array_id}_{index}") for index, run_dir in enumerate(run_dirs)], array_id, folder.name,
           folder / f"watch_{array_id}.sh")


def _watch(cfg: RunConfig, watched: Sequence[tuple], after: str, name: str, path: Path) -> None:
    script, flags = watcher(cfg, watched, after, name, path.with_name("watch_%j.log"))
    with RunWriter(cfg.share_group):  # the script, and the watcher's log (sbatch hands the umask to it)
        try:
            path.write_text(script)
            found = Watching(watcher=for_cluster(cfg.cluster).sbatch(path, flags))
        except (SlurmError, OSError) as err:
            found = Watching(refused=str(err))
    for run_dir, job_id in watched:
        append_event(run_dir, Watching(job_id=job_id, watcher=found.watcher, refused=found.refused))


def watcher_of(run_dir: Path, arrays: bool = False) -> Optional[str]:
    """The job watching the run's newest job (see :func:`watch`) and no other run's, or None; with ``arrays``, a
    job array's watcher too, which watches every element (:func:`watch_array`) and passes over a run that is gone,
    so that it is waited for rather than cancelled."""
    newest = AttemptLog(read_events(run_dir)).watching()
    return newest.watcher if newest and (arrays or "_" not in (newest.job_id or "")) else None


def frozen_layout_problem(run_dir: Path) -> str | None:
    """Why this launcher cannot submit the run again, or None. Its batch script runs ``launcher.job.recovery``,
    ``launcher.job.comment`` and ``launcher.job.task``, and its pickled task is ``launcher.job.entry.TrainTask``, all
    imported from the run's frozen code (:data:`ENTRY_POINTS`): a run frozen before one of them moved or existed
    cannot run this launcher's batch script."""
    frozen = code_dir(run_dir)
    missing = [path for path in ENTRY_POINTS if not (frozen / path).is_file()]
    if not frozen.is_dir() or not missing:
        return None
    return (f"run {Path(run_dir).name} was frozen by an older launcher (its code has no {missing[0].as_posix()}), "
            f"which this one cannot resubmit; resume it from a checkout of the commit in {frozen}/source.json, or "
            f"launch it anew with: launcher -f {Path(run_dir)}/run.yaml")


def resubmit(run_dir: Path, exclude: Sequence[str] = (), begin_s: int = 0, by: str = "resume",
             holder: Optional[str] = None, taken: Optional[claim.Claim] = None) -> str:
    """Submit the run in ``run_dir`` again, as it was composed, as a new job that resumes from its newest good
    checkpoint (automatic recovery, ``launcher resume``) with the code frozen at its first submission; the
    record follows the new job. Returns its id; LaunchError when the frozen code is of an older layout, ClaimHeld
    when another job of the run is alive (``holder``: the job retrying itself, whose own claim it takes over;
    ``taken``: the claim a move took)."""
    problem = frozen_layout_problem(run_dir)
    if problem:
        raise LaunchError(problem)
    cfg, plan = load_run_config(run_dir / CONFIG), read_plan(run_dir)
    job_id = submit_job(cfg, plan, run_dir, exclude, begin_s, by=by, holder=holder, taken=taken)
    record = load_or_damage(run_dir)
    if isinstance(record, RunRecord):
        record.job_id = job_id
        write_json_atomic(run_dir / RECORD, record.to_json())
    return job_id


class RetryRefused(Exception):
    """The retry's job could not be submitted (sbatch refused it, the controller never answered, the run
    directory could not be written); the message is one line."""


def submit_retry(run_dir: Path, exclude: Sequence[str], begin_s: int = 0, holder: Optional[str] = None) -> str:
    """Submit the retry's job (:func:`resubmit`), asking a controller that does not answer again with backoff; its
    job id, or RetryRefused with the reason. ``holder``: the failed attempt's job, which holds the run's claim."""
    delays = list(SUBMIT_BACKOFF_S)
    while True:
        try:
            return resubmit(run_dir, exclude=exclude, begin_s=begin_s, by="retry", holder=holder)
        except SlurmError as err:
            if not err.transient:
                raise RetryRefused(f"Slurm refused it: {err}") from None
            if not delays:
                raise RetryRefused(f"Slurm did not answer for {sum(SUBMIT_BACKOFF_S)} s: {err}") from None
        except LaunchError as err:
            raise RetryRefused(str(err)) from None
        except OSError as err:
            raise RetryRefused(f"{err.strerror or err}: {err.filename or run_dir}") from None
        time.sleep(delays.pop(0))
