"""A run's curves as types: one dataclass per kind of row in ``metrics.jsonl``, and the codec to and from a line.

Every row is a step's (:class:`Row`); an evaluation's (:class:`EvalRow`) has its held-out loss set, and the final
row (:class:`FinalRow`) adds the attempt's summary. Rank 0 builds them (launcher/train/loop.py) and appends them
with :func:`launcher.core.rundir.append_metrics`; every reader gets them typed, from
:func:`launcher.core.rundir.read_metrics`, ``last_metrics`` or launcher/status/tails.py's ``new_rows``, and reads
their fields, never a line's keys. A line stays the JSON object it always was: the row's fields by name, ``time``
(when it was written: goodput's timeline) and, on the final row, ``"final": true``. A field the writer left unset
is written as null, so a reader finds every field of its row. A key these types do not declare is kept (``extra``)
and written back unchanged: an older launcher reads a newer run's rows. A line without an integer step, or with
something else than a number where a number goes, is no row (:func:`decode` and :func:`parse` say None; the
readers skip it). ``docs/design-contract.md`` lists the rows and their keys; a test checks it against
:data:`ROWS`.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional



@dataclass(kw_only=True)
class Row:
    """A log interval's, every ``train.log_every`` steps and after the last: the step's loss (the mean over the
    ranks), learning rate and gradient norm; its global batch as one number whatever the world size (``batch_crc``:
    the sum of the CRC-32s of its samples' tokens, modulo 2**32, on which two runs that read the same tokens at a
    step agree); the interval's mean step time and throughput (``mfu`` null where the device's peak FLOP/s is not
    known); rank 0's peak memory (GB; on a CPU its resident set); and on a bucket's data what reading it has cost
    the attempt so far (``data_mb``, ``shards_fetched``, ``cache_hits``, ``data_wait_s``: docs/data.md; null
    otherwise)."""
    kind: ClassVar[str] = "step"
    step: int  # the steps done
    time: Optional[float] = None  # when it was written (goodput's timeline); None in a row from before rows had it
    extra: dict = field(default_factory=dict)  # the keys a newer writer added that the row's kind does not declare
    loss: Optional[float] = None
    eval_loss: Optional[float] = None
    lr: Optional[float] = None
    grad_norm: Optional[float] = None
    batch_crc: Optional[int] = None
    step_time: Optional[float] = None
    tokens_per_s: Optional[float] = None
    tokens_per_s_per_gpu: Optional[float] = None
    mfu: Optional[float] = None
    peak_mem_gb: Optional[float] = None
    data_mb: Optional[float] = None
    shards_fetched: Optional[int] = None
    cache_hits: Optional[int] = None
    data_wait_s: Optional[float] = None

    def value(self, name: str) -> Any:
        """The value of the key ``name`` (a field, or a newer writer's key; None where the row has none): for
        what names its figure by key, a search's ``metric`` and the trackers' curves."""
        if name in (f.name for f in dataclasses.fields(self)) and name != "extra":
            return getattr(self, name)
        return self.extra.get(name)


@dataclass(kw_only=True)
class EvalRow(Row):
    """A step's row at an evaluation, every ``train.eval_every`` steps and after the last: ``eval_loss``, the
    held-out loss, is set."""
    kind: ClassVar[str] = "evaluation"
    eval_loss: float


@dataclass(kw_only=True)
class FinalRow(Row):
    """The attempt's summary after its last step (``"final": true``): the last row's values, but the throughput,
    step time and peak memory of the whole attempt (leaving out its first interval, warm-up and compilation,
    when there are others); the seconds it trained, the steps it ran, the step it resumed from (null from
    scratch), the micro-batch and gradient accumulation it trained with."""
    kind: ClassVar[str] = "final"
    train_seconds: Optional[float] = None
    steps_run: Optional[int] = None
    resumed_from: Optional[int] = None
    micro_batch: Optional[int] = None
    grad_accum: Optional[int] = None

    @classmethod
    def after(cls, last: Row, **summary: Any) -> FinalRow:
        """The final row after ``last``: its values, those of ``summary`` in their stead."""
        repeated = {f.name: getattr(last, f.name) for f in dataclasses.fields(Row) if f.name != "time"}
        return cls(**{**repeated, **summary})


@dataclass(kw_only=True)
class PrunedRow(FinalRow):
    """The final row of a search's trial that its pruner stopped at this step, an evaluation's (``"pruned": true``
    beside ``"final": true``)."""
    kind: ClassVar[str] = "pruned"


ROWS: dict[str, type[Row]] = {cls.kind: cls for cls in (Row, EvalRow, FinalRow, PrunedRow)}
# The keys that mark a kind of row, true on its lines and on those of the kinds built on it.
MARKS: dict[type[Row], str] = {FinalRow: "final", PrunedRow: "pruned"}


def fields_of(kind: type[Row]) -> list[str]:
    """The fields a kind of row declares besides ``step`` and ``time``, in order."""
    return [f.name for f in dataclasses.fields(kind) if f.name not in ("step", "time", "extra")]


def encode(row: Row) -> dict[str, Any]:
    """The line's object: ``step``, every field (unset ones null), ``time`` where known, the marks of its kind
    (:data:`MARKS`), and the keys kept in ``extra``."""
    line = {**row.extra, "step": row.step, **{name: getattr(row, name) for name in fields_of(type(row))}}
    if row.time is not None:
        line["time"] = row.time
    line.update({mark: True for cls, mark in MARKS.items() if isinstance(row, cls)})
    return line


def decode(line: dict[str, Any]) -> Optional[Row]:
    """The row of a line's object (as read from JSON): a pruned trial's final row, the final row, an evaluation's or
    a step's; None for a line that is no row (no integer step, or something else than a number where a number
    goes: every field is a number)."""
    final = (PrunedRow if line.get(MARKS[PrunedRow]) else FinalRow) if line.get(MARKS[FinalRow]) else None
    kind = final or (EvalRow if _number(line.get("eval_loss")) else Row)
    step = line.get("step")
    declared = fields_of(kind)
    if not _integer(step) or not all(line.get(name) is None or _number(line[name]) for name in declared):
        return None
    stamp = line.get("time")
    marks = [mark for cls, mark in MARKS.items() if issubclass(kind, cls)]
    extra = {k: v for k, v in line.items() if k not in ("step", "time", *marks, *declared)}
    return kind(step=step, time=stamp if _number(stamp) else None, extra=extra,
                **{k: v for k, v in line.items() if k in declared})


def parse(text: str | bytes) -> Optional[Row]:
    """The row of one line of the file; None for a line that is no row (not JSON, not an object, or no row's)."""
    try:
        line = json.loads(text)
    except ValueError:
        return None
    return decode(line) if isinstance(line, dict) else None


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
