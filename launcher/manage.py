"""``launcher stop`` and ``launcher delete``: cancel runs' jobs, and remove runs."""
from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import List

from launcher.cmdline import Parser, chosen_runs, root_of
from launcher.errors import LaunchError
from launcher.runs import RunRecord, append_event
from launcher.slurm import SlurmError, run, use_cluster
from launcher.state import job_states


def cancel(records: List[RunRecord]) -> List[RunRecord]:
    """scancel the active jobs among ``records``; returns the runs that were cancelled."""
    states = job_states(records)
    active = [rec for rec in records if states[rec.name].active]
    for rec in active:
        use_cluster(rec.cluster, rec.slurm_conf)
        try:
            run(["scancel", str(rec.job_id)])
        except SlurmError as err:
            raise LaunchError(f"could not cancel {rec.name} (job {rec.job_id}): {err}") from None
    return active


def run_args(parser: Parser) -> None:
    parser.add_argument("names", nargs="*", metavar="RUN", help="run names (or unique prefixes)")
    parser.add_argument("--sweep", help="every run of this sweep id")


def stop(argv: List[str]) -> int:
    parser = Parser("stop", "Cancel runs' Slurm jobs; their directories (logs, checkpoints) stay.")
    run_args(parser)
    args = parser.parse_args(argv)
    records = chosen_runs(root_of(args), args.names, args.sweep)
    stopped = cancel(records)
    for rec in records:
        if rec in stopped:
            append_event(Path(rec.run_dir), "cancelled", job_id=rec.job_id)
            print(f"Stopped {rec.name} (job {rec.job_id}).")
        else:
            print(f"{rec.name} (job {rec.job_id}) is not active; nothing to stop.")
    return 0


def delete(argv: List[str]) -> int:
    parser = Parser("delete", "Cancel runs' jobs if active, then remove their directories.")
    run_args(parser)
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    args = parser.parse_args(argv)
    records = chosen_runs(root_of(args), args.names, args.sweep)
    names = ", ".join(rec.name for rec in records)
    if not args.yes:
        if not sys.stdin.isatty():
            raise LaunchError(f"delete {names}: confirm with --yes (no terminal to ask on)")
        if input(f"Delete {len(records)} run(s): {names}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Nothing deleted.")
            return 1
    cancel(records)
    for rec in records:
        shutil.rmtree(rec.run_dir, ignore_errors=True)
        print(f"Deleted {rec.name}.")
    return 0
