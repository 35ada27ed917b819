"""Heartbeats: where each rank's watchdog (launcher/train/watchdog.py) says it is alive and on which step.

Between the ranks of one node, through node-local state: each rank replaces its pulse in a folder of the job's in
this user's private folder of the node's memory (``/dev/shm/launcher-<uid>/<run>-<job>-<node>/rank_<N>.json``,
launcher/core/nodelocal.py: no other user can plant a name there), which the node's other ranks read to find a
neighbour stopped. Beyond the node, through one file per node in the run directory on the shared file
system, ``heartbeats/node_<node>.json``: the node's lowest live rank rewrites it in place each beat with every
pulse of the node, so the shared file system sees one write per node per beat and no create, rename or unlink
(at 1,024 ranks of 8 a node that is 64 writes a second where a file per rank would take 512 creates and 512 renames:
docs/performance.md). Ranks of other nodes read it to name a frozen rank, and the launcher to show a stalled run
and to know the step a rank that died had reached. A run written by an older launcher has ``rank_<N>.json``
files there instead, read the same way.
"""
from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence

from launcher.core.nodelocal import PREFIX, Folder, sweep

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


def node_path(run_dir: Path, node: str) -> Path:
    """The node's heartbeat file in the run directory: every rank of the node, rewritten in place each beat."""
    return Path(run_dir) / HEARTBEATS / f"node_{node}.json"


def local_name(run_dir: Path, job_id: str, node: str) -> str:
    """The name of the folder of this run's job's pulses on ``node``, in this user's node-local folder: keyed by
    run, job and node (the local cluster's virtual nodes share one machine)."""
    run = hashlib.sha1(str(Path(run_dir).absolute()).encode()).hexdigest()[:12]
    return f"{run}-{job_id}-{node}"


_LOCAL_NAME = re.compile(r"[0-9a-f]{12}-.+")  # local_name's, which the sweep looks into (nothing else of the folder)


def pulse_name(rank: int) -> str:
    return f"rank_{rank:05d}.json"


ORPHAN_S = 60.0  # a node-local folder with no pulse is left alone this long after its last change
BLOCK = 4096  # a node file is written as whole blocks of this size, padded with spaces


def encode_node(node: str, pulses: Sequence[Pulse], written: float) -> bytes:
    """A node file's bytes: JSON, padded with spaces to whole blocks so that a rewrite in place covers what the
    last one wrote (a reader takes the first JSON value and ignores the padding)."""
    text = json.dumps({"node": node, "written": written, "pulses": [asdict(p) for p in pulses]}).encode() + b"\n"
    return text + b" " * (-len(text) % BLOCK)


def read_local(folder: Folder, ranks: Optional[Sequence[int]] = None) -> List[Pulse]:
    """The pulses in a node-local folder (those of ``ranks`` where given); none once the folder is gone, even while
    it is being listed (another rank of the node sweeping it as it starts)."""
    names = sorted(n for n in folder.names() if n.startswith("rank_") and n.endswith(".json")) \
        if ranks is None else [pulse_name(r) for r in ranks]
    return [pulse for pulse in (_pulse(folder.read(name)) for name in names) if pulse is not None]


def read_pulses(run_dir: Path, since: Optional[float] = None, ranks: Optional[Sequence[int]] = None) -> List[Pulse]:
    """Every rank's last heartbeat, from the node files (and an older launcher's rank files), or those of
    ``ranks``; with ``since``, only those written since then (this attempt's: a rank that died before its
    watchdog began leaves the previous attempt's pulse, which says nothing about this one). A file being
    rewritten is read again; one still unreadable is skipped."""
    folder = Path(run_dir) / HEARTBEATS
    pulses = [p for path in sorted(folder.glob("node_*.json")) for p in _node_file(path)]
    pulses += [p for p in map(_pulse_file, sorted(folder.glob("rank_*.json"))) if p is not None]
    newest: Dict[int, Pulse] = {}
    for pulse in pulses:  # a rank that moved node between attempts: its newest pulse
        if pulse.rank not in newest or pulse.alive > newest[pulse.rank].alive:
            newest[pulse.rank] = pulse
    return [p for rank, p in sorted(newest.items())
            if (ranks is None or rank in ranks) and (since is None or p.alive >= since)]


def _node_file(path: Path) -> List[Pulse]:
    for _ in range(3):
        try:
            value, _ = json.JSONDecoder().raw_decode(path.read_text().lstrip())
            return [Pulse(**pulse) for pulse in value["pulses"]]
        except (ValueError, TypeError, KeyError):
            continue  # caught mid-rewrite
        except OSError:
            return []
    return []


def _pulse_file(path: Path) -> Optional[Pulse]:
    try:
        return _pulse(path.read_bytes())
    except OSError:
        return None  # not there, or being replaced


def _pulse(data: Optional[bytes]) -> Optional[Pulse]:
    try:
        return Pulse(**json.loads(data)) if data is not None else None
    except (ValueError, TypeError):
        return None  # being replaced


def sweep_local(alive: Callable[[int], bool] = lambda pid: Path(f"/proc/{pid}").exists()) -> None:
    """Remove this user's node-local folders of pulses whose ranks are all gone (a job whose ranks were killed
    leaves its folder: a rank's normal end removes its own pulse, the last one the folder); a folder with no pulse
    is left alone :data:`ORPHAN_S` after its last change (a starting rank's, before its first pulse). Only this
    user's folders, never through a link (launcher/core/nodelocal.py)."""
    def unused(folder: Folder) -> bool:
        if not (_LOCAL_NAME.fullmatch(folder.path.name) or folder.path.name.startswith(PREFIX)):
            return False  # not a job's folder of pulses (a compile cache beside them, launcher/train/task.py)
        pulses = read_local(folder)
        return (bool(pulses) or folder.age() >= ORPHAN_S) and not any(alive(p.pid) for p in pulses)

    sweep(unused)


def stalled_for(run_dir: Path, limit: Optional[float], step_time: Optional[float], now: float) -> Optional[float]:
    """Seconds since any rank began a step, when that is longer than the stall limit (the configured one,
    else derived from ``step_time``); None while the run advances or has no heartbeat."""
    pulses = read_pulses(run_dir)
    if not pulses:
        return None
    idle = now - max(p.step_since for p in pulses)
    allowed = limit or (derived_timeout(step_time) if step_time else STALL_FLOOR_S)
    return idle if idle > allowed else None
