"""Where a run's checkpoints live and which of them are complete: read by training (launcher/train/checkpoint.py, which
writes them) and by the launcher (describe, resume), so both agree on what a checkpoint is.

``checkpoints/step_<NNNNNNNN>/`` is complete once renamed from ``.tmp`` with its ``meta.json``; a save in
progress ends in ``.tmp``; a checkpoint found damaged at resume is set aside as ``.damaged``.

The size of one (:func:`checkpoint_bytes`, by which ``launcher plan`` warns and preflight refuses): fp32
weights and AdamW's two fp32 moments, 12 bytes per parameter whatever the compute precision, plus DCP's
framing: each rank writes its shard of every weight, both moments and the step count (four items per
parameter tensor), about 1.7 KB each with their entry in ``.metadata``, and its RNG state, 14.4 KB.
Measured on 2 ranks (the tests' model, gpt_tiny, gpt_small), the rule is 0.6-3% above the files
(docs/recovery.md). A save writes the new checkpoint before it prunes the oldest (launcher/train/checkpoint.py), so a
run keeping ``train.keep_checkpoints`` needs room for one more while it saves.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

from launcher.core.config import ModelConfig, TrainConfig
from launcher.core.plan import param_shapes

COMPLETE = re.compile(r"^step_(\d{8})$")
META = "meta.json"
DAMAGED = ".damaged"

BYTES_PER_PARAM = 12  # fp32 weights + AdamW exp_avg + exp_avg_sq
ITEMS_PER_TENSOR = 4  # weight, exp_avg, exp_avg_sq, step
ITEM_BYTES = 2048  # DCP's framing of one item on one rank, with its .metadata entry
RANK_BYTES = 16 * 1024  # one rank's RNG state file, manifest and share of meta.json


def checkpoint_root(run_dir: Path) -> Path:
    return Path(run_dir) / "checkpoints"


def step_dir(run_dir: Path, step: int) -> Path:
    return checkpoint_root(run_dir) / f"step_{step:08d}"


def step_of(path: Path) -> int:
    """The step of a checkpoint directory, whatever its suffix (``step_00000020.damaged`` -> 20)."""
    return int(path.name.split(".")[0].split("_")[1])


def complete_checkpoints(run_dir: Path) -> List[Path]:
    """Complete checkpoints, oldest first; unfinished (``.tmp``) and damaged ones are not among them."""
    root = checkpoint_root(run_dir)
    if not root.is_dir():
        return []
    return sorted((p for p in root.iterdir() if COMPLETE.match(p.name) and (p / META).is_file()),
                  key=lambda p: p.name)


def saved_steps(run_dir: Path) -> List[int]:
    """The steps the run's complete checkpoints hold, oldest first: those a later attempt can resume from."""
    return [step_of(path) for path in complete_checkpoints(run_dir)]


def damaged_checkpoints(run_dir: Path) -> List[Path]:
    root = checkpoint_root(run_dir)
    return sorted(root.glob(f"step_*{DAMAGED}")) if root.is_dir() else []


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None


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


def human(n: float) -> str:
    """A checkpoint's bytes for people: MB below a gigabyte, GB above."""
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"
