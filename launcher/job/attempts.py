"""A run as a sequence of attempts, and the cause of an attempt's end in the user's words.

An attempt is one start of the run's Slurm job: the first submission, or a requeue of it (preemption, time
limit, automatic recovery). When ranks fail, most of them fail *because* another one did: a SIGKILLed rank
leaves no trace of its own while its peers report gloo's "Connection reset by peer". So the cause is chosen
from all the evidence an attempt leaves, in this order:

0. a ``preflight_failed`` event (a node failed its checks before training);
1. a ``stalled`` event (the watchdog named the frozen ranks);
2. a ``failed`` event whose error is the rank's own, not a lost peer (the earliest such);
3. srun's report of the first task that died (``srun: error: NODE: task N: Killed``), for a rank that left
   no error of its own: it was killed by a signal or exited;
4. a peer-loss error, when nothing better is known; else srun's exit status.

Everything here is pure (evidence in, words out), so the teardown step of the batch script and the tests share
it. The event log read as attempts (which is this one, the attempts table) is launcher/status/attempt_log.py.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, List, Optional

# What a rank reports when it lost a peer rather than failed itself (gloo, NCCL, torch.distributed).
PEER_LOSS = re.compile(r"connection reset by peer|connection closed by peer|broken pipe|remote process exited|"
                       r"socket.*closed|Connection refused|DistNetworkError|peer|NCCL communicator was aborted",
                       re.IGNORECASE)
# The short words of a failure of the tasks' environment, not of the run: the tasks' Python has no torch (the
# cluster's environment lacks the [train] extra). launcher/job/entry.py records it; recovery does not retry it.
NO_TORCH = "no torch"
# srun's line for a task that ended badly: "srun: error: node2: task 2: Killed",
# "srun: error: node1: tasks 0-1: Exited with exit code 1".
SRUN_TASK = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,-]+): (?P<how>.+)$")


@dataclass(frozen=True)
class TaskEnd:
    """One srun report of tasks that ended badly."""

    node: str
    ranks: List[int]
    how: str  # "Killed", "Exited with exit code 1", "Segmentation fault", ...


@dataclass(frozen=True)
class Cause:
    """Why an attempt ended: the outcome word, the rank and node to blame, the step, and one line."""

    outcome: str  # FAILED, STALLED or PREFLIGHT
    text: str
    rank: Optional[int] = None
    node: Optional[str] = None
    step: Optional[int] = None
    short: str = ""  # a word or two for `runs`: "rank 2 killed", "stalled", "OSError"
    error: str = ""  # the rank's own exception ("OSError: ..."), where the cause is one


def expand_ranks(text: str) -> List[int]:
    """``0-1,3`` as [0, 1, 3]."""
    ranks: List[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        ranks += list(range(int(first), int(last or first) + 1))
    return ranks


def srun_task_ends(stderr: str) -> List[TaskEnd]:
    """srun's reports of tasks that ended badly, in the order srun printed them (first failure first)."""
    ends = []
    for line in stderr.splitlines():
        match = SRUN_TASK.search(line.strip())
        if match:
            ends.append(TaskEnd(match["node"], expand_ranks(match["tasks"]), match["how"].strip()))
    return ends


def is_peer_loss(error: str) -> bool:
    return bool(PEER_LOSS.search(error))


def attribute(events: List[dict], task_ends: List[TaskEnd], steps: Dict[int, int],
              exit_code: Optional[int] = None) -> Cause:
    """The cause of an attempt's end from its events (this attempt's only), srun's reports and each rank's
    last known step (heartbeats)."""
    for event in events:
        if event.get("event") == "preflight_failed":
            node = event.get("node")
            return Cause("PREFLIGHT", f"node {node} failed its preflight check: {event.get('problem')}",
                         rank=_int(event.get("rank")), node=node, short=f"{node} failed preflight")
    for event in events:
        if event.get("event") == "stalled":
            ranks, nodes = event.get("ranks") or [], event.get("nodes") or []
            return Cause("STALLED", f"stalled: {event.get('cause', 'no step advanced')}",
                         rank=ranks[0] if ranks else None, node=nodes[0] if nodes else None, step=event.get("step"),
                         short=f"rank {ranks[0]} hung" if ranks else "hung")
    failures = [e for e in events if e.get("event") == "failed"]
    own = [e for e in failures if not is_peer_loss(str(e.get("error", "")))]
    if own:
        first = min(own, key=lambda e: e.get("time", 0))
        rank = _int(first.get("rank"))
        error = str(first.get("error", "unknown error"))
        return Cause("FAILED", _where(rank, first.get("node"), first.get("step")) + error, rank=rank,
                     node=first.get("node"), step=first.get("step"), short=first.get("short") or error.split(":")[0],
                     error=error)
    reported = {_int(e.get("rank")) for e in failures}
    for end in task_ends:
        silent = [r for r in end.ranks if r not in reported]
        if silent:
            rank = silent[0]
            how = "killed by a signal (SIGKILL)" if end.how == "Killed" else end.how.lower()
            return Cause("FAILED", _where(rank, end.node, steps.get(rank)) + how, rank=rank, node=end.node,
                         step=steps.get(rank), short=f"rank {rank} {'killed' if end.how == 'Killed' else 'died'}")
    if failures:
        first = min(failures, key=lambda e: e.get("time", 0))
        rank = _int(first.get("rank"))
        return Cause("FAILED", _where(rank, first.get("node"), first.get("step")) + str(first.get("error")),
                     rank=rank, node=first.get("node"), step=first.get("step"), short="lost a peer")
    return Cause("FAILED", f"srun exited with status {exit_code}" if exit_code else "ended without a record",
                 short=f"exit {exit_code}" if exit_code else "no record")


def _where(rank: Optional[int], node: Optional[str], step: Optional[int]) -> str:
    parts = [f"rank {rank}" if rank is not None else "", f"on {node}" if node else "",
             f"at step {step}" if step is not None else ""]
    text = " ".join(p for p in parts if p)
    return f"{text}: " if text else ""


def _int(value: object) -> Optional[int]:
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None

