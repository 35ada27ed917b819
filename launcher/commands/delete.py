"""``launcher delete``: cancel runs' jobs if active, then remove their directories."""
from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

from launcher.job.secret_store import run_credentials, secrets_dir
from launcher.job.submission import watcher_of
from launcher.slurm.client import Slurm, SlurmError
from launcher.views.lookup import changeable, chosen_runs, roots_of
from launcher.commands.stop import cancel, run_args
from launcher.errors import LaunchError


def configure(parser: argparse.ArgumentParser) -> None:
    run_args(parser)
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def main(args: argparse.Namespace) -> int:
    records = changeable(chosen_runs(roots_of(args), args.names, args.sweep))
    names = ", ".join(rec.name for rec in records)
    if not args.yes:
        if not sys.stdin.isatty():
            raise LaunchError(f"delete {names}: confirm with --yes (no terminal to ask on)")
        if input(f"Delete {len(records)} run(s): {names}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Nothing deleted.")
            return 1
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
            print(f"Deleted {rec.name}.")
    if failed:
        raise LaunchError(f"could not remove all of {', '.join(failed)}: a process still writes there")
    return 0


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

