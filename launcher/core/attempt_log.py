"""The run's record read as attempts: the one reader of ``attempt`` and ``attempt_ended`` events and what follows them.

An attempt is one start of the run's Slurm job (launcher/job/recovery.py records it): the first submission, or
a requeue or retry of it. The batch script's steps (which attempt this is, what it recorded so far), ``runs``
(how many attempts, whether the last one ended COMPLETED), ``describe`` (the attempts table), a search's
trial (whether its outcome is final) and the state shown beside Slurm's (launcher/status/job_state.py) all read
the record through :class:`AttemptLog`. Everything here is pure: typed events (launcher/core/events.py) in,
answers out.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple, Type, TypeVar

from launcher.core.events import (Attempt, AttemptEnded, Event, Failed, Finished, Outcome, Requeued, Resubmitted,
                                   Retrying, Submitted)

E = TypeVar("E", bound=Event)
# The events that say where the run stands between attempts: begun, retrying, given up or done.
STANDING = (Attempt, Retrying, Failed, Finished)
# The events after which the run's job waits in the queue for its next attempt (the newest one before it counts).
QUEUED = (Submitted, Retrying, Resubmitted, Requeued, AttemptEnded)


@dataclass
class AttemptRow:
    """One row of the attempts table."""

    attempt: Optional[int]
    job_id: Optional[str]
    nodes: Optional[str]
    start: float
    end: Optional[float] = None
    outcome: str = "RUNNING"
    cause: str = ""
    then: str = ""
    queued_s: Optional[float] = None  # how long its job waited in the queue before the attempt began


class AttemptLog:
    """A run's events (oldest first) as attempts."""

    def __init__(self, events: Sequence[Event]):
        self.events = events

    def this_attempt(self) -> Tuple[Optional[Attempt], List[Event]]:
        """The newest ``attempt`` event and every event after it (no attempt yet: None and every event)."""
        for index in range(len(self.events) - 1, -1, -1):
            event = self.events[index]
            if isinstance(event, Attempt):
                return event, list(self.events[index + 1:])
        return None, list(self.events)

    @property
    def count(self) -> int:
        """How many attempts began: the first start of the run's job, and each requeue or retry."""
        return sum(isinstance(e, Attempt) for e in self.events)

    def newest(self, *kinds: Type[E]) -> Optional[E]:
        """The newest event of one of these kinds (None if none)."""
        return next((e for e in reversed(self.events) if isinstance(e, kinds)), None)  # type: ignore[return-value]

    def standing(self) -> Optional[Event]:
        """The newest of the events that say where the run stands: an attempt begun, a retry pending, the
        run given up (a ``failed`` verdict, or a rank's own failure) or finished."""
        return self.newest(*STANDING)

    def last_ended(self) -> Optional[AttemptEnded]:
        """The newest ``attempt_ended`` event (None if no attempt was judged yet)."""
        return self.newest(AttemptEnded)

    def ended_complete(self) -> bool:
        """Whether the newest attempt ended COMPLETED: every step trained and its batch script done."""
        last = self.newest(Attempt, AttemptEnded)
        return isinstance(last, AttemptEnded) and last.outcome == Outcome.COMPLETED

    def history(self) -> List[AttemptRow]:
        """One row per attempt: its job, nodes, start and end, outcome, cause, and what came next."""
        rows: List[AttemptRow] = []
        queued: Optional[float] = None  # since when the job waits for the next attempt
        for event in self.events:
            if isinstance(event, QUEUED):
                queued = event.time
            if isinstance(event, Attempt):
                rows.append(AttemptRow(event.attempt, event.job_id, event.nodes, event.time,
                                       queued_s=None if queued is None else max(0.0, event.time - queued)))
                queued = None
            elif not rows:
                continue
            elif isinstance(event, AttemptEnded):
                row = rows[-1]
                row.end, row.outcome, row.cause = event.time, str(event.outcome or "?"), event.cause or ""
                if event.exclude:  # a lost node: Slurm requeued the job itself, without it
                    row.then = f"requeued by Slurm, excluding {','.join(event.exclude)}"
            elif isinstance(event, Retrying):
                held = event.left_out or {}  # a node Slurm holds: its state and reason ("drained: trial")
                shown = [node + (f" ({held[node]})" if node in held else "") for node in event.exclude]
                excluded = f", excluding {','.join(shown)}" if event.exclude else ""
                allowed = f", allowed again: {','.join(event.allowed)} (too few nodes otherwise)" \
                    if event.allowed else ""
                free = " (the node's fault: no retry spent)" if event.free else ""
                rows[-1].then = f"retried as job {event.job_id}{excluded}{allowed}{free}"
            elif isinstance(event, Failed) and event.final:
                rows[-1].then = f"gave up: {event.reason or ''}"
        return rows
