"""A run's growing files read from where the last read ended: its metrics (whole rows only) and a rank's log.

The web console follows them while a run trains (launcher/console/readers.py), here and on a cluster reached over
SSH (launcher/remote/agent.py ``follow``): each refresh reads only the bytes written since, so a 100,000-step run's
metrics are read once, then a line at a time. A rank's log holds every attempt of the run one after the other:
:func:`with_attempts` marks where each begins, for the console and ``launcher logs``.
"""
from __future__ import annotations

import re
import time
from pathlib import Path
from typing import List, Optional, Tuple

from launcher.core.attempt_log import AttemptLog
from launcher.core.events import Attempt
from launcher.core.metrics import Row, parse
from launcher.core.rundir import read_events

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


# The line a rank logs first at each start (launcher/train/dist.py ``init_distributed``), stamped by the logger in
# local time (launcher/train/task.py ``setup_logging``): where an attempt's part of a rank's log begins.
RANK_START = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ rank\d+ INFO "
                        r"launcher\.train\.dist: rank \d+/\d+ local ", re.M)
CLOCK_SLACK_S = 5  # a node's clock this far ahead of the one that recorded the attempt still names it


def with_attempts(text: str, run_dir: Path) -> str:
    """A rank log's ``text`` with a line before each rank start in it naming the attempt it began (the newest of the
    run's attempts begun by then), so that one attempt's lines never run into the next unmarked. The run's events
    are read only where a rank starts in ``text``."""
    if not RANK_START.search(text):
        return text
    attempts = attempts_of(run_dir)

    def marked(start: re.Match) -> str:
        when = time.mktime(time.strptime(start.group(1), "%Y-%m-%d %H:%M:%S"))
        begun = [a for a in attempts if a.time <= when + CLOCK_SLACK_S]
        return f"==== {attempt_name(begun[-1]) if begun else 'a new attempt'} ====\n{start.group(0)}"
    return RANK_START.sub(marked, text)


def attempts_of(run_dir: Path) -> List[Attempt]:
    """The run's attempts as its events recorded their starts."""
    return [span.began for span in AttemptLog(read_events(run_dir)).spans()]


def attempt_name(attempt: Attempt) -> str:
    """``attempt 2 (job 41)``, and Slurm's restart count of a requeued job."""
    restart = f", Slurm's restart {attempt.restart}" if attempt.restart else ""
    return f"attempt {attempt.attempt} (job {attempt.job_id}{restart})"
