"""Where a run's checkpoints live and which of them are complete: read by training (train/checkpoint.py, which
writes them) and by the launcher (describe, resume), so both agree on what a checkpoint is.

``checkpoints/step_<NNNNNNNN>/`` is complete once renamed from ``.tmp`` with its ``meta.json``; a save in
progress ends in ``.tmp``; a checkpoint found damaged at resume is set aside as ``.damaged``.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import List, Optional

COMPLETE = re.compile(r"^step_(\d{8})$")
META = "meta.json"
DAMAGED = ".damaged"


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


def damaged_checkpoints(run_dir: Path) -> List[Path]:
    root = checkpoint_root(run_dir)
    return sorted(root.glob(f"step_*{DAMAGED}")) if root.is_dir() else []


def latest_checkpoint(run_dir: Path) -> Optional[Path]:
    """The newest complete checkpoint, or None."""
    found = complete_checkpoints(run_dir)
    return found[-1] if found else None
