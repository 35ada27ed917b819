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
import re
import shutil
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from train.dist import DistEnv

log = logging.getLogger(__name__)

COMPLETE = re.compile(r"^step_(\d{8})$")
META = "meta.json"


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    return checkpoint_root(run_dir) / f"step_{step:08d}"


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first; ``*.tmp`` (unfinished) directories are ignored."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if COMPLETE.match(p.name) and (p / META).is_file()]
    return sorted(found, key=lambda p: p.name)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


def save_checkpoint(run_dir: Path, step: int, model: nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: torch.optim.lr_scheduler.LRScheduler, env: DistEnv, keep: int) -> Path:
    """Save the training state after ``step`` optimizer steps; all ranks call this.

    Keeps the newest ``keep`` complete checkpoints. Saving a step that already
    has a complete checkpoint does nothing.
    """
    final = step_dir(run_dir, step)
    if (final / META).is_file():
        return final
    tmp = final.with_name(final.name + ".tmp")
    if env.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # left by a crashed save of this step
        tmp.mkdir(parents=True)
    dist.barrier()

    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp)
    rng = io.BytesIO()
    torch.save(_rng_state(), rng)
    _write_synced(tmp / f"rng_rank_{env.rank:05d}.pt", rng.getvalue())
    if env.is_main:
        meta = {"step": step, "world_size": env.world_size, "scheduler": scheduler.state_dict()}
        _write_synced(tmp / META, json.dumps(meta, indent=1).encode())
    dist.barrier()

    if env.is_main:
        os.rename(tmp, final)
        _fsync_dir(final.parent)
        _prune(run_dir, keep)
    dist.barrier()
    log.info("saved checkpoint %s", final)
    return final


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
