"""What kind of failure ended a rank or an attempt, decided once, where the failure is caught.

Whether a failure is retried (launcher/job/recovery.py's ``POLICY``) depends on its :class:`Fault`, never on
the words of its message: renaming an exception, or a message that happens to hold "ECC" or "nccl" in a file
name, changes nothing. A rank's exception is classified by :func:`classify` where the task catches it
(launcher/job/entry.py before training, launcher/train/task.py during it):

1. an exception of the project's own declares its kind (a ``fault`` attribute: ``DatasetError`` is ``DATA``, a
   ``CheckpointSaveError`` ``DISK_FULL`` when the disk was full, else ``INFRASTRUCTURE``);
2. Python's own by type and errno: ``OSError`` with ``ENOSPC`` or ``EDQUOT`` is a full disk; a lost connection
   (``ConnectionResetError``, ``BrokenPipeError``, ...) a lost peer; any other ``ConnectionError``, a
   ``TimeoutError``, an I/O error, a read-only or stale file system an infrastructure fault; a missing file or
   a permission the code's own (the same on every try);
3. torch.distributed's own types by name (this module is torch-free): a ``DistNetworkError`` is a lost peer,
   the other ``DistError`` kinds infrastructure;
4. what third parties raise with no type of their own (a ``RuntimeError`` from torch, NCCL, gloo) by the one
   table of their words, :data:`THIRD_PARTY`;
5. anything else is the code's own.

An attempt's end that no exception explains (a rank killed by a signal, a hang, a lost node) gets its kind
from the evidence (launcher/job/attempts.py). The words `runs` shows (``short``) are made from the kind and
the failure and compared nowhere.
"""
from __future__ import annotations

import errno
import os
import re
from pathlib import Path
from typing import Optional, Sequence

from launcher.core.events import Failed, Fault, Requeued
from launcher.core.rundir import append_event, names_this_job, read_events


# Python's errors by errno: a full disk, and the I/O and network errors a healthy node or a later try may not see.
DISK_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
INFRASTRUCTURE_ERRNOS = {errno.EIO, errno.EROFS, errno.ESTALE, errno.ETIMEDOUT, errno.ENETDOWN, errno.ENETUNREACH,
                         errno.EHOSTUNREACH, errno.EHOSTDOWN, errno.ENODEV, errno.ENXIO}
PEER_LOST_TYPES = (ConnectionResetError, ConnectionAbortedError, ConnectionRefusedError, BrokenPipeError)
# torch.distributed's exception types (torch/distributed/__init__.py: DistError and its subclasses), by name.
TORCH_DISTRIBUTED = {"DistNetworkError": Fault.PEER_LOST, "DistBackendError": Fault.INFRASTRUCTURE,
                     "DistStoreError": Fault.INFRASTRUCTURE, "DistError": Fault.INFRASTRUCTURE}

# The words of third parties' errors that have no type of their own (a RuntimeError's message), first match wins.
# Peer losses first: a collective that lost its peer says so in words that also name NCCL or a socket.
THIRD_PARTY: Sequence[tuple[re.Pattern[str], Fault, str]] = (
    (re.compile(r"connection reset by peer|connection closed by peer|broken pipe|remote process exited|"
                r"socket.*closed|connection refused|NCCL communicator was aborted", re.IGNORECASE),
     Fault.PEER_LOST, "gloo's and NCCL's words for a peer that went away"),
    (re.compile(r"\bCUDA error\b|\bNCCL\b|\bECC\b|uncorrectable|Xid"), Fault.INFRASTRUCTURE,
     "torch's and NCCL's device and collective errors, ECC errors"),
    (re.compile(r"No space left on device|Disk quota exceeded"), Fault.DISK_FULL,
     "a full disk, in a C library's words"),
    (re.compile(r"Input/output error|Read-only file system|Stale file handle"), Fault.INFRASTRUCTURE,
     "a file system's errors, in a C library's words"),
)


def classify(err: BaseException) -> Fault:
    """The kind of ``err`` (see the module's docstring for the order)."""
    declared = getattr(err, "fault", None)
    if isinstance(declared, Fault):
        return declared
    if isinstance(err, OSError):
        return _os_error(err)
    for cls in type(err).__mro__:
        if cls.__module__.startswith("torch") and cls.__name__ in TORCH_DISTRIBUTED:
            return TORCH_DISTRIBUTED[cls.__name__]
    return third_party(str(err)) or Fault.CODE


def _os_error(err: OSError) -> Fault:
    if err.errno in DISK_FULL_ERRNOS:
        return Fault.DISK_FULL
    if isinstance(err, PEER_LOST_TYPES):
        return Fault.PEER_LOST
    if isinstance(err, (ConnectionError, TimeoutError)) or err.errno in INFRASTRUCTURE_ERRNOS:
        return Fault.INFRASTRUCTURE
    if err.errno is None and type(err) is OSError:  # raised with a message only: a library's I/O failure
        return third_party(str(err)) or Fault.INFRASTRUCTURE
    return Fault.CODE  # a missing file, a permission, a path that is a directory: the same on every try


def third_party(message: str) -> Optional[Fault]:
    """The kind :data:`THIRD_PARTY` gives a message without a type of its own, or None."""
    return next((fault for words, fault, _ in THIRD_PARTY if words.search(message)), None)


def failure_event(err: BaseException, step: Optional[int], run_dir: Path, secrets: Sequence[str] = ()) -> Failed:
    """This rank's ``failed`` event for ``err``: rank, node and job from Slurm's environment, ``step`` (None where
    the rank had not begun training: an earlier attempt's heartbeat says nothing of this one), the kind, the
    error's type and first line (never a secret's value: each variable in ``secrets`` is masked), and the
    error's ``short`` words for `runs` where it has them. An error that names the rank it came from (``rank``: a
    save that failed on another rank, a full disk another rank found) is recorded as that rank's, without a
    node."""
    first_line = (str(err).strip().splitlines() or [""])[0][:300]
    name = type(err).__name__
    error = f"{name}: {first_line}" if first_line else name
    if getattr(type(err), "whole_cause", False):  # its message is the cause in the user's words (NoTorch)
        error = first_line
    for var in secrets:
        if os.environ.get(var):
            error = error.replace(os.environ[var], "***")
    procid = os.environ.get("SLURM_PROCID", "")
    rank, node = int(procid) if procid.isdigit() else None, os.environ.get("SLURMD_NODENAME")
    origin = getattr(err, "rank", None)
    if isinstance(origin, int) and origin != rank:
        rank, node = origin, None
    short = getattr(err, "short", None)
    return Failed(rank=rank, node=node, step=step, job_id=os.environ.get("SLURM_JOB_ID"), error=error,
                  short=short if isinstance(short, str) else None, fault=classify(err), exception=name)


def record(run_dir: Path, err: BaseException, step: Optional[int], secrets: Sequence[str] = ()) -> None:
    """Record this rank's failure in the run's record (:func:`failure_event`), unless it is none: an exit or an
    interrupt, or a lost peer while rank 0 requeues the job (the other ranks then die of their lost peer, which
    is part of the preemption). Status commands read it once Slurm has forgotten the job, and the attempt's end
    (launcher/job/recovery.py) weighs it against the other ranks' to find the cause."""
    if isinstance(err, (SystemExit, KeyboardInterrupt)) or being_requeued(run_dir):
        return
    append_event(run_dir, failure_event(err, step, run_dir, secrets))


def being_requeued(run_dir: Path) -> bool:
    """True when rank 0 has requeued this job (the newest event is its ``requeued``)."""
    events = read_events(run_dir)
    return bool(events) and isinstance(events[-1], Requeued) and names_this_job(run_dir, events[-1].job_id,
                                                                                 events[-1].cluster)
