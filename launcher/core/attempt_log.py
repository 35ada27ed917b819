"""The run's record read as attempts: the one reader of ``attempt`` and ``attempt_ended`` events and what follows them.

An attempt is one start of the run's Slurm job (launcher/job/recovery.py records it): the first submission, or
a requeue or retry of it. The batch script's steps (which attempt this is, whether it was judged, which nodes
earlier attempts blamed or left out, how many retries are spent), ``runs`` (how many attempts, whether the last
one ended COMPLETED), ``describe`` (the attempts table, goodput attempt by attempt), ``logs`` (the ranks the
newest attempt blamed), a search's trial (whether its outcome is final), the state shown beside Slurm's
(launcher/status/job_state.py) and which metrics rows are the current attempt's (:class:`Current`: ``runs``'
progress, the console's curves) all read the record through :class:`AttemptLog`: no other module tests an event
for ``attempt`` or ``attempt_ended`` (tests/unit/test_architecture.py checks it), so what an attempt is has one
reader. Everything here is pure: typed events (launcher/core/events.py) in, answers out.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Set, Tuple, Type, TypeVar, Union

from launcher.core.events import (Attempt, AttemptEnded, Cancelled, Event, Failed, Finished, Moved, Outcome,
                                   Requeued, Resubmitted, Resumed, Retrying, Stalled, Started, Submitted, Watching)

E = TypeVar("E", bound=Event)
# The events that say where the run stands between attempts: begun, retrying, given up or done.
STANDING = (Attempt, Retrying, Failed, Finished)
# The events after which the run's job waits in the queue for its next attempt (the newest one before it counts).
QUEUED = (Submitted, Retrying, Resubmitted, Moved, Requeued, AttemptEnded)
# The events that name a new job for the run: the newest is the job its record names once it is rewritten.
SUBMITTING = (Submitted, Retrying, Resubmitted, Moved)
# The events after which the run goes on: an end recorded before one of them is not the run's.
GOING_ON = (Submitted, Started, Requeued, Resumed, Retrying, Resubmitted, Moved, Attempt)
# The events after which the run's job waits for an attempt that has not begun: its rows are not the next one's.
AWAITING = (Retrying, Resubmitted, Moved, Requeued)
# How an attempt ends that recovery answers with a retry or a verdict (launcher/job/recovery.py ``respond``).
FAILURES = (Outcome.FAILED, Outcome.STALLED, Outcome.LOST, Outcome.PREFLIGHT)


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
    cluster: Optional[str] = None  # the cluster of its job (None: a record of an older launcher, the run's)


@dataclass
class Span:
    """One attempt's part of the record: its ``attempt`` event, every event after it until the next attempt
    began (``during``, its ``attempt_ended`` among them), and that ``attempt_ended`` (None: not judged yet)."""

    began: Attempt
    during: List[Event] = field(default_factory=list)
    ended: Optional[AttemptEnded] = None


@dataclass(frozen=True)
class Current:
    """Which metrics rows are the current attempt's: those written since ``since`` (None: every row, a record
    without attempts), from the step it resumed at (``resumed_at``, 0 from scratch or not yet known). While the
    run's job waits for its next attempt (a retry, a resume, a requeue), ``since`` is when it began to wait, so no
    row is the current attempt's until that attempt logs one."""

    since: Optional[float] = None
    resumed_at: int = 0

    def holds(self, stamp: Optional[float]) -> bool:
        """Whether a row written at ``stamp`` is the current attempt's (a row without a time, written before rows
        had one, is taken as the current attempt's: nothing tells)."""
        return self.since is None or stamp is None or stamp >= self.since


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

    def unjudged(self) -> Optional[Attempt]:
        """The newest attempt when no ``attempt_ended`` followed it (its batch script has not judged it, or never
        could); None when there is none or it was judged."""
        attempt, since = self.this_attempt()
        return attempt if attempt and not any(isinstance(e, AttemptEnded) for e in since) else None

    def ended(self, *outcomes: Outcome) -> List[AttemptEnded]:
        """Every ``attempt_ended``, oldest first; where outcomes are given, those that ended so."""
        return [e for e in self.events if isinstance(e, AttemptEnded) and (not outcomes or e.outcome in outcomes)]

    def blames(self, *outcomes: Outcome) -> List[Tuple[str, Outcome]]:
        """Each node an attempt's end blamed (every node it names, else its one node) with that end's outcome, oldest
        first; where outcomes are given, of the attempts that ended so."""
        return [(node, e.outcome) for e in self.ended(*outcomes) for node in e.nodes or [e.node]
                if node and e.outcome is not None]

    def excluded(self) -> Set[str]:
        """Every node left out of the run so far: by a retry, or by Slurm's own requeue without a lost node."""
        return {node for e in self.events if isinstance(e, (Retrying, AttemptEnded)) for node in e.exclude or []}

    def retries(self) -> int:
        """The retries spent: those of a node's own fault (``free``) are not counted."""
        return sum(isinstance(e, Retrying) and not e.free for e in self.events)

    def current(self) -> Current:
        """Which rows are the current attempt's: the newest attempt's since it began, from the step its ranks
        resumed at; none while the run's job waits for its next attempt (:data:`AWAITING` after the newest one)."""
        attempt, since = self.this_attempt()
        if attempt is None:
            return Current()
        waiting = next((e for e in since if isinstance(e, AWAITING)), None)
        if waiting is not None:
            return Current(since=waiting.time)
        resumed = next((e for e in since if isinstance(e, Resumed)), None)
        return Current(since=attempt.time, resumed_at=(resumed.step or 0) if resumed else 0)

    def awaiting_retry(self) -> Optional[AttemptEnded]:
        """The newest attempt's end when it failed (:data:`FAILURES`) and neither a verdict nor its retry has been
        recorded yet: recovery is deciding (launcher/job/recovery.py); None otherwise."""
        _, since = self.this_attempt()
        ended = next((e for e in since if isinstance(e, AttemptEnded)), None)
        if ended is None or ended.outcome not in FAILURES:
            return None
        return None if any(isinstance(e, Retrying) or (isinstance(e, Failed) and e.final) for e in since) else ended

    def watching(self) -> Optional[Watching]:
        """The newest ``watching`` event: which job watches the run's newest job (its ``job_id``, as the run's record
        names it: ``A_i`` for a job array's element, whose attempt is recorded under the element's own job id) to
        judge its attempt should its batch step die; None when none was submitted."""
        return next((e for e in reversed(self.events) if isinstance(e, Watching)), None)

    def queued_since(self) -> Optional[float]:
        """When the run's job began to wait for its next attempt (its submission, a retry, a resume, a move, a
        requeue, an attempt's end), or None when an attempt began since."""
        for event in reversed(self.events):
            if isinstance(event, Attempt):
                return None
            if isinstance(event, QUEUED):
                return event.time
        return None

    def moves(self) -> List[Moved]:
        """The run's moves to another cluster, oldest first."""
        return [e for e in self.events if isinstance(e, Moved)]

    def since_resumed(self) -> "AttemptLog":
        """The record since the newest ``resubmitted`` (the user's ``launcher resume``), else all of it."""
        start = max((i for i, e in enumerate(self.events) if isinstance(e, Resubmitted)), default=-1) + 1
        return AttemptLog(self.events[start:])

    def verdict(self) -> Optional[Union[Failed, AttemptEnded]]:
        """What made the run's outcome final in its newest attempt (the newest of these): a ``failed`` verdict, or
        that attempt's end COMPLETED or CANCELLED; None while the run may go on (a retry or requeue on its way)."""
        _, since = self.this_attempt()
        for event in reversed(since):
            if isinstance(event, Failed) and event.final:
                return event
            if isinstance(event, AttemptEnded) and event.outcome in (Outcome.COMPLETED, Outcome.CANCELLED):
                return event
        return None

    def ending(self) -> Optional[Union[Finished, Failed, Cancelled, AttemptEnded]]:
        """The event by which the record says the run ended, the newest: ``finished``, a ``failed`` verdict (or a
        rank's own failure where no attempt was recorded to judge it), ``cancelled``, or an attempt's end
        CANCELLED; None when an event after it says the run goes on (:data:`GOING_ON`)."""
        judged = self.count > 0
        for event in reversed(self.events):
            if isinstance(event, (Finished, Cancelled)) or (isinstance(event, Failed) and (event.final or not judged)):
                return event
            if isinstance(event, AttemptEnded) and event.outcome == Outcome.CANCELLED:
                return event
            if isinstance(event, GOING_ON):
                return None
        return None

    def stopped(self) -> Optional[AttemptEnded]:
        """The newest attempt's end when it was stopped or cancelled (launcher/job/endings.py), else None."""
        ended = self.newest(Attempt, AttemptEnded)
        return ended if isinstance(ended, AttemptEnded) and ended.outcome == Outcome.CANCELLED else None

    def blamed_ranks(self) -> List[int]:
        """The ranks the newest attempt blamed: those that raised, the frozen ones, the one its end named."""
        _, since = self.this_attempt()
        ranks: Set[int] = set()
        for event in since:
            if isinstance(event, (Failed, AttemptEnded)) and isinstance(event.rank, int):
                ranks.add(event.rank)
            elif isinstance(event, Stalled):
                ranks.update(rank for rank in event.ranks if isinstance(rank, int))
        return sorted(ranks)

    def spans(self) -> List[Span]:
        """The record attempt by attempt, oldest first (what came before the first attempt belongs to none)."""
        spans: List[Span] = []
        for event in self.events:
            if isinstance(event, Attempt):
                spans.append(Span(event))
            elif spans:
                spans[-1].during.append(event)
                if isinstance(event, AttemptEnded):
                    spans[-1].ended = event
        return spans

    def history(self) -> List[AttemptRow]:
        """One row per attempt: its job, nodes, start and end, outcome, cause, and what came next."""
        rows: List[AttemptRow] = []
        queued: Optional[float] = None  # since when the job waits for the next attempt
        for event in self.events:
            if isinstance(event, QUEUED):
                queued = event.time
            if isinstance(event, Attempt):
                rows.append(AttemptRow(event.attempt, event.job_id, event.nodes, event.time,
                                       queued_s=None if queued is None else max(0.0, event.time - queued),
                                       cluster=event.cluster))
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
