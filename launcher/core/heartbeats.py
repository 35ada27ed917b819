"""Each rank's heartbeat file, ``heartbeats/rank_<N>.json`` in the run directory: written by the rank's
watchdog (train/watchdog.py), read by the watchdogs of other ranks to name a frozen one, and by the
launcher to show a stalled run and to know the step a rank that died had reached."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

HEARTBEATS = "heartbeats"


@dataclass
class Pulse:
    """One rank's heartbeat: the step it is on, since when, and when its watchdog last ran."""

    rank: int
    node: str
    pid: int
    step: int
    step_since: float
    alive: float


def heartbeat_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / HEARTBEATS / f"rank_{rank:05d}.json"


def read_pulses(run_dir: Path) -> List[Pulse]:
    """Every rank's last heartbeat (an unreadable file is skipped: a rank may be replacing it)."""
    pulses = []
    for path in sorted((Path(run_dir) / HEARTBEATS).glob("rank_*.json")):
        try:
            pulses.append(Pulse(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue
    return pulses


def steps_by_rank(run_dir: Path) -> Dict[int, int]:
    return {pulse.rank: pulse.step for pulse in read_pulses(run_dir)}
