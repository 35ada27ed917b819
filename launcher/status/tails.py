"""A run's growing files read from where the last read ended: its metrics (whole rows only) and a rank's log.

The web console follows them while a run trains (launcher/console/readers.py), here and on a cluster reached over
SSH (launcher/remote/agent.py ``follow``): each refresh reads only the bytes written since, so a 100,000-step run's
metrics are read once, then a line at a time.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, Optional, Tuple

from launcher.core.metrics import Row, parse

LOG_TAIL_BYTES = 64 * 1024  # what a log's first look reads: its end


def rank_log(run_dir: Path, job_id: Optional[str], rank: int, err: bool = False) -> Path:
    """Rank ``rank``'s log: its own ``logs/rank_N.log``, or submitit's raw stdout/stderr of that task.

    submitit's files also hold what a task printed before logging was set up (an import error, say), so
    they stand in while the rank log does not exist yet.
    """
    raw = run_dir / "submitit" / f"{job_id}_{rank}_log.{'err' if err else 'out'}"
    own = run_dir / "logs" / f"rank_{rank}.log"
    return raw if err or not own.exists() else own


def new_rows(path: Path, offset: int) -> Tuple[Optional[List[Row]], int]:
    """The metrics rows appended to ``path`` since ``offset`` (launcher/core/metrics.py) and the offset to read from
    next; None for the rows when the file is shorter than ``offset`` (rewritten: read it again from 0). A partial
    last line waits for its end; a damaged line is skipped (the status commands warn of it)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return [], 0
    if size < offset:
        return None, 0
    with path.open("rb") as handle:
        handle.seek(offset)
        chunk = handle.read(size - offset)
    done = chunk.rfind(b"\n") + 1
    return [row for row in map(parse, chunk[:done].splitlines()) if row is not None], offset + done


def log_from(path: Path, offset: Optional[int]) -> dict:
    """The log's text from ``offset`` (None, or past its end: its last LOG_TAIL_BYTES) and the offset to ask from
    next, with its path, and ``missing`` while it does not exist yet."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return {"text": "", "offset": 0, "path": str(path), "missing": True}
    start = max(0, size - LOG_TAIL_BYTES) if offset is None or offset > size else offset
    with path.open("rb") as handle:
        handle.seek(start)
        text = handle.read(size - start).decode("utf-8", "replace")
    return {"text": text, "offset": size, "path": str(path), "missing": False}
