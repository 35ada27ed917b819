"""A run resumed on another number of GPUs (``launcher resume RUN gpus=N``): the same run, composed again from its
run file with the new count and its global batch kept (a fixed micro-batch made to fit each GPU's new share),
so that every step reads the global batch it would have read (launcher/train/data.py ``StepSampler``: a step's
samples do not depend on how the ranks split them) and the checkpoint, which DCP reshards, goes on. A run moved to
another cluster (launcher/service/move.py) is composed again the same way. The new layout passes every check a
launch makes (the partition, the account and QOS, the memory each GPU needs:
launcher/submit/checks.py) before the run's config.yaml, plan.json, run.yaml and record are rewritten for it;
nothing is written when one refuses it.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Tuple

from launcher.compose.composer import ComposedRun, compose_runs
from launcher.compose.overrides import check_given_once
from launcher.compose.runfile import merge, read_run_file
from launcher.core.config import load_run_config
from launcher.core.plan import Plan, read_plan
from launcher.core.rundir import CONFIG, RECORD, write_json_atomic
from launcher.core.run_index import RunRecord
from launcher.errors import LaunchError
from launcher.slurm.client import slurm_conf_for
from launcher.submit.checks import judge
from launcher.submit.submitter import write_run_files

USAGE = "a new number of GPUs, gpus=N (the run's global batch is kept)"


def gpus_asked(overrides: List[str]) -> int:
    """The GPU count of ``launcher resume``'s overrides: exactly one, ``gpus=N``; LaunchError otherwise."""
    if len(overrides) != 1 or not overrides[0].startswith("gpus="):
        given = " ".join(overrides)
        raise LaunchError(f"resume takes {USAGE}, nothing else; got '{given}'")
    value = overrides[0].removeprefix("gpus=")
    if not value.isdigit() or int(value) < 1:
        raise LaunchError(f"gpus={value} is not a number of GPUs; resume takes {USAGE}")
    return int(value)


def relayout(rec: RunRecord, gpus: int) -> Tuple[str, List[str]]:
    """Rewrite the run of ``rec`` for ``gpus`` GPUs, checked as a launch is; the change in words ("2 GPUs (1 x 2)
    to 4 GPUs (1 x 4)") and the checks' warnings. LaunchError, with nothing written, when the global batch does not
    divide or a check refuses the layout."""
    run_dir = Path(rec.run_dir)
    before = read_plan(run_dir)
    if before.global_batch % gpus:
        fits = ", ".join(str(n) for n in range(1, before.global_batch + 1) if before.global_batch % n == 0)
        raise LaunchError(f"gpus={gpus} cannot train {rec.name}'s global batch of {before.global_batch} sequences, "
                          f"which a resume keeps (one share a GPU): use gpus= one of {fits}")
    kept = [f"gpus={gpus}", f"train.global_batch={before.global_batch}", *micro_batch(run_dir, before, gpus)]
    run, warnings = recompose(merge(read_run_file(run_dir / "run.yaml"), kept))
    rewrite(rec, run)
    return f"{shape(before)} to {shape(run.plan)}", warnings


def recompose(overrides: List[str]) -> Tuple[ComposedRun, List[str]]:
    """The one run ``overrides`` (a run file's, changed) compose, checked as a launch is, and the checks' warnings;
    LaunchError when a check refuses it. Nothing is written: a move checks its target before it cancels a job."""
    check_given_once(overrides)
    runs = compose_runs(overrides)
    verdict = judge(runs)
    if verdict.refusals:
        raise verdict.error(runs)
    return runs[0], verdict.lines(runs, verdict.warnings)


def rewrite(rec: RunRecord, run: ComposedRun) -> None:
    """Rewrite the run of ``rec`` as ``run``: its config.yaml, plan.json and run.yaml, and its record's layout and
    cluster (where its next job is asked about)."""
    write_run_files(run, Path(rec.run_dir))
    plan, cluster = run.plan, run.config.cluster
    rec.gpus, rec.nodes, rec.gpus_per_node = plan.gpus, plan.nodes, plan.gpus_per_node
    rec.cluster, rec.slurm_conf = cluster.name, slurm_conf_for(cluster.name, cluster.slurm_conf)
    write_json_atomic(Path(rec.run_dir) / RECORD, rec.to_json())


def micro_batch(run_dir: Path, before: Plan, gpus: int) -> List[str]:
    """The override that keeps a fixed micro-batch within each GPU's new share of the global batch: the largest
    that divides the share and is no larger than the run's (the memory it was planned for); none where the run's
    still divides it, or where the run finds its own (``train.micro_batch=auto``)."""
    share = before.global_batch // gpus
    if load_run_config(run_dir / CONFIG).train.micro_batch == "auto" or share % before.micro_batch == 0:
        return []
    return [f"train.micro_batch={max(d for d in range(1, min(share, before.micro_batch) + 1) if share % d == 0)}"]


def shape(plan: Plan) -> str:
    return f"{plan.gpus} GPU{'s' * (plan.gpus != 1)} ({plan.nodes} x {plan.gpus_per_node})"
