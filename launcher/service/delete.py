"""Deleting runs, for ``launcher delete`` and the console's Delete: cancel their jobs if active, then remove their
directories. The runs are chosen first (:func:`chosen`), so that the CLI can ask before :func:`delete` removes
anything."""
from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Sequence

from launcher.core.run_index import RunRecord
from launcher.errors import LaunchError
from launcher.job.secret_store import run_credentials, secrets_dir
from launcher.job.submission import watcher_of
from launcher.service.stop import cancel
from launcher.slurm.client import Slurm, SlurmError
from launcher.views.lookup import changeable, chosen_runs


@dataclass
class Deleted:
    """The runs removed, and those whose directory a process still writes into (not all removed)."""

    removed: List[str]
    failed: List[str]

    def lines(self) -> List[str]:
        return [f"Deleted {name}." for name in self.removed]

    def check(self) -> None:
        """LaunchError in one line when some run could not be removed."""
        if self.failed:
            raise LaunchError(f"could not remove all of {', '.join(self.failed)}: a process still writes there")


def chosen(roots: Sequence[Path], names: Sequence[str], sweep: Optional[str]) -> Sequence[RunRecord]:
    """The runs ``names`` (or every run of ``sweep``), once no other user could change their run roots."""
    return changeable(chosen_runs(roots, list(names), sweep))


def delete(records: Sequence[RunRecord]) -> Deleted:
    """Cancel the runs' watchers and active jobs, wait for them to end, and remove the runs' directories and the
    object store's credentials their launch kept."""
    for rec in records:  # first: once its job ends, a watcher would write into the directory being removed
        watcher = watcher_of(Path(rec.run_dir))
        if watcher:
            try:
                Slurm(rec.slurm_conf).cancel(watcher)
            except SlurmError:
                pass  # it ended already: it ran, or Slurm dropped it when the job completed
    cancel(records)
    # A job stopped before may still be saving or in its last step, and a job array's watcher (not cancelled: it
    # also watches the elements not deleted) may be judging an element.
    ended({conf: {str(job) for rec in records if rec.slurm_conf == conf
                  for job in (rec.job_id, watcher_of(Path(rec.run_dir), arrays=True)) if job}
           for conf in {rec.slurm_conf for rec in records}})
    failed = [rec.name for rec in records if not remove(Path(rec.run_dir))]
    for rec in records:
        if rec.name not in failed:
            # the object store's credentials its launch kept for it (launcher/core/store.py), if any
            run_credentials(secrets_dir(), Path(rec.run_dir)).unlink(missing_ok=True)
    return Deleted([rec.name for rec in records if rec.name not in failed], failed)


def ended(jobs: dict, timeout_s: float = 60.0) -> None:
    """Wait (at most ``timeout_s``) until Slurm no longer runs the ``jobs`` ({slurm.conf: job ids}): a rank still
    saving, the batch script's last step or a watcher would otherwise write into the run directory while it is
    removed."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            live = {row.job_id for conf in jobs for row in Slurm(conf).squeue()
                    if row.job_id in jobs[conf] and row.state in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")}
        except SlurmError:
            return  # the controller does not answer: nothing more to wait for here
        if not live:
            return
        time.sleep(0.5)


def remove(run_dir: Path) -> bool:
    """Remove the run's directory; False when some of it is still there. It is renamed aside first (one atomic
    step, within its root): a late writer (a watcher's judgement, an end step's event) then finds no run directory
    instead of recreating a file in one half removed, which ``runs`` would list as a damaged run."""
    aside = run_dir.with_name(f".deleting-{run_dir.name}-{secrets.token_hex(4)}")  # dot: no listing shows it
    try:
        os.rename(run_dir, aside)
    except FileNotFoundError:
        return True
    except OSError:
        aside = run_dir  # a root one cannot rename in: remove in place
    for _ in range(3):
        shutil.rmtree(aside, ignore_errors=True)  # follows no symlink inside: rmtree.avoids_symlink_attacks
        if not aside.exists():
            return True
        time.sleep(0.5)
    return False

