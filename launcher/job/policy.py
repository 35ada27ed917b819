"""Recovery's policy: whether a failed attempt is retried, which nodes the retry avoids, and which of them are
allowed again when avoiding them all would leave too few nodes.

Everything here is pure: the run's record (read through launcher/core/attempt_log.py), the attempt's cause
(launcher/job/attempts.py) and what Slurm answered (nodes held down, the partition's nodes, asked by
launcher/slurm/probes.py) in, a :class:`Decision` out; the batch script's end step (launcher/job/recovery.py)
gathers the inputs and acts on the decision. It lives in job/ rather than core/ because it weighs a
:class:`~launcher.job.attempts.Cause` and only the job's recovery steps decide: the ranks (launcher/train/,
which may import only core) never do. The design is in docs/recovery.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Dict, List, Optional, Sequence, Tuple

from launcher.core.attempt_log import AttemptLog
from launcher.core.events import Event, Fault, Outcome
from launcher.job.attempts import Cause

# Whether an attempt that ended with a failure of this kind is retried, and why. A node's own fault (NODE_LOST,
# NODE_UNFIT) is also free the first time that node is blamed (decide()).
POLICY: Dict[Fault, Tuple[bool, str]] = {
    Fault.CODE: (False, "an error of the code's own, not retried"),
    Fault.DATA: (False, "the data is damaged: every node and try would read it alike, not retried"),
    Fault.NO_TORCH: (False, "the tasks' Python has no torch: the same on every node and every try, not retried"),
    Fault.DISK_FULL: (True, "a full disk: retried once, when the run root has room for a checkpoint again"),
    Fault.STORE: (True, "the object store did not answer: retried, no node blamed"),
    Fault.INFRASTRUCTURE: (True, "an I/O, network, device or collective error may pass on another try or node"),
    Fault.PEER_LOST: (True, "a rank lost its peers and no other cause was found"),
    Fault.KILLED: (True, "a rank killed by a signal (often out of memory) may pass on another try"),
    Fault.DIED: (True, "a rank that died without an error of its own may pass on another try"),
    Fault.HUNG: (True, "a hung rank: retried without its node"),
    Fault.NODE_LOST: (True, "a lost node: retried without it"),
    Fault.NODE_UNFIT: (True, "a node that failed its preflight: retried without it"),
    Fault.BATCH_DIED: (True, "the job's batch step died (its host's OOM killer, a killed slurmstepd): retried"),
    Fault.UNKNOWN: (True, "no cause was recorded: retried"),
}
# The outcomes that blame a node: the next attempt avoids it.
BLAMING = (Outcome.STALLED, Outcome.LOST, Outcome.PREFLIGHT)
# A node's own fault: the first time a node is blamed for one, its retry is free.
NODE_FAULTS = (Outcome.LOST, Outcome.PREFLIGHT)


class Certainty(IntEnum):
    """How sure the run is that an excluded node is to blame, least sure first: a hung process may have hung on a
    healthy node; a node that failed its preflight may pass the next; one Slurm holds down is avoided by Slurm
    anyway; a node found lost is the surest."""

    STALLED = 0
    PREFLIGHT = 1
    DOWN = 2
    LOST = 3


# The certainty an attempt's end gives the nodes it blamed.
CERTAINTY = {Outcome.STALLED: Certainty.STALLED, Outcome.PREFLIGHT: Certainty.PREFLIGHT, Outcome.LOST: Certainty.LOST}


@dataclass(frozen=True)
class Decision:
    retry: bool
    reason: str
    exclude: List[str] = field(default_factory=list)
    free: bool = False  # the node's fault (lost, failed its preflight): the retry is not counted in max_retries
    allowed: List[str] = field(default_factory=list)  # exclusions dropped so that the retry can be scheduled
    begin_s: int = 0  # the retry is eligible only this long from now (a lost node allowed again: see schedulable)


COMPLETED = Decision(False, "the run completed")


def schedulable(decision: Decision, events: Sequence[Event], held: Sequence[str], partition: Sequence[str],
                needed: int, settle_s: int = 0) -> Decision:
    """The decision with exclusions allowed again, least certain first, when excluding them all would leave
    fewer nodes in the partition than the run needs (sbatch would refuse the retry). A node allowed again that
    Slurm holds down (``held``) is still not used by Slurm: the retry then waits in the queue for nodes to come back. A
    lost node Slurm does not hold down yet would get the retry at once: the retry then begins ``settle_s`` (the
    cluster's SlurmdTimeout) from now, when Slurm has marked it down and waits for it like the others."""
    if not partition:
        return decision
    why: Dict[str, Certainty] = {}
    for node, outcome in AttemptLog(events).blames(*CERTAINTY):
        why[node] = max(why.get(node, Certainty.STALLED), CERTAINTY[outcome])
    why.update({node: max(why.get(node, Certainty.DOWN), Certainty.DOWN) for node in held})
    kept = sorted(decision.exclude, key=lambda node: why.get(node, Certainty.STALLED))
    allowed: List[str] = []
    while kept and len(set(partition) - set(kept)) < needed:
        allowed.append(kept.pop(0))
    if not allowed:
        return decision
    left = len(set(partition) - set(decision.exclude))
    reason = (f"{decision.reason}; excluding {', '.join(decision.exclude)} would leave {left} of the {needed} nodes "
              f"the run needs, so {', '.join(allowed)} {'is' if len(allowed) == 1 else 'are'} allowed again "
              "(least certain first)")
    unmarked = [node for node in allowed if why.get(node) is Certainty.LOST and node not in held]
    begin_s = settle_s + 5 if unmarked and settle_s else 0
    if begin_s:
        reason += f"; it begins in {begin_s} s, once Slurm has marked {', '.join(unmarked)} down (SlurmdTimeout)"
    return Decision(True, reason, sorted(kept), decision.free, allowed, begin_s)


def decide(events: Sequence[Event], cause: Cause, max_retries: int, held: Sequence[str] = (),
           progressed: bool = True, trained: bool = True, room: Optional[bool] = None) -> Decision:
    """Retry or not, and which nodes the next attempt must avoid (``events`` hold every attempt so far,
    the ending one's ``attempt_ended`` not yet among them).

    Retried: what may pass on another try or another node (a rank killed by a signal, a hang, a lost node,
    I/O, network and device errors). The next attempt avoids the nodes of a hung rank, of a lost node and every
    node Slurm holds down or drained (``held``); a rank killed by a signal (often the kernel's out-of-memory
    killer) does not make its node suspect. A node's own fault (lost, or failed its preflight) costs the run no
    retry the first time that node is blamed. Not retried: tasks whose Python has no torch, an error of the
    code's own (any other exception), a failure before the first step of the first attempt (but the object store's:
    it may answer later), the same error at
    the same step in two attempts that each trained (``trained``: this one did), or a run whose
    ``cluster.max_retries`` are spent. ``progressed``: the run has trained a step (metrics or heartbeats). A full
    disk is the file system's fault, never a node's: retried once (since the user last resumed the run), and only
    when the run directory has room for a checkpoint again (``room``; None: it could not be measured)."""
    log = AttemptLog(events)
    excluded = log.excluded()
    blamed = set(cause.nodes or ([cause.node] if cause.node else [])) if cause.outcome in BLAMING else set()
    if cause.outcome in NODE_FAULTS and not blamed & {node for node, _ in log.blames(*NODE_FAULTS)}:
        what = "was lost" if cause.outcome is Outcome.LOST else "failed its preflight check"
        return Decision(True, f"{', '.join(sorted(blamed))} {what}: retried without it, not counted as a retry",
                        sorted(excluded | blamed | set(held)), free=True)
    retried, why = POLICY[cause.fault]
    if not retried and cause.fault != Fault.CODE:  # the same on every node and try, whenever it happens
        return Decision(False, why)
    if cause.fault is Fault.DISK_FULL:
        full = disk_full_refusal(log, room)
        if full:
            return Decision(False, full)
    elif not log.ended() and not progressed and cause.outcome not in NODE_FAULTS \
            and cause.fault is not Fault.STORE:  # a store that did not answer is no sign of a bad run
        return Decision(False, "it failed before its first step: a problem of the code, config or data, not retried")
    if not retried:
        return Decision(False, why)
    ended = [e for e in log.ended(Outcome.FAILED, Outcome.STALLED) if e.trained is not False]
    if trained and ended and cause.repeats(ended[-1]):
        return Decision(False, f"the same failure at step {cause.step} twice, not retried again")
    retries = log.retries()
    if retries >= max_retries:
        return Decision(False, f"all cluster.max_retries={max_retries} retries spent")
    return Decision(True, f"retry {retries + 1} of {max_retries} from the newest good checkpoint",
                    sorted(excluded | blamed | set(held)))


def disk_full_refusal(log: AttemptLog, room: Optional[bool]) -> Optional[str]:
    """Why an attempt that found the disk full is not retried (None: it is): the disk was full in an attempt before
    it since the user last resumed the run (its one retry spent), or it has no room for a checkpoint now."""
    again = "; free space there, then launcher resume the run"
    if any(e.fault is Fault.DISK_FULL for e in log.since_resumed().ended()):
        return f"the disk was full again after its retry: not retried again{again}"
    if room is False:
        return f"the disk is still full: not retried{again}"
    return None
