"""Goodput: the fraction of a run's wall time since submission that trained steps it kept, and where the rest
went. ``describe`` shows it; scripts/bench_goodput.py compares a run under faults with one without.

It is read from the run's own record alone (events and timed metrics rows, pure: no Slurm), attempt by
attempt (an attempt is one start of the run's job, launcher/core/attempt_log.py):

- **queue**: from the submission, or the previous attempt's end, to the attempt's start (sbatch, the
  scheduler, a requeued job's begin time);
- **start-up**: from the attempt's start to its first step (imports, preflight, the model, the checkpoint);
- **training**: its steps, at the run's median step time: *kept* once a checkpoint holds them (a later attempt
  resumed from it, or it is saved) or the run finished; **re-trained** when a later attempt started from an
  earlier checkpoint, or the attempt ended after its newest checkpoint; **not saved yet** while the attempt
  that trained them runs on (a part shown only then);
- **checkpoints and evaluation**: the rest of the time between its first and its last metrics row;
- **detection and ending**: from its last metrics row to its end (a fault noticed and the ranks ended; for
  the last attempt, the final checkpoint).

The parts are estimates from rows written every ``train.log_every`` steps; they add up to the wall time
but for rounding.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from launcher.core.attempt_log import AWAITING, AttemptLog
from launcher.core.events import Event, Finished, Requeued, Resumed, Started, Submitted
from launcher.core.metrics import FinalRow, Row

# The parts of the time not spent on kept steps, in the order they are shown.
LOST = ("queue", "start-up", "re-trained", "checkpoints and evaluation", "detection and ending")
UNSAVED = "not saved yet"  # the running attempt's steps after its newest checkpoint: a part only while there are some


@dataclass(frozen=True)
class Goodput:
    wall_s: float
    kept_s: float
    lost_s: Dict[str, float] = field(default_factory=dict)

    @property
    def fraction(self) -> float:
        return self.kept_s / self.wall_s if self.wall_s > 0 else 0.0

    def line(self) -> str:
        """``Goodput: 0.87 of 483 s since submission trained kept steps; lost: queue 45 s, ...``"""
        lost = ", ".join(f"{part} {seconds:.0f} s" for part, seconds in self.lost_s.items() if seconds >= 0.5)
        return (f"Goodput: {self.fraction:.2f} of {self.wall_s:.0f} s since submission trained kept steps"
                + (f"; lost: {lost}" if lost else ""))


@dataclass
class _Attempt:
    begin: float
    start_step: int = 0
    first_step: Optional[float] = None  # when its first step began (its resume, or its start)
    rows: List[Row] = field(default_factory=list)  # its timed metrics rows
    end: Optional[float] = None
    end_step: Optional[int] = None
    finished: bool = False  # it trained the last step: every step it reached is kept
    over: bool = False  # it ended, or the run's job went on to wait for another attempt

    def kept_until(self, reached: int, saved: Sequence[int]) -> int:
        """The step up to which this attempt's steps are kept when no later attempt resumed from them: every step
        reached once it finished, else its newest checkpoint's (``saved``: the run's checkpoints' steps)."""
        return reached if self.finished else max([s for s in saved if s <= reached], default=self.start_step)


def goodput(events: Sequence[Event], metrics: Sequence[Row], now: float,
            saved: Sequence[int] = ()) -> Optional[Goodput]:
    """The run's goodput up to its last attempt's end (``now`` while an attempt runs); None before any attempt
    or before its first metrics row. ``saved``: the steps of the run's complete checkpoints."""
    submitted = next((e.time for e in events if isinstance(e, Submitted)), None)
    timed = [row for row in metrics if row.time is not None and not isinstance(row, FinalRow)]
    attempts = _attempts(events, timed)
    if submitted is None or not attempts or not timed:
        return None
    step_time = statistics.median(row.step_time for row in timed if row.step_time)
    lost = dict.fromkeys(LOST, 0.0)
    kept_steps = 0
    previous_end = submitted
    for index, attempt in enumerate(attempts):
        end = attempt.end if attempt.end is not None else now
        lost["queue"] += max(0.0, attempt.begin - previous_end)
        previous_end = end
        reached = max([attempt.end_step or 0, *(row.step for row in attempt.rows)], default=attempt.start_step)
        trained = max(0, reached - attempt.start_step)
        if attempt.first_step is None or not attempt.rows:  # it never trained: all of it went to starting
            lost["start-up"] += max(0.0, end - attempt.begin)
            lost["re-trained"] += trained * step_time
            continue
        lost["start-up"] += max(0.0, attempt.first_step - attempt.begin)
        following = attempts[index + 1] if index + 1 < len(attempts) else None
        later = following.start_step if following else attempt.kept_until(reached, saved)
        kept = max(0, min(reached, later) - attempt.start_step)
        kept_steps += kept
        unsaved = UNSAVED if following is None and not attempt.over else "re-trained"
        lost[unsaved] = lost.get(unsaved, 0.0) + (trained - kept) * step_time
        last = attempt.rows[-1].time
        lost["checkpoints and evaluation"] += max(0.0, last - attempt.first_step - trained * step_time)
        lost["detection and ending"] += max(0.0, end - last)
    return Goodput(wall_s=previous_end - submitted, kept_s=kept_steps * step_time,
                   lost_s={part: s for part, s in lost.items() if part != UNSAVED or s > 0})


def _attempts(events: Sequence[Event], timed: Sequence[Row]) -> List[_Attempt]:
    attempts: List[_Attempt] = []
    for span in AttemptLog(events).spans():
        attempt = _Attempt(begin=span.began.time)
        attempts.append(attempt)
        for event in span.during:
            if isinstance(event, Resumed):
                attempt.start_step, attempt.first_step = event.step or 0, event.time
            elif isinstance(event, Started) and attempt.first_step is None:
                attempt.first_step = event.time
            elif isinstance(event, (Finished, Requeued)) and isinstance(event.step, int):
                attempt.end_step = event.step
            attempt.finished = attempt.finished or isinstance(event, Finished)
            attempt.over = attempt.over or isinstance(event, AWAITING)
        if span.ended is not None:
            attempt.over = True
            attempt.end = span.ended.time
            if attempt.end_step is None and isinstance(span.ended.step, int):
                attempt.end_step = span.ended.step
    for attempt, following in zip(attempts, [*attempts[1:], None]):
        until = following.begin if following else float("inf")
        attempt.rows = [row for row in timed if attempt.begin <= row.time < until]
    return attempts
