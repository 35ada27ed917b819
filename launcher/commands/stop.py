"""``launcher stop``: cancel runs' jobs; their directories (logs, checkpoints) stay."""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import List

from launcher.commands.common import changeable, chosen_runs, roots_of
from launcher.errors import LaunchError
from launcher.core.rundir import append_event
from launcher.status.index import RunRecord
from launcher.slurm.client import Slurm, SlurmError
from launcher.status.job_state import job_states


def cancel(records: List[RunRecord]) -> List[RunRecord]:
    """scancel the active jobs among ``records``; returns the runs that were cancelled."""
    states = job_states(records)
    active = [rec for rec in records if states[rec.name].active]
    for rec in active:
        try:
            Slurm(rec.slurm_conf).cancel(str(rec.job_id))
        except SlurmError as err:
            raise LaunchError(f"could not cancel {rec.name} (job {rec.job_id}): {err}") from None
    return active


def run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="RUN", help="run names (or unique prefixes)")
    parser.add_argument("--sweep", help="every run of this sweep id")


def configure(parser: argparse.ArgumentParser) -> None:
    run_args(parser)


def main(args: argparse.Namespace) -> int:
    records = changeable(chosen_runs(roots_of(args), args.names, args.sweep))
    stopped = cancel(records)
    for rec in records:
        if rec in stopped:
            append_event(Path(rec.run_dir), "cancelled", job_id=rec.job_id)
            print(f"Stopped {rec.name} (job {rec.job_id}).")
        else:
            print(f"{rec.name} (job {rec.job_id}) is not active; nothing to stop.")
    return 0
