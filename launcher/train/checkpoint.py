"""Sharded checkpoints that a crash cannot corrupt.

Model and optimizer go through torch.distributed.checkpoint (DCP): each rank
writes only its own shards, in parallel, and a checkpoint can be loaded by a
different number of ranks. Next to them: ``meta.json`` (step, LR scheduler) from
rank 0 and ``rng_rank_<N>.pt`` (torch, CUDA, numpy and Python RNG states) from
each rank.

A save writes into ``checkpoints/step_<NNNNNNNN>.tmp/``; only when every rank has
finished does rank 0 rename it to ``step_<NNNNNNNN>`` (one atomic rename), and
only then are older checkpoints pruned. So a directory without ``.tmp`` is always
complete, and a crash at any point of a save leaves the previous complete
checkpoint as it was. The run directory must be on a file system every node
sees (DCP's requirement too).
"""
from __future__ import annotations

import io
import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from launcher.core.events import Fault
from launcher.core.failures import classify, third_party
from launcher.core.checkpoints import DAMAGED, META, checkpoint_root, complete_checkpoints, step_dir, step_of
from launcher.train import manifest
from launcher.train.dist import DistEnv

log = logging.getLogger(__name__)

def resume_checkpoint(run_dir: Path, env: DistEnv, on_damage: Callable[[int, list[str]], None]) -> Path | None:
    """The newest complete checkpoint whose files match their manifests; all ranks call this.

    The ranks split the reading. A damaged checkpoint is set aside as ``step_<N>.damaged`` (never tried
    again, its step can be saved again) and ``on_damage(step, problems)`` is called on rank 0, so the run's
    events say what was wrong; the previous checkpoint is tried next.
    """
    for path in reversed(complete_checkpoints(run_dir)):
        problems = verify(path, env)
        if not problems:
            return path
        set_aside(path, problems, env, on_damage)
    return None


def set_aside(path: Path, problems: list[str], env: DistEnv, on_damage: Callable[[int, list[str]], None]) -> None:
    """Rename the damaged checkpoint ``path`` to ``step_<N>.damaged`` (kept for a look, never tried again, its
    step can be saved again) after ``on_damage(step, problems)`` on rank 0 has recorded why; all ranks call this."""
    if env.is_main:
        log.error("checkpoint %s is damaged: %s", path, "; ".join(problems))
        on_damage(step_of(path), problems)
        aside = path.with_name(path.name + DAMAGED)
        shutil.rmtree(aside, ignore_errors=True)
        os.rename(path, aside)
    dist.barrier()


def reference(path: Path) -> dict:
    """The checkpoint's reference of its step (loss, grad_norm, kept in its meta.json), for the check of the
    first step after resuming from it (launcher/train/resume.py)."""
    meta = json.loads((path / META).read_text())
    return {key: meta[key] for key in ("loss", "grad_norm")}


def verify(path: Path, env: DistEnv) -> list[str]:
    """Every problem any rank finds with the checkpoint in ``path`` (empty: it can be trusted)."""
    try:
        saved_world = int(json.loads((path / META).read_text())["world_size"])
        mine = manifest.damage(path, saved_world, env.rank, env.world_size)
    except (OSError, ValueError, KeyError, TypeError) as err:
        mine = [f"{META} is unreadable ({type(err).__name__})"] if env.is_main else []
    found: list[list[str]] = [[] for _ in range(env.world_size)]
    dist.all_gather_object(found, mine)
    return [problem for problems in found for problem in problems]


FULL_DISK_BYTES = 1 << 20  # less free than this on a failed save: the disk is full


class CheckpointSaveError(RuntimeError):
    """A save failed (disk full, I/O error): earlier checkpoints are intact and no partial files are left.
    The run must not train on without checkpoints, so this ends the attempt with the cause, raised alike on every
    rank: its kind (a full disk is the file system's, judged by launcher/job/recovery.py, never a node's; another
    I/O error may pass on another try) and ``rank``, the rank whose part failed, where one is known."""

    fault = Fault.INFRASTRUCTURE

    def __init__(self, message: str, rank: int | None = None, disk_full: bool = False) -> None:
        super().__init__(message)
        self.rank = rank
        if disk_full:
            self.fault = Fault.DISK_FULL


class SaveLostPeer(CheckpointSaveError):
    """A save cut short because another rank went away during its collectives (killed, its node lost), or whose
    own part failed: a lost peer, so the attempt's cause is that rank (launcher/job/attempts.py), not this rank's
    save."""

    fault = Fault.PEER_LOST


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler, env: DistEnv, keep: int,
                    reference: dict) -> Path:
    """Save the training state after ``step`` optimizer steps; all ranks call this.

    ``reference`` (the step's loss and gradient norm) is kept in meta.json so that a resume can check its
    first step against it. Keeps the newest ``keep`` complete checkpoints. Saving a step that already has
    a complete checkpoint does nothing; a step directory left incomplete by an earlier attempt is replaced.
    Raises CheckpointSaveError, on every rank, if any rank's part of the save failed.
    """
    final = step_dir(run_dir, step)
    if (final / META).is_file() and manifest.has_manifests(final):
        return final
    tmp = final.with_name(final.name + ".tmp")
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crashed save of this step
        try:
            tmp.mkdir(parents=True, exist_ok=True)
        except OSError as err:  # a read-only or full filesystem, a directory not ours: the others lose this rank
            full = _full_disk(tmp)
            raise CheckpointSaveError(f"saving the checkpoint of step {step} failed: {full}{_first_line(err)}",
                                      env.rank, bool(full) or classify(err) is Fault.DISK_FULL) from err
    dist.barrier()
    try:
        _write_all(tmp, step, model, optimizer, scheduler, env, reference)
    except BaseException as err:  # DCP's CheckpointException is a BaseException
        rank, inner = _cause(err, env.rank)
        full = _full_disk(tmp)  # measured before the partial files go
        cause = full + (f"rank {rank}: " if rank is not None and inner is not err else "") + _first_line(inner)
        if env.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(err, OtherRank) or third_party(cause) is Fault.PEER_LOST:
            raise SaveLostPeer(f"saving the checkpoint of step {step} failed: {cause}", rank) from err
        raise CheckpointSaveError(f"saving the checkpoint of step {step} failed: {cause}", rank,
                                  bool(full) or classify(inner) is Fault.DISK_FULL) from err
    if env.is_main:
        if final.exists():  # an earlier attempt's save of this step that never completed
            shutil.rmtree(final)
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        _prune(run_dir, keep)
    dist.barrier()
    if env.is_main:  # one line a save, not one per rank (at 1,024 ranks, 1,024 files written each save)
        log.info("saved checkpoint %s", final)
    return final


class OtherRank(OSError):
    """This rank's part of a save went well, another rank's did not (that rank's own error names it)."""


def _write_all(tmp: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
               scheduler: torch.optim.lr_scheduler.LRScheduler, env: DistEnv, reference: dict) -> None:
    """Every rank's part of a save: DCP shards (collective), then this rank's RNG state, rank 0's
    meta.json, and each rank's manifest; the ranks agree that all of it worked before anyone goes on."""
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp)
    error = None
    try:
        rng = io.BytesIO()
        torch.save(_rng_state(), rng)
        _write_synced(tmp / f"rng_rank_{env.rank:05d}.pt", rng.getvalue())
        if env.is_main:
            meta = {"step": step, "world_size": env.world_size, "scheduler": scheduler.state_dict(), **reference}
            _write_synced(tmp / META, json.dumps(meta, indent=1).encode())
        name, body = manifest.manifest(tmp, env.rank, step, manifest.files_of_rank(tmp, env.rank, env.is_main))
        _write_synced(tmp / name, body)
    except OSError as err:
        error = err
    failed = _anyone(error is not None, env)
    if error is not None:
        raise error
    if failed:
        raise OtherRank("another rank's part of the save failed (see its log)")



def _full_disk(directory: Path) -> str:
    """"No space left on device" when the checkpoint's filesystem is (nearly) full: torch's zip writer
    reports a failed write as "unexpected pos 704 vs 598", which names nothing. Measured on the parent,
    which stays: the main rank may already have removed ``directory`` when another rank gets here."""
    try:
        free = shutil.disk_usage(directory.parent).free
    except OSError:
        return ""
    return f"No space left on device ({free:,} bytes free under {directory.parent}): " if free < FULL_DISK_BYTES else ""


def _anyone(flag: bool, env: DistEnv) -> bool:
    """True on every rank if ``flag`` is true on any rank."""
    value = torch.tensor([int(flag)], device=env.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def _cause(err: BaseException, own: int) -> tuple[int | None, BaseException]:
    """The rank whose part failed and its error: the first rank's OSError inside DCP's CheckpointException; else
    this rank's (``own``) own error, or none for "another rank's part failed"."""
    failures = getattr(err, "failures", None)
    if isinstance(failures, dict) and failures:
        rank, (inner, _trace) = sorted(failures.items(), key=lambda item: item[0])[0]
        return rank, inner
    return (None if isinstance(err, OtherRank) else own), err


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return (text[0] if text else type(err).__name__)[:300]


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler, env: DistEnv) -> int:
    """Restore the state saved in ``path`` (on any world size); returns its step. All ranks call this."""
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=path)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    meta = json.loads((path / META).read_text())
    scheduler.load_state_dict(meta["scheduler"])
    rng_file = path / f"rng_rank_{env.rank:05d}.pt"
    if rng_file.is_file():
        _set_rng_state(torch.load(rng_file, weights_only=False))
    else:
        log.warning("%s has no RNG state for rank %d (saved by %d ranks): RNG states not restored",
                    path, env.rank, meta["world_size"])
    return int(meta["step"])


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None,
            "numpy": np.random.get_state(), "python": random.getstate()}


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    if state["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def _prune(run_dir: Path, keep: int) -> None:
    """Delete all but the newest ``keep`` complete checkpoints, and unfinished saves of other steps."""
    for old in complete_checkpoints(run_dir)[:-max(1, keep)]:
        # Renamed first so that a crash halfway through the deletion leaves an
        # ignored *.tmp directory, never a "complete" one with missing shards.
        trash = old.with_name(old.name + ".tmp")
        os.rename(old, trash)
        shutil.rmtree(trash, ignore_errors=True)
    for tmp in checkpoint_root(run_dir).glob("step_*.tmp"):
        shutil.rmtree(tmp, ignore_errors=True)


def _write_synced(path: Path, data: bytes) -> None:
    """Write and fsync, so that the rename that completes the checkpoint never precedes the data."""
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (a crash right after must not undo it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
