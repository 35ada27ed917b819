"""Disk for checkpoints: whether the run root's filesystem can hold as many as the run keeps, warned of by
``launcher plan``, dry runs and launches (launcher/forecast/gate.py), before a save fails mid-run.

The size of a checkpoint and how many are on disk at once are launcher/core/checkpoints.py's, so that
preflight (launcher/train/preflight.py), which refuses a node whose run directory cannot take the next one, uses the
same rule.
"""
from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path
from typing import Optional

from launcher.core.checkpoints import checkpoint_bytes, checkpoints_on_disk, human
from launcher.core.config import RunConfig
from launcher.core.plan import Plan
from launcher.core.rundir import frozen_files


def free_space(path: Path) -> tuple[Path, int]:
    """The nearest existing directory at or above ``path`` (the run root may not exist yet) and the free
    bytes of its filesystem; OSError where that is no disk (``/proc``, whose size is 0: the launch itself
    says it cannot create the run root there)."""
    path = Path(os.path.expanduser(path)).absolute()
    while not path.is_dir():
        path = path.parent
    usage = shutil.disk_usage(path)
    if usage.total == 0:
        raise OSError(f"{path} is not on a disk")
    return path, usage.free


@functools.lru_cache(maxsize=1)
def code_bytes() -> int:
    """What the run's frozen copy of the code takes (launcher/submit/freeze.py): it lands in the run root first."""
    return sum(path.stat().st_size for path in frozen_files())


def checkpoint_room(cfg: RunConfig, plan: Plan) -> Optional[str]:
    """Why the run root's filesystem cannot hold the checkpoints the run keeps beside its frozen code, or None if it
    can (or its free space cannot be read)."""
    size = checkpoint_bytes(cfg.model, plan.params, plan.world_size)
    count = checkpoints_on_disk(cfg.train)
    try:
        where, free = free_space(Path(cfg.run_root))
    except OSError:
        return None
    if count * size + code_bytes() <= free:
        return None
    keep = cfg.train.keep_checkpoints
    which = (f"train.keep_checkpoints={keep} kept and the one being saved" if count == keep + 1 else
             f"all the run saves, with train.checkpoint_every={cfg.train.checkpoint_every}")
    return (f"checkpoints need {human(count * size)} ({count} x {human(size)}: {which}) but the run root's "
            f"filesystem ({where}) has {human(free)} free, {human(max(0, free - code_bytes()))} once the run's code "
            f"({human(code_bytes())}) is copied there: saves will fail; lower train.keep_checkpoints or set "
            "run_root=... on a larger filesystem")
