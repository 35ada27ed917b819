"""``launcher resume RUN [gpus=N]``: continue a failed, stopped or finished-early run from its newest good
checkpoint.

The run keeps its directory, config and name; it goes on as a new attempt, a new Slurm job submitted exactly
as the run was composed (launcher.job.submission.resubmit, the same path automatic recovery takes). Training picks
the newest checkpoint whose files check out (launcher/train/checkpoint.py), so its losses go on as if never stopped.
With ``gpus=N`` it goes on on N GPUs, its global batch kept (launcher/submit/relayout.py).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from launcher.job.submission import resubmit, watch
from launcher.slurm.client import SlurmError
from launcher.views.lookup import changeable, lookup, roots_of
from launcher.core.checkpoints import latest_checkpoint, step_of
from launcher.core.events import Resubmitted
from launcher.core.metrics import FinalRow
from launcher.core.rundir import append_event, last_metrics
from launcher.errors import LaunchError
from launcher.status.job_state import job_states


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix)")
    parser.add_argument("layout", nargs="*", metavar="gpus=N",
                        help="go on on N GPUs: the global batch is kept, so every step reads the batch it would have")


def main(args: argparse.Namespace) -> int:
    (rec,) = changeable([lookup(roots_of(args), args.name)])
    run_dir = Path(rec.run_dir)
    state = job_states([rec])[rec.name]
    if state.active:
        raise LaunchError(f"{rec.name} is {state.state} (job {rec.job_id}); nothing to resume "
                          f"(stop it first to restart it)")
    final = last_metrics(run_dir)
    if isinstance(final, FinalRow) and final.step >= rec.steps:
        raise LaunchError(f"{rec.name} already trained all {rec.steps} steps; nothing to resume")
    newest = latest_checkpoint(run_dir)
    layout = None
    if args.layout:
        from launcher.commands.launch import warn  # lazy: the launch's imports, only for a new layout
        from launcher.job.secret_store import secrets_dir, store_secrets  # lazy: only a new layout checks data
        from launcher.submit.relayout import gpus_asked, relayout  # lazy: keeps hydra out of start-up

        store_secrets(secrets_dir())  # a bucket's data is checked again, with the credentials its tasks will have
        layout, warnings = relayout(rec, gpus_asked(args.layout))
        warn(warnings)
    try:
        job_id = resubmit(run_dir)
    except SlurmError as err:
        raise LaunchError(f"could not resubmit {rec.name}: {err}") from None
    append_event(run_dir, Resubmitted(job_id=job_id, previous_job_id=rec.job_id, by="user", layout=layout))
    watch(run_dir, job_id)
    start = f"from its checkpoint of step {step_of(newest)}" if newest else "from the start (it has no checkpoint)"
    on = f" on {layout}" if layout else ""
    print(f"Resumed {rec.name} as Slurm job {job_id}{on}, {start}; it was {state.state}.")
    return 0
