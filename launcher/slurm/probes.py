"""What the batch script's recovery steps ask Slurm about their own job and its nodes (launcher/job/recovery.py,
launcher/job/requeue.py).

Every question is asked of one client, :data:`JOB_SLURM`: the job's own cluster (Slurm's default configuration,
which the job's environment names) with a short timeout. Each has an answer for when Slurm cannot say: the
steps run while a node dies or the controller restarts, and a question left unanswered must neither blame a
node nor keep the attempt's end from being recorded (``[]``: no node is blamed without evidence; ``""``: the
state is not known). Two questions raise instead, where the caller decides what no answer means: a job's state
for the run's claim (launcher/job/claim.py), and how a job whose batch step died ended (:func:`job_end`).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, TypeVar

from launcher.slurm.client import Slurm
from launcher.slurm.output import JobRow, SlurmError, unusable

T = TypeVar("T")
ASK_TIMEOUT_S = 15  # a batch script's step waits on each question at most this long
JOB_SLURM = Slurm(None, timeout=ASK_TIMEOUT_S)


def _or(ask: Callable[[], T], otherwise: T) -> T:
    """Slurm's answer, or ``otherwise`` when Slurm cannot give one."""
    try:
        return ask()
    except SlurmError:
        return otherwise


def queue_state(job_id: str) -> str:
    """Slurm's state of this job (its own job id, an array element's too) in its queue ("" where the queue
    cannot be asked)."""
    return next((row.state for row in _or(JOB_SLURM.squeue, []) if row.unique_id == job_id), "")


def job_state(job_id: str) -> str:
    """Slurm's state of one job while the controller remembers it ("" once it does not); SlurmError when Slurm
    cannot say."""
    return JOB_SLURM.job_state(job_id)


def held_down(nodelist: Optional[str]) -> List[str]:
    """The nodes of a node list that Slurm now holds down, drained or not responding."""
    if not nodelist:
        return []
    states = _or(lambda: JOB_SLURM.node_states(nodelist), {})
    return sorted(node for node, state in states.items() if unusable(state))


def held_reasons(nodes: Sequence[str]) -> Optional[Dict[str, str]]:
    """Of these nodes, those Slurm holds unusable, with its state and reason (``drained: trial``); None when there
    are none or Slurm cannot say."""
    if not nodes:
        return None
    return _or(lambda: JOB_SLURM.node_reasons(",".join(nodes)), {}) or None


def unanswering(job_id: str, nodelist: str) -> List[str]:
    """The job's nodes where Slurm can no longer start a task (launcher/slurm/client.py probes them)."""
    return _or(lambda: JOB_SLURM.unanswering(job_id, nodelist), [])


def partition_nodes(partition: Optional[str]) -> List[str]:
    """Every node of a partition (the default one where none is named), up or down; [] when Slurm cannot say."""
    nodes = _or(JOB_SLURM.nodes, [])
    return sorted({n.name for n in nodes if (n.partition == partition if partition else n.default)})


def kill_wait_s() -> Optional[int]:
    """Slurm's KillWait in seconds (None where Slurm cannot say: launcher/core/preemption.py)."""
    return _or(JOB_SLURM.kill_wait_s, None)


def slurmd_timeout_s() -> int:
    """How long the controller waits before it marks a silent node down (0 when Slurm cannot say)."""
    return _or(JOB_SLURM.slurmd_timeout_s, 0)


def job_end(job_id: str) -> Optional[JobRow]:
    """How a job ended: sacct's account (None: sacct has no such job), else, without accounting, a row of squeue's
    state while the controller remembers the job ("" after); SlurmError when neither answers."""
    try:
        return JOB_SLURM.job_end(job_id)
    except SlurmError:
        return JobRow(job_id, JOB_SLURM.job_state(job_id), "", "", "")
