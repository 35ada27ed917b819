"""Why a job waits, in plain words and with what to do, from Slurm's pending reason (``squeue``'s ``%r``).

Slurm names a pending job's reason with a code (``Resources``, ``QOSMaxGRESPerUser``, ``ReqNodeNotAvail, ...``)
that means nothing to most of its users. A listing already holds one ``squeue`` of the whole cluster; with it
(the user's other jobs, the jobs ahead in the partition) and, only when a job waits for resources, one ``sinfo``
per cluster (how many of the partition's GPUs are in use), each code becomes a sentence: what the job waits for,
until when where Slurm has an expected start, and what would change it. A code not known here is shown as
Slurm's, marked so.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from launcher.slurm.output import JobRow, Node, start_epoch

# Codes that need the partition's GPUs in use to be told (one sinfo per cluster, asked only for them).
NEEDS_NODES = ("Resources",)
# Codes of a pending job that Slurm does not consider for a start yet, so it stands ahead of no other job: a job
# held, one waiting for its begin time, and one waiting for others to end (the launcher's 0-GPU watcher of each
# run among them: it waits, afternotok, for the run's job).
NOT_ELIGIBLE = ("Dependency", "BeginTime", "JobHeldUser", "JobHeldAdmin")
# A limit's name in a code, in words: QOSMaxGRESPerUser is the QOS's per-user limit on GRES.
_WHOSE = {"QOS": "your QOS (cluster.qos)", "Assoc": "your account (cluster.account)"}
_WHAT = {"GRES": "GPUs", "Cpu": "CPUs", "Node": "nodes", "Mem": "memory", "Jobs": "jobs", "SubmitJob": "jobs",
         "Billing": "billing units", "Wall": "run time", "Energy": "energy"}


@dataclass(frozen=True)
class Queue:
    """What one cluster says about the jobs around a pending one: its whole queue (one squeue), and its nodes
    (one sinfo) asked only when a reason needs them."""

    rows: Sequence[JobRow]
    nodes: Callable[[], Optional[List[Node]]] = lambda: None

    def others_of(self, row: JobRow) -> List[JobRow]:
        """The same user's other jobs that run now."""
        return [r for r in self.rows if r.user == row.user and r.job_id != row.job_id and r.state == "RUNNING"]

    def ahead_of(self, row: JobRow) -> List[JobRow]:
        """The pending jobs of the same partition that Slurm ranks before this one and would start first: not those
        it does not consider yet (:func:`eligible`)."""
        return [r for r in self.rows if eligible(r) and r.partition == row.partition
                and r.job_id != row.job_id and r.priority > row.priority]


def eligible(row: JobRow) -> bool:
    """A pending job that Slurm considers for a start, so one that can stand ahead of another: not one whose
    reason is of :data:`NOT_ELIGIBLE`."""
    return row.state == "PENDING" and row.reason.partition(",")[0].strip() not in NOT_ELIGIBLE


def in_words(row: JobRow, queue: Queue, now: Optional[float] = None) -> str:
    """A pending job's reason as a sentence, and when Slurm expects it to start where it says."""
    text = _explain(row, queue)
    start = expected_start(row.start, time.time() if now is None else now)
    return f"{text}; Slurm expects it to start {start}" if start else text


def expected_start(start: str, now: float) -> str:
    """Slurm's expected start of a pending job (its StartTime) as ``at 14:05`` or ``on 2026-12-04 at 09:00``;
    "" where Slurm has not planned the job (launcher/slurm/output.py :func:`start_epoch`)."""
    stamp = start_epoch(start, now)
    if stamp is None:
        return ""
    when = time.localtime(stamp)
    return time.strftime("at %H:%M" if when[:3] == time.localtime(now)[:3] else "on %Y-%m-%d at %H:%M", when)


def _gpus(rows: Sequence[JobRow]) -> int:
    return sum(r.gpus for r in rows)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _explain(row: JobRow, queue: Queue) -> str:
    if row.reason in ("", "None", "(null)"):  # just submitted: the scheduler has not looked at it yet
        return "waiting: Slurm gives no reason yet"  # no parentheses: `runs` shows a reason inside its own
    code, _, detail = (part.strip() for part in row.reason.partition(","))
    fixed = _FIXED.get(code)
    if fixed:
        return fixed.format(job=row.job_id, partition=row.partition, detail=detail)
    if code == "Resources":
        return _resources(row, queue)
    if code == "Priority":
        ahead = queue.ahead_of(row)
        return (f"behind {_plural(len(ahead), 'job')} of higher priority on partition '{row.partition}'"
                if ahead else f"behind jobs of higher priority on partition '{row.partition}'")
    if code.startswith(("QOS", "Assoc")):
        return _limit(code, row, queue) or f"{code} (Slurm's reason)"
    return f"{row.reason} (Slurm's reason)"


def _resources(row: JobRow, queue: Queue) -> str:
    wanted = f"{_plural(row.gpus, 'GPU')}" if row.gpus else "its nodes"
    nodes = [n for n in queue.nodes() or [] if n.partition == row.partition]
    if not nodes or not row.gpus:
        return f"waiting for {wanted} on partition '{row.partition}' to come free"
    used, total = sum(n.gpus_used for n in nodes), sum(n.gpus for n in nodes)
    return (f"waiting for {wanted} on partition '{row.partition}': {used} of its {total} are in use; it starts "
            "when other jobs end (fewer GPUs, or another partition, may start sooner)")


def _limit(code: str, row: JobRow, queue: Queue) -> Optional[str]:
    """A QOS or association limit: per job (it can never start as asked), per user (it waits for the user's own
    jobs) or shared (it waits for the account's or QOS's jobs, the user's and others'); None for one not known."""
    whose = _WHOSE["QOS" if code.startswith("QOS") else "Assoc"]
    body = code[3:] if code.startswith("QOS") else code[5:]
    what = next((words for key, words in _WHAT.items() if key in body), "resources")
    if body.startswith("Min"):
        return (f"asks for fewer {what} than {whose} requires of one job: it can never start as asked; stop it and "
                f"launch it with more {what} or another QOS")
    if "PerJob" in body or "PerNode" in body:
        return (f"asks for more {what} than {whose} allows one job: it can never start as asked; stop it and "
                f"launch it with fewer {what} or another QOS")
    if body.startswith("Grp") or "PerAccount" in body:
        return (f"the {what} that {whose} shares among its users are all in use; it starts when its jobs (yours "
                "and others') free them")
    if "PerUser" not in body and body not in ("MaxJobsLimit", "MaxSubmitJobLimit"):
        return None
    others = queue.others_of(row)
    if what == "GPUs" and not _gpus(others):
        return (f"asks for more GPUs than {whose} allows you at once, and none of your jobs holds any: it can "
                "never start as asked; stop it and launch it with fewer GPUs or another QOS")
    if what == "GPUs":
        return (f"your other running jobs hold {_plural(_gpus(others), 'GPU')} in {_plural(len(others), 'job')}, "
                f"the most GPUs {whose} allows you at once; it starts when they end (or stop one)")
    return (f"you run {_plural(len(others), 'other job')}, the most {what} {whose} allows you at once; it starts "
            "when one ends (or stop one)")


# Codes whose sentence needs nothing but the job: {job}, {partition}, {detail} (what follows the code's comma).
_FIXED = {
    "BeginTime": "held until its begin time",
    "Dependency": "waiting for the jobs it depends on to end",
    "DependencyNeverSatisfied": "the jobs it depends on ended so that it can never start; stop it",
    "JobHeldUser": "held by its owner; release it with 'scontrol release {job}'",
    "JobHeldAdmin": "held by the site's administrators; ask them to release job {job}",
    "ReqNodeNotAvail": "nodes it needs are down, drained or reserved ({detail}); it starts when the site returns "
                       "them",
    "NodeDown": "a node it was given is down; Slurm starts it elsewhere when it can",
    "PartitionTimeLimit": "its time limit is above partition '{partition}''s MaxTime: it can never start; stop it "
                          "and launch it with a lower cluster.time_limit_min",
    "PartitionNodeLimit": "it asks for more nodes than partition '{partition}' allows one job: it can never start; "
                          "stop it and launch it with fewer GPUs or on another partition",
    "PartitionDown": "partition '{partition}' is down; it starts when the site brings it back",
    "PartitionInactive": "partition '{partition}' is inactive; it starts when the site brings it back",
    "InvalidAccount": "its account is not one you may use here: it can never start; stop it and set "
                      "cluster.account",
    "InvalidQOS": "its QOS is not one you may use here: it can never start; stop it and set cluster.qos",
    "Reservation": "waiting for its reservation to begin",
    "Licenses": "waiting for licenses it asked for",
    "JobArrayTaskLimit": "the sweep runs at most sweep.parallel of its jobs at once; it starts when one ends",
    "launch failed requeued held": "its launch failed and Slurm held it; 'launcher resume' or "
                                   "'scontrol release {job}' starts it again",
    "BadConstraints": "no node has the features it asks for (cluster.constraint): it can never start; stop it",
    "Cleaning": "its nodes are being cleaned up after its last attempt; it starts again in a moment",
}
