"""Show a run's progress in Slurm itself: the job's Comment, as squeue and sacct print it.

The batch script starts this beside the ranks, on the batch host (launcher/slurm/batch.py)::

    python -m launcher.job.comment RUN_DIR &

It follows rank 0's metrics.jsonl and sets the comment to its newest record ("step 40/120 loss 3.214 tok/s
5120", then "done 120/120 loss 2.754"). It runs on the host, not in a rank, because the ranks may run in a
container that has no Slurm client or munge (pyxis/enroot images rarely do), and because ``scontrol update``
is a round trip to the controller that a training step must never wait for.

Each update is an RPC that takes the controller's job write lock, so at scale it is the tool's main cost to
slurmctld (docs/performance.md, "what one run costs"): it is sent at each change of state at once (the first
record of an attempt: started or requeued; the final one: finished) and otherwise at most every ``EVERY_S``
seconds, one per running job per minute. A site turns it off with ``cluster.progress_comment: false``. It ends
with the batch shell that started it.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Optional

from launcher.core.config import load_run_config
from launcher.core.metrics import FinalRow, Row
from launcher.core.rundir import METRICS, last_metrics
from launcher.slurm.client import Slurm
from launcher.slurm.output import SlurmError

EVERY_S = 60.0  # the most often one job asks the controller, between changes of state
POLL_S = 5.0  # how often the metrics file's size is looked at (no read while it is unchanged)
PARENT_S = 1.0  # how often the batch shell is looked for (a system call, no file system)


def comment_text(row: Optional[Row], steps: int) -> Optional[str]:
    """What squeue shows for the newest metrics row (None before the first)."""
    if row is None or row.loss is None:
        return None
    if isinstance(row, FinalRow):
        return f"done {row.step}/{steps} loss {row.loss:.3f}"
    text = f"step {row.step}/{steps} loss {row.loss:.3f}"
    return f"{text} tok/s {row.tokens_per_s:.0f}" if row.tokens_per_s is not None else text


def follow(run_dir: Path, job_id: str, steps: int, every_s: float = EVERY_S, poll_s: float = POLL_S,
           send: Optional[Callable[[str, str], None]] = None, clock: Callable[[], float] = time.monotonic,
           sleep: Callable[[float], None] = time.sleep) -> None:
    """Keep job ``job_id``'s comment at the run's newest metrics record until the run's final record is sent
    or the process that started this one (the batch shell) has ended. ``send`` (scontrol's update by default),
    ``clock`` and ``sleep`` are the test's to replace."""
    send = send or Slurm(None, timeout=30).set_comment
    parent, metrics = os.getppid(), Path(run_dir) / METRICS
    seen, text, final, sent, sent_at, warned = -1, None, False, None, float("-inf"), False
    while True:
        shell_alive = os.getppid() == parent
        try:
            size = metrics.stat().st_size
        except OSError:
            size = None
        if size != seen:
            seen = size
            row = last_metrics(run_dir)
            text = comment_text(row, steps)
            final = isinstance(row, FinalRow)
        if text is not None and text != sent and (final or not shell_alive or clock() - sent_at >= every_s):
            try:
                send(job_id, text)
                sent = text
            except SlurmError as err:
                if not warned:  # once: the comment is a convenience, the run goes on without it
                    print(f"launcher.job.comment: cannot set the job's comment: {err}", file=sys.stderr)
                    warned = True
            sent_at = clock()
        if not shell_alive or (final and text == sent):
            return
        looked = clock()
        while clock() - looked < poll_s and os.getppid() == parent:
            sleep(min(PARENT_S, poll_s))


def main(argv: list) -> int:
    job_id = os.environ.get("SLURM_JOB_ID")
    if len(argv) != 1 or not job_id:
        print("usage: python -m launcher.job.comment RUN_DIR (inside a Slurm job)", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    try:
        follow(run_dir, job_id, load_run_config(run_dir / "config.yaml").train.steps)
    except (OSError, ValueError) as err:  # the run directory gone or its config unreadable: no comment, no harm
        print(f"launcher.job.comment: {err}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
