"""Show a run's progress in Slurm itself: the job's Comment, as squeue/sacct print it.

``scontrol update`` is a round trip to slurmctld that can take seconds on a busy
cluster, so it runs in a daemon thread that is handed the latest text and sends
it at most every ``min_interval_s``; the training loop only swaps a string.
"""
from __future__ import annotations

import logging
import os
import subprocess
import threading

log = logging.getLogger(__name__)


class JobComment:
    """Keeps Slurm job ``job_id``'s Comment set to the latest text given to :meth:`update`.

    With ``job_id`` None (not under Slurm, or not rank 0) it does nothing.
    """

    def __init__(self, job_id: str | None, min_interval_s: float = 5.0):
        self.job_id = job_id
        self.min_interval_s = min_interval_s
        self._latest: str | None = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = None
        if job_id is not None:
            self._thread = threading.Thread(target=self._run, name="slurm-job-comment", daemon=True)
            self._thread.start()

    def update(self, text: str) -> None:
        """Make ``text`` the next comment to send; returns at once."""
        if self._thread is None:
            return
        with self._lock:
            self._latest = text
        self._wake.set()

    def close(self, timeout_s: float = 10.0) -> None:
        """Send the last text if not yet sent, then stop (waiting at most ``timeout_s``)."""
        if self._thread is None:
            return
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout_s)

    def _take(self) -> str | None:
        with self._lock:
            text, self._latest = self._latest, None
        return text

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            text = self._take()
            if text is not None:
                self._send(text)
            if self._stop.is_set():
                text = self._take()  # whatever arrived while sending
                if text is not None:
                    self._send(text)
                return
            self._stop.wait(self.min_interval_s)  # the rate limit; close() cuts it short

    def _send(self, text: str) -> None:
        cmd = ["scontrol", "update", f"JobId={self.job_id}", f"Comment={text}"]
        try:
            result = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError) as e:
            log.warning("could not set the job comment: %s", e)
            return
        if result.returncode != 0:
            log.warning("could not set the job comment: %s", result.stderr.strip())


def job_comment(is_main: bool) -> JobComment:
    """The comment keeper for this process: active only on rank 0 of a Slurm job."""
    job_id = os.environ.get("SLURM_JOB_ID") if is_main else None
    return JobComment(job_id)
