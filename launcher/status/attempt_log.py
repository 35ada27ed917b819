"""The event log read as attempts: the one reader of ``attempt`` and ``attempt_ended`` events and what follows them.

An attempt is one start of the run's Slurm job (launcher/job/recovery.py records it): the first submission, or
a requeue or retry of it. The batch script's steps (which attempt this is, what it recorded so far), ``runs``
(how many attempts, whether the last one ended COMPLETED), ``describe`` (the attempts table) and the state
shown beside Slurm's (launcher/status/job_state.py) all read the log through :class:`AttemptLog`.
Everything here is pure: events in, answers out.
"""
from __future__ import annotations

from typing import Iterable, List, Optional, Sequence, Tuple

ATTEMPT = "attempt"
ENDED = "attempt_ended"
# The events that say where the run stands between attempts: begun, retrying, given up or done.
STANDING = ("attempt", "retrying", "failed", "finished")


class AttemptLog:
    """A run's events (oldest first) as attempts."""

    def __init__(self, events: Sequence[dict]):
        self.events = events

    def this_attempt(self) -> Tuple[Optional[dict], List[dict]]:
        """The newest ``attempt`` event and every event after it (no attempt yet: None and every event)."""
        for index in range(len(self.events) - 1, -1, -1):
            if self.events[index].get("event") == ATTEMPT:
                return self.events[index], list(self.events[index + 1:])
        return None, list(self.events)

    @property
    def count(self) -> int:
        """How many attempts began: the first start of the run's job, and each requeue or retry."""
        return sum(e.get("event") == ATTEMPT for e in self.events)

    def newest(self, kinds: Iterable[str]) -> dict:
        """The newest event of one of these kinds ({} if none)."""
        kinds = set(kinds)
        return next((e for e in reversed(self.events) if e.get("event") in kinds), {})

    def standing(self) -> dict:
        """The newest of the events that say where the run stands: an attempt begun, a retry pending, the
        run given up (a ``failed`` verdict, or a rank's own failure) or finished."""
        return self.newest(STANDING)

    def last_ended(self) -> dict:
        """The newest ``attempt_ended`` event ({} if no attempt was judged yet)."""
        return self.newest((ENDED,))

    def ended_complete(self) -> bool:
        """Whether the newest attempt ended COMPLETED: every step trained and its batch script done."""
        last = self.newest((ATTEMPT, ENDED))
        return last.get("event") == ENDED and last.get("outcome") == "COMPLETED"

    def history(self) -> List[dict]:
        """One row per attempt: its job, nodes, start and end, outcome, cause, and what came next."""
        rows: List[dict] = []
        for event in self.events:
            kind = event.get("event")
            if kind == ATTEMPT:
                rows.append({"attempt": event.get("attempt"), "job_id": event.get("job_id"),
                             "nodes": event.get("nodes"), "start": event.get("time"), "end": None,
                             "outcome": "RUNNING", "cause": "", "then": ""})
            elif rows and kind == ENDED:
                rows[-1].update(end=event.get("time"), outcome=event.get("outcome", "?"), cause=event.get("cause", ""))
                if event.get("exclude"):  # a lost node: Slurm requeued the job itself, without it
                    rows[-1]["then"] = f"requeued by Slurm, excluding {','.join(event['exclude'])}"
            elif rows and kind == "retrying":
                excluded = f", excluding {','.join(event['exclude'])}" if event.get("exclude") else ""
                allowed = f", allowed again: {','.join(event['allowed'])} (too few nodes otherwise)" \
                    if event.get("allowed") else ""
                free = " (the node's fault: no retry spent)" if event.get("free") else ""
                rows[-1]["then"] = f"retried as job {event.get('job_id')}{excluded}{allowed}{free}"
            elif rows and kind == "failed" and event.get("final"):
                rows[-1]["then"] = f"gave up: {event.get('reason', '')}"
        return rows


def history(events: Sequence[dict]) -> List[dict]:
    """The attempts table: one row per attempt (see :meth:`AttemptLog.history`)."""
    return AttemptLog(events).history()
