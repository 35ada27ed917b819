"""The run's life as types: one dataclass per kind of line in ``events.jsonl``, and the codec to and from a line.

Every writer, on the login node, in the job's batch script and in the ranks, builds one of these and appends it
with :func:`launcher.core.rundir.append_event`; the line stays JSON with the kind under ``event`` and the time
under ``time``, so files written before the types still read. A field the writer left unset is written as null,
so a reader finds every field of its kind. A line of a kind these types do not know, or a field they do not
declare, is kept (:class:`UnknownEvent`, ``extra``) and shown, never a crash: an older launcher reads a newer
run's record. ``docs/design-contract.md`` lists the kinds and their fields; a test checks it against
:data:`KINDS`.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, ClassVar, Optional


class Outcome(str, Enum):
    """How an attempt ended (``attempt_ended``'s ``outcome``). A str, so a line reads as its value."""

    COMPLETED = "COMPLETED"  # every step trained, the final checkpoint whole
    REQUEUED = "REQUEUED"  # the time limit's or a preemption's signal, or a requeue from outside: not a failure
    CANCELLED = "CANCELLED"  # by the user or an administrator
    FAILED = "FAILED"  # a rank died or raised
    STALLED = "STALLED"  # the watchdog found no step advancing (a hung rank)
    LOST = "LOST"  # a node stopped responding
    PREFLIGHT = "PREFLIGHT"  # the pre-training check refused a node

    def __str__(self) -> str:
        return self.value


class Fault(str, Enum):
    """The kind of a failure (``failed``'s and ``attempt_ended``'s ``fault``): what recovery's policy is keyed by
    (launcher/core/failures.py classifies an exception). A str, so a line reads as its value."""

    CODE = "code"  # an error of the code's own (or its config): the same on every try
    DATA = "data"  # the dataset is damaged: every node and try reads it alike
    NO_TORCH = "no torch"  # the tasks' Python cannot import torch
    DISK_FULL = "disk full"  # no space left (a later try may find room: old checkpoints pruned, quota freed)
    STORE = "store"  # the object store of data.path=s3://... did not serve it within data.store.retry_s
    INFRASTRUCTURE = "infrastructure"  # I/O, network, device, a collective, Slurm: may pass on another try or node
    PEER_LOST = "peer lost"  # a rank lost a peer: another rank's failure, not its own
    KILLED = "killed"  # a rank killed by a signal (often the kernel's out-of-memory killer)
    DIED = "died"  # a rank ended without an error of its own
    HUNG = "hung"  # no step advanced: the watchdog ended the attempt
    NODE_LOST = "node lost"  # a node stopped answering
    NODE_UNFIT = "node unfit"  # a node failed its preflight check
    BATCH_DIED = "batch step died"  # the job's batch shell died (its host's OOM killer, a killed slurmstepd)
    UNKNOWN = "unknown"  # nothing but srun's exit status, or no record at all

    def __str__(self) -> str:
        return self.value


@dataclass(kw_only=True)
class Event:
    """What every line has: when it was written, and the fields a newer writer added that this kind does not
    declare (kept so that they are shown and written back unchanged). A kind that names a Slurm job names its
    cluster beside it (``cluster``: job ids repeat across clusters, and a moved run has jobs on two); a line of an
    older launcher has none, and its job is on the run's cluster."""

    kind: ClassVar[str] = ""
    time: float = field(default_factory=time.time)
    extra: dict = field(default_factory=dict)


@dataclass(kw_only=True)
class Submitted(Event):
    """The launcher submitted the run's job."""
    kind: ClassVar[str] = "submitted"
    job_id: Optional[str] = None
    cluster: Optional[str] = None


@dataclass(kw_only=True)
class Attempt(Event):
    """The job's batch script began an attempt: the first start, or a requeue or retry of it."""
    kind: ClassVar[str] = "attempt"
    attempt: Optional[int] = None
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    nodes: Optional[str] = None  # Slurm's node list of the attempt
    restart: int = 0  # SLURM_RESTART_COUNT
    log_offset: int = 0  # where this attempt's part of the batch log begins


@dataclass(kw_only=True)
class Preflight(Event):
    """Every rank passed the pre-training check (an all-reduce, timed). A summary whose size does not grow with
    the ranks, since every status command reads it: each rank's bandwidth is in the file ``table`` names
    (launcher/train/preflight.py)."""
    kind: ClassVar[str] = "preflight"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    allreduce_mb: Optional[float] = None
    ranks: Optional[int] = None
    median_gbps: Optional[float] = None
    slowest: list = field(default_factory=list)  # the few slowest ranks: {rank, node, gbps}
    slow_ranks: list = field(default_factory=list)  # flagged (far below the median), the first few
    slow_count: int = 0  # how many were flagged in all
    slow_nodes: list = field(default_factory=list)  # the nodes of the flagged ranks
    table: Optional[str] = None  # every rank's figure, relative to the run directory


@dataclass(kw_only=True)
class PreflightFailed(Event):
    """A rank's pre-training check found its node unfit."""
    kind: ClassVar[str] = "preflight_failed"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    rank: Optional[int] = None
    node: Optional[str] = None
    problem: Optional[str] = None


@dataclass(kw_only=True)
class Started(Event):
    """The ranks began training (rank 0 writes it), and how long rank 0's bring-up took so far, in seconds by
    phase: ``imports`` (the process's start to the task's), ``rendezvous`` (the process group and its check),
    ``preflight``, ``data`` (the data's checks). ``staged``: the node-local copy of the code rank 0 imported
    (``code.zip``'s), null where it imported ``code`` itself; ``python``: the interpreter rank 0 ran (the node's copy
    of the tasks' environment where it was staged: launcher/job/stage_env.py)."""
    kind: ClassVar[str] = "started"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    world_size: Optional[int] = None
    nodes: list = field(default_factory=list)
    code: Optional[str] = None  # where the task imported the launcher from (the frozen copy)
    bring_up: dict = field(default_factory=dict)
    staged: Optional[str] = None  # the node-local copy of ``code`` rank 0 imported it from (launcher/job/stage.py)
    python: Optional[str] = None  # the interpreter rank 0 ran: a node-local copy's where the environment was staged


@dataclass(kw_only=True)
class Ready(Event):
    """The attempt's first step is done (rank 0 writes it): the rest of its bring-up, in seconds, the model's
    build (``build_s``), the checkpoint's load (``load_s``, 0 from scratch) and the first step (``first_step_s``)."""
    kind: ClassVar[str] = "ready"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    build_s: Optional[float] = None
    load_s: Optional[float] = None
    first_step_s: Optional[float] = None


@dataclass(kw_only=True)
class Resumed(Event):
    """Training resumed from a checkpoint."""
    kind: ClassVar[str] = "resumed"
    step: Optional[int] = None
    checkpoint: Optional[str] = None


@dataclass(kw_only=True)
class CheckpointDamaged(Event):
    """A checkpoint failed its check and was set aside; the one before it is used."""
    kind: ClassVar[str] = "checkpoint_damaged"
    step: Optional[int] = None
    damage: Optional[str] = None


@dataclass(kw_only=True)
class Stalled(Event):
    """The watchdog found the attempt's steps stopped, and the ranks to blame."""
    kind: ClassVar[str] = "stalled"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    cause: Optional[str] = None
    ranks: list = field(default_factory=list)
    nodes: list = field(default_factory=list)
    step: Optional[int] = None


@dataclass(kw_only=True)
class Failed(Event):
    """A rank's own failure, or (``final``) the run's verdict: it will not be retried."""
    kind: ClassVar[str] = "failed"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    rank: Optional[int] = None
    node: Optional[str] = None
    step: Optional[int] = None
    error: Optional[str] = None  # the failure in full
    short: Optional[str] = None  # the words `runs` shows beside FAILED
    fault: Optional[Fault] = None  # its kind (launcher/core/failures.py)
    exception: Optional[str] = None  # the exception's type, where one was raised
    final: bool = False
    reason: Optional[str] = None  # why it is not retried (a verdict)


@dataclass(kw_only=True)
class AttemptEnded(Event):
    """The batch script (or the next attempt, for one Slurm ended first) judged an attempt."""
    kind: ClassVar[str] = "attempt_ended"
    attempt: Optional[int] = None
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    outcome: Optional[Outcome] = None
    cause: Optional[str] = None
    short: Optional[str] = None
    fault: Optional[Fault] = None  # the kind of failure (FAILED, STALLED, LOST, PREFLIGHT)
    exception: Optional[str] = None  # the exception's type, where a rank raised one
    rank: Optional[int] = None  # the rank, node and step to blame
    node: Optional[str] = None
    step: Optional[int] = None
    nodes: Optional[list] = None  # every node to blame
    exclude: Optional[list] = None  # the nodes Slurm holds down (a lost node)
    exit_code: Optional[int] = None  # srun's
    trained: Optional[bool] = None  # whether the attempt trained a step
    note: Optional[str] = None


@dataclass(kw_only=True)
class Retrying(Event):
    """A retry was submitted as a new job."""
    kind: ClassVar[str] = "retrying"
    attempt: Optional[int] = None
    job_id: Optional[str] = None  # the retry's
    cluster: Optional[str] = None
    previous_job_id: Optional[str] = None
    exclude: list = field(default_factory=list)
    allowed: Optional[list] = None  # exclusions dropped so that the retry can be scheduled
    reason: Optional[str] = None
    free: bool = False  # the node's fault: no retry spent
    left_out: Optional[dict] = None  # excluded nodes Slurm holds unusable, with its state and reason


@dataclass(kw_only=True)
class Resubmitted(Event):
    """``launcher resume`` submitted a new job for the run (``layout``: on another number of GPUs, from what to
    what)."""
    kind: ClassVar[str] = "resubmitted"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    previous_job_id: Optional[str] = None
    by: Optional[str] = None
    layout: Optional[str] = None


@dataclass(kw_only=True)
class Watching(Event):
    """The job that judges an attempt whose batch step died before it could (``watcher``), or why none watches."""
    kind: ClassVar[str] = "watching"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    watcher: Optional[str] = None
    refused: Optional[str] = None


# The exit status of a batch script's begin step that recorded a ``duplicate_job``: the script ends there, neither
# training nor judging an attempt (launcher/slurm/batch.py; launcher/job/recovery.py).
EXIT_NOT_OURS = 3


@dataclass(kw_only=True)
class DuplicateJob(Event):
    """A job of the run found another job of it alive (the run's claim) and ended without training."""
    kind: ClassVar[str] = "duplicate_job"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    holder: Optional[str] = None
    cause: Optional[str] = None


@dataclass(kw_only=True)
class Signalled(Event):
    """A SIGTERM reached one rank, not every rank of the attempt as at Slurm's own end of the job (a scancel, a
    time limit, a node's shutdown), and the rank went on training (``action``). Its ``time`` is when the rank
    heard it, its ``step`` the last step done when the ranks found that the others had not
    (launcher/train/interrupt.py). Written by that rank, once per attempt."""
    kind: ClassVar[str] = "signalled"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    signal: Optional[str] = None
    rank: Optional[int] = None
    node: Optional[str] = None
    pid: Optional[int] = None
    step: Optional[int] = None
    action: Optional[str] = None


@dataclass(kw_only=True)
class Requeued(Event):
    """The job is to start again: the ranks saved on Slurm's signal (``by`` signal, at ``step``). A record a run of an
    older launcher wrote may have no ``by``: submitit's handler requeued its job."""
    kind: ClassVar[str] = "requeued"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    step: Optional[int] = None
    by: Optional[str] = None


@dataclass(kw_only=True)
class Finished(Event):
    """Training ended: every step, or a search pruned the trial."""
    kind: ClassVar[str] = "finished"
    step: Optional[int] = None
    loss: Optional[float] = None
    pruned: Optional[bool] = None


@dataclass(kw_only=True)
class Cancelled(Event):
    """``launcher stop`` cancelled the run's job."""
    kind: ClassVar[str] = "cancelled"
    job_id: Optional[str] = None
    cluster: Optional[str] = None


@dataclass(kw_only=True)
class Moved(Event):
    """``launcher move`` (or the console's Move) cancelled the run's waiting job ``from_job_id`` on ``from_cluster``,
    which had waited ``waited_s`` seconds, and submitted the run as job ``job_id`` on ``cluster``; ``by``: who moved
    it; ``run_dir``: where the run went when it left this directory (``CLUSTER:PATH`` on a cluster over SSH)."""
    kind: ClassVar[str] = "moved"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    from_job_id: Optional[str] = None
    from_cluster: Optional[str] = None
    waited_s: Optional[float] = None
    by: Optional[str] = None
    run_dir: Optional[str] = None


@dataclass(kw_only=True)
class Evaluated(Event):
    """``launcher evaluate`` measured a checkpoint's held-out loss."""
    kind: ClassVar[str] = "evaluated"
    step: Optional[int] = None
    data: Optional[str] = None
    split: Optional[str] = None
    tokens: Optional[int] = None
    loss: Optional[float] = None
    perplexity: Optional[float] = None
    seconds: Optional[float] = None
    device: Optional[str] = None


@dataclass(kw_only=True)
class Exported(Event):
    """A checkpoint was exported to Hugging Face's format."""
    kind: ClassVar[str] = "exported"
    step: Optional[int] = None
    path: Optional[str] = None
    bytes: Optional[int] = None
    seconds: Optional[float] = None


@dataclass(kw_only=True)
class ExportFailed(Event):
    """An export during or after training failed (training goes on)."""
    kind: ClassVar[str] = "export_failed"
    step: Optional[int] = None
    error: Optional[str] = None


@dataclass(kw_only=True)
class TrialReported(Event):
    """A search's trial reported its value (or why it has none) to the study."""
    kind: ClassVar[str] = "trial_reported"
    value: Optional[float] = None
    cause: Optional[str] = None
    submitted: Optional[int] = None  # the next trials submitted


@dataclass(kw_only=True)
class SearchFailed(Event):
    """A search's trial could not report to its study, or submit the next trials."""
    kind: ClassVar[str] = "search_failed"
    error: Optional[str] = None


@dataclass(kw_only=True)
class PathRefused(Event):
    """A path the launcher keeps node-local state at was taken by someone else (another user's file or folder, a
    symlink): it was neither used, written through nor removed, and the state went to ``used`` instead
    (launcher/core/nodelocal.py). Written by the node's first rank."""
    kind: ClassVar[str] = "path_refused"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    node: Optional[str] = None
    rank: Optional[int] = None
    path: Optional[str] = None
    found: Optional[str] = None  # what was there, in words ("a folder of user mallory")
    owner: Optional[str] = None
    used: Optional[str] = None


@dataclass(kw_only=True)
class HeartbeatFailed(Event):
    """A rank's pulse could not be written to its node's memory (full, unwritable): the node's heartbeat file in the
    run directory is written from what is known meanwhile (launcher/train/watchdog.py). Once per node and attempt,
    by the node's first rank."""
    kind: ClassVar[str] = "heartbeat_failed"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    node: Optional[str] = None
    rank: Optional[int] = None
    path: Optional[str] = None
    error: Optional[str] = None  # the error in full ("[Errno 28] No space left on device")
    errno: Optional[str] = None  # its symbol, ENOSPC


@dataclass(kw_only=True)
class CodeNotStaged(Event):
    """The run's code could not be copied to node ``node``'s ``path`` (full, unwritable, another user's; the archive
    damaged), or (``node`` null) ``code.zip`` could not be made or some node's stage step gave no answer, so every
    rank of the job imports ``code/`` from the run directory (launcher/job/stage.py). Written by the batch script's
    stage step, once per such node and job."""
    kind: ClassVar[str] = "code_not_staged"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    node: Optional[str] = None
    path: Optional[str] = None
    error: Optional[str] = None  # the error in full ("[Errno 28] No space left on device")
    errno: Optional[str] = None  # its symbol, ENOSPC


@dataclass(kw_only=True)
class EnvNotStaged(CodeNotStaged):
    """The tasks' environment could not be unpacked on node ``node`` at ``path`` (no room, unwritable, another
    user's; the archive damaged), or (``node`` null) could not be packed or some node's stage step gave no answer, so
    every rank of the job runs the shared environment's interpreter (launcher/job/stage_env.py). Written by the batch
    script's stage step, once per such node and job."""
    kind: ClassVar[str] = "env_not_staged"


@dataclass(kw_only=True)
class EnvPacked(Event):
    """Job ``job_id``'s stage step packed the tasks' environment ``version`` into ``archive`` because the one there was
    ``why`` (``missing``: a version the launch did not pack; ``damaged (...)``: its checksum failed), before any node
    read it (launcher/job/stage_env.py)."""
    kind: ClassVar[str] = "env_packed"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    archive: Optional[str] = None
    version: Optional[str] = None
    why: Optional[str] = None


@dataclass(kw_only=True)
class EnvStaged(Event):
    """Every node of job ``job_id`` has the tasks' environment ``version`` (from ``archive``), and its ranks run
    ``python``, the copy's interpreter (launcher/job/stage_env.py)."""
    kind: ClassVar[str] = "env_staged"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    python: Optional[str] = None
    archive: Optional[str] = None
    version: Optional[str] = None


@dataclass(kw_only=True)
class StopAsked(Event):
    """``launcher stop`` (or the console's Stop) asked the running job ``job_id`` to save the step its ranks are at
    and end (launcher/core/stop_request.py): ``by`` is who asked, ``wait_s`` how long it waits for that before it
    cancels the job. The attempt then ends CANCELLED, never requeued or retried."""
    kind: ClassVar[str] = "stop_asked"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    by: Optional[str] = None
    wait_s: Optional[float] = None


@dataclass(kw_only=True)
class Stopped(Event):
    """Every rank saved step ``step`` and ended, as ``launcher stop`` asked (``by``: who asked); written by rank 0
    after the save (launcher/train/interrupt.py)."""
    kind: ClassVar[str] = "stopped"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    step: Optional[int] = None
    by: Optional[str] = None


@dataclass(kw_only=True)
class Terminated(Event):
    """Slurm's SIGTERM reached every rank (a scancel, an ``scontrol requeue``, a preemption that sends it first,
    the time limit's end), and Slurm sends SIGKILL ``kill_wait_s`` (its KillWait) after it. At the ranks' first
    agreement after it, ``step`` done, every rank saved that step and ended (``saved``), or, where the save would
    not fit in the ``left_s`` seconds left (a save takes about ``save_s``) or KillWait is unknown, trained on
    until the SIGKILL, and ``reason`` says why (launcher/train/interrupt.py). Written by rank 0."""
    kind: ClassVar[str] = "terminated"
    job_id: Optional[str] = None
    cluster: Optional[str] = None
    signal: Optional[str] = None
    step: Optional[int] = None
    saved: Optional[bool] = None
    reason: Optional[str] = None
    kill_wait_s: Optional[float] = None
    left_s: Optional[float] = None
    save_s: Optional[float] = None


@dataclass(kw_only=True)
class UnknownEvent(Event):
    """A line of a kind these types do not know (a newer launcher's): its kind and fields, kept as they were."""
    name: str = ""


KINDS: dict[str, type[Event]] = {cls.kind: cls for cls in (
    Submitted, Attempt, Preflight, PreflightFailed, Started, Ready, Resumed, CheckpointDamaged, Stalled, Failed,
    AttemptEnded, Retrying, Resubmitted, Watching, DuplicateJob, Signalled, Requeued, Finished, Cancelled, Moved,
    Evaluated, Exported, ExportFailed, TrialReported, SearchFailed, PathRefused, HeartbeatFailed, CodeNotStaged,
    EnvNotStaged, EnvPacked, EnvStaged, StopAsked, Stopped, Terminated)}


def fields_of(kind: type[Event]) -> list[str]:
    """The fields a kind declares, in order (without ``time`` and ``extra``)."""
    return [f.name for f in dataclasses.fields(kind) if f.name not in ("time", "extra")]


def encode(event: Event) -> dict[str, Any]:
    """The line's object: ``time``, ``event`` (the kind) and every field, unset ones null."""
    if isinstance(event, UnknownEvent):
        return {"time": event.time, "event": event.name, **event.extra}
    values = {name: getattr(event, name) for name in fields_of(type(event))}
    return {"time": event.time, "event": event.kind, **event.extra, **values}


def decode(line: dict[str, Any]) -> Event:
    """The event of a line's object (as read from JSON): its kind's type, or :class:`UnknownEvent`."""
    rest = {k: v for k, v in line.items() if k not in ("time", "event")}
    stamp = line.get("time")
    stamp = float(stamp) if isinstance(stamp, (int, float)) else 0.0
    kind = KINDS.get(line.get("event"))  # type: ignore[arg-type]
    if kind is None:
        return UnknownEvent(time=stamp, name=str(line.get("event")), extra=rest)
    declared = set(fields_of(kind))
    known = {k: v for k, v in rest.items() if k in declared}
    for name, enum in (("outcome", Outcome), ("fault", Fault)):  # a value a newer launcher added stays a str
        if name in declared and known.get(name) in enum._value2member_map_:
            known[name] = enum(known[name])
    if isinstance(known.get("rank"), str) and known["rank"].isdigit():  # an older launcher wrote a rank's digits
        known["rank"] = int(known["rank"])
    return kind(time=stamp, extra={k: v for k, v in rest.items() if k not in declared}, **known)
