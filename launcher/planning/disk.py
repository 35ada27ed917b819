"""Disk for checkpoints: the size of one checkpoint, and whether the run root's filesystem can hold as many
as the run keeps. ``launcher plan``, dry runs and launches warn (launcher/planning/gate.py); preflight
(train/preflight.py) refuses a node whose run directory cannot take the next one. Both use this size.

A checkpoint (train/checkpoint.py) holds fp32 weights and AdamW's two fp32 moments, 12 bytes per parameter
whatever the compute precision, plus DCP's framing: each rank writes its shard of every weight, both moments
and the step count (four items per parameter tensor), about 1.7 KB each with their entry in ``.metadata``,
and its RNG state, 14.4 KB. Measured on 2 ranks (the tests' model, gpt_tiny, gpt_small), the rule is 0.6-3%
above the files (docs/recovery.md). A save writes the new checkpoint before it prunes the oldest, so a run
keeping ``train.keep_checkpoints`` needs room for one more while it saves.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from launcher.core.config import ModelConfig, RunConfig, TrainConfig
from launcher.core.plan import Plan
from launcher.planning.memory import param_shapes

BYTES_PER_PARAM = 12  # fp32 weights + AdamW exp_avg + exp_avg_sq
ITEMS_PER_TENSOR = 4  # weight, exp_avg, exp_avg_sq, step
ITEM_BYTES = 2048  # DCP's framing of one item on one rank, with its .metadata entry
RANK_BYTES = 16 * 1024  # one rank's RNG state file, manifest and share of meta.json


def checkpoint_bytes(model: ModelConfig, params: int, world_size: int) -> int:
    """Bytes of one checkpoint of ``model`` (``params`` parameters) saved by ``world_size`` ranks."""
    root, block = param_shapes(model)
    tensors = len(root) + model.n_layers * len(block)
    return BYTES_PER_PARAM * params + world_size * (RANK_BYTES + ITEMS_PER_TENSOR * tensors * ITEM_BYTES)


def checkpoints_on_disk(train: TrainConfig) -> int:
    """Checkpoints on disk at the peak of a save: the ``keep_checkpoints`` kept and the one being written,
    fewer if the run saves fewer (every ``checkpoint_every`` steps and the last; a time-limit or preemption
    signal adds a save, but never more on disk than that)."""
    periodic = train.steps // train.checkpoint_every if train.checkpoint_every > 0 else 0
    saves = periodic + (train.checkpoint_every <= 0 or train.steps % train.checkpoint_every != 0)
    return min(train.keep_checkpoints + 1, saves)


def free_space(path: Path) -> tuple[Path, int]:
    """The nearest existing directory at or above ``path`` (the run root may not exist yet) and the free
    bytes of its filesystem."""
    path = Path(os.path.expanduser(path)).absolute()
    while not path.is_dir():
        path = path.parent
    return path, shutil.disk_usage(path).free


def checkpoint_room(cfg: RunConfig, plan: Plan) -> Optional[str]:
    """Why the run root's filesystem cannot hold the checkpoints the run keeps, or None if it can (or its
    free space cannot be read)."""
    size = checkpoint_bytes(cfg.model, plan.params, plan.world_size)
    count = checkpoints_on_disk(cfg.train)
    try:
        where, free = free_space(Path(cfg.run_root))
    except OSError:
        return None
    if count * size <= free:
        return None
    keep = cfg.train.keep_checkpoints
    which = (f"train.keep_checkpoints={keep} kept and the one being saved" if count == keep + 1 else
             f"all the run saves, with train.checkpoint_every={cfg.train.checkpoint_every}")
    return (f"checkpoints need {human(count * size)} ({count} x {human(size)}: {which}) but the run root's "
            f"filesystem ({where}) has {human(free)} free: saves will fail; lower train.keep_checkpoints or set "
            "run_root=... on a larger filesystem")


def human(n: float) -> str:
    """Bytes for people: MB below a gigabyte, GB above."""
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"
