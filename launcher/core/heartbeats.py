"""Each rank's heartbeat file, ``heartbeats/rank_<N>.json`` in the run directory: written by the rank's
watchdog (launcher/train/watchdog.py), read by the watchdogs of other ranks to name a frozen one, and by the
launcher to show a stalled run and to know the step a rank that died had reached."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

HEARTBEATS = "heartbeats"
STALL_FLOOR_S = 300.0  # a limit derived from the step time never goes below this
STEP_TIMES = 20  # a step this many times slower than the measured step time is a hang
SLOW_PHASE_S = 900.0  # the first step (data, compile) and a checkpoint save may take this long
# A rank's exit status when its watchdog ended a stalled attempt (EX_TEMPFAIL: the run may go on elsewhere). It
# says the rank's watchdog fired, not that the rank is the one that hung (launcher/job/attempts.py).
EXIT_STALLED = 75


def derived_timeout(step_time: float) -> float:
    """The stall limit when ``train.stall_timeout_s`` is not set: generous against the measured step time."""
    return max(STALL_FLOOR_S, STEP_TIMES * step_time)


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


def read_pulses(run_dir: Path, since: Optional[float] = None, ranks: Optional[Sequence[int]] = None) -> List[Pulse]:
    """Every rank's last heartbeat (an unreadable file is skipped: a rank may be replacing it), or those of
    ``ranks``; with ``since``, only those written since then (this attempt's: a rank that died before its
    watchdog began leaves the previous attempt's file, which says nothing about this one)."""
    pulses = []
    paths = sorted((Path(run_dir) / HEARTBEATS).glob("rank_*.json")) if ranks is None else \
        [heartbeat_path(run_dir, rank) for rank in ranks]
    for path in paths:
        try:
            pulse = Pulse(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if since is None or pulse.alive >= since:
            pulses.append(pulse)
    return pulses


def steps_by_rank(run_dir: Path) -> Dict[int, int]:
    return {pulse.rank: pulse.step for pulse in read_pulses(run_dir)}


def stalled_for(run_dir: Path, limit: Optional[float], step_time: Optional[float], now: float) -> Optional[float]:
    """Seconds since any rank began a step, when that is longer than the stall limit (the configured one,
    else derived from ``step_time``); None while the run advances or has no heartbeat."""
    pulses = read_pulses(run_dir)
    if not pulses:
        return None
    idle = now - max(p.step_since for p in pulses)
    allowed = limit or (derived_timeout(step_time) if step_time else STALL_FLOOR_S)
    return idle if idle > allowed else None
