"""``launcher delete``: cancel runs' jobs if active, then remove their directories."""
from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

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
    ended([rec for rec in records if rec.job_id])  # a job stopped before may still be saving or in its last step
    for rec in records:
        shutil.rmtree(rec.run_dir, ignore_errors=True)  # follows no symlink inside: rmtree.avoids_symlink_attacks
        print(f"Deleted {rec.name}.")
    return 0


def ended(records: list, timeout_s: float = 60.0) -> None:
    """Wait (at most ``timeout_s``) until Slurm no longer runs the cancelled jobs: a rank still saving, or the
    batch script's last step, would otherwise write into the run directory again after it is removed."""
    wanted = {str(rec.job_id) for rec in records}
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            live = {row.job_id for conf in {rec.slurm_conf for rec in records} for row in Slurm(conf).squeue()
                    if row.state in ("RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")}
        except SlurmError:
            return  # the controller does not answer: nothing more to wait for here
        if not wanted & live:
            return
        time.sleep(0.5)

