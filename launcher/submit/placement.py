"""Where a run would start first (``cluster=auto``): one cluster asked, on its own side, and the candidates ranked.

A cluster is asked what a launch there would meet: the same checks a launch of one cluster makes
(launcher/submit/checks.py ``judge``: limits, accounts, QOS, the tasks' Python, the memory fit), then Slurm itself,
with the very script the launch would submit, when it would start the job (``sbatch --test-only``: nothing is
queued). The answer is a :class:`Candidate`, the same record whether the cluster is this machine's or is asked over
SSH (launcher/remote/agent.py ``place``), so ranking (:func:`best_first`) and the words shown never differ.
launcher/service/auto.py asks every candidate at once and chooses.
"""
from __future__ import annotations

import math
import os
import tempfile
import time
from dataclasses import dataclass
from typing import List, Optional, Sequence

from launcher.compose.composer import ComposedRun
from launcher.core.run_index import base_name
from launcher.forecast.learned import corrected_step
from launcher.forecast.target import hardware_for, precision_of
from launcher.slurm.client import Slurm, SlurmError, for_cluster
from launcher.slurm.fit import explain_rejection
from launcher.slurm.output import TestOnly
from launcher.status.pending import eligible
from launcher.status.usage import usage
from launcher.submit.checks import judge
from launcher.submit.submitter import scripts

NOW_S = 60  # a start Slurm expects within this is "now"
TIE_S = 60  # starts within the same minute tie: the faster cluster (the plan's step time) wins


@dataclass(frozen=True)
class Candidate:
    """One cluster as ``cluster=auto`` found it: when Slurm expects the run to start there (epoch seconds), or why
    it cannot run there; the line's words after the cluster's name; the plan's step time on its GPUs, as corrected by
    the cluster's completed runs (None where the GPU's speed is not known)."""

    cluster: str
    start: Optional[float] = None  # None: it cannot run there (``words`` say why)
    words: str = ""  # "starts now (16 GPUs free)", "refused: ...", "unreachable: ..."
    step_s: Optional[float] = None

    @property
    def line(self) -> str:
        """The line shown for it: its name, a colon, its words."""
        return f"{self.cluster}: {self.words}"


def cannot(cluster: str, why: str) -> Candidate:
    """A cluster the run cannot go to, and why (``refused: ...``, ``unreachable: ...``)."""
    return Candidate(cluster, words=why)


def best_first(candidates: Sequence[Candidate], now: Optional[float] = None) -> List[Candidate]:
    """The candidates that can run it, soonest start first (starts within :data:`TIE_S` of each other tie, and the
    lower step time wins; an unknown step time loses), then those that cannot, each group in the order given."""
    now = time.time() if now is None else now

    def key(candidate: Candidate) -> tuple:
        if candidate.start is None:
            return (1, 0, math.inf)
        wait = max(0.0, candidate.start - now)
        return (0, int(wait // TIE_S), candidate.step_s if candidate.step_s is not None else math.inf)

    return sorted(candidates, key=key)


ASK_TIMEOUT_S = 30.0  # each candidate's answer, from its first question to Slurm's test-only
REMOTE_MARGIN_S = 5.0  # of that, what a cluster over SSH leaves for the connection: its agent's own answer comes first


def ask_here(run: ComposedRun, timeout: float = ASK_TIMEOUT_S) -> Candidate:
    """Ask this side's Slurm (the run's cluster, not reached over SSH) when the run would start: unreachable, refused
    by a check a launch makes, refused by Slurm, or its expected start in words."""
    cluster = run.config.cluster
    slurm = for_cluster(cluster)
    why = slurm.unreachable()
    if why:
        return cannot(cluster.name, f"unreachable: {why}")
    verdict = judge([run])
    if verdict.refusals:
        return cannot(cluster.name, f"refused: {verdict.refusals[0].text}")
    step = step_time(run)
    try:
        answer = test_only(run, slurm, timeout)
    except SlurmError as err:
        if err.transient:  # the controller did not answer in time: no refusal of the run's
            return cannot(cluster.name, f"unreachable: {err}")
        return cannot(cluster.name, f"refused: {explain_rejection(str(err), run.plan, cluster, None)}")
    return Candidate(cluster.name, answer.start, start_words(slurm, answer.start, answer.partition), step)


def step_time(run: ComposedRun) -> Optional[float]:
    """The plan's step time on the cluster's GPUs, corrected by the cluster's similar completed runs where it has
    some (launcher/forecast/learned.py); None where the GPU's speed is not known."""
    hw = hardware_for(run.config.cluster, precision_of(run.config), query_slurm=True)
    return corrected_step(run.config, run.plan, hw).corrected


def test_only(run: ComposedRun, slurm: Slurm, timeout: float) -> TestOnly:
    """``sbatch --test-only`` of the script a launch of ``run`` would submit (launcher/submit/submitter.py
    ``scripts``), written to a private temporary file of its own (created exclusively) and removed after."""
    name = run.config.name or base_name(run.plan.model, run.plan.gpus)
    text = scripts([run], [name], sweep=False)[0].text
    fd, path = tempfile.mkstemp(prefix="launcher-test-only-", suffix=".sh")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        return slurm.test_only(path, timeout)  # type: ignore[arg-type]
    finally:
        os.unlink(path)


def start_words(slurm: Slurm, start: float, partition: str, now: Optional[float] = None) -> str:
    """``starts now (16 GPUs free)``, ``starts in about 3 h (behind 4 jobs waiting on partition 'gpu')`` or ``starts
    in about 25 min (16 of its 16 GPUs in use)``: the queue and the partition's GPUs asked only as far as the words
    need them (one sinfo, and one squeue for a start that is not now); where Slurm does not answer, fewer words."""
    wait = max(0.0, start - (time.time() if now is None else now))
    try:
        parts = [p for p in usage(slurm.nodes(timeout=5)) if p.name == partition]
        if wait < NOW_S:
            return f"starts now ({parts[0].gpus_free} GPUs free)" if parts else "starts now"
        ahead = [r for r in slurm.squeue() if eligible(r) and r.partition == partition]
    except SlurmError:
        return "starts now" if wait < NOW_S else f"starts in about {in_about(wait)}"
    if ahead:
        why = f"behind {len(ahead)} job{'s' if len(ahead) > 1 else ''} waiting on partition '{partition}'"
    else:
        why = (f"{parts[0].gpus_total - parts[0].gpus_free} of its {parts[0].gpus_total} GPUs in use" if parts
               else f"partition '{partition}' is busy")
    return f"starts in about {in_about(wait)} ({why})"


def in_about(seconds: float) -> str:
    """A wait in round words: ``2 min``, ``25 min``, ``3 h``, ``2 days``."""
    minutes = max(1, round(seconds / 60))
    if minutes < 60:
        return f"{minutes} min"
    hours = round(seconds / 3600)
    return f"{hours} h" if hours < 48 else f"{round(seconds / 86400)} days"
