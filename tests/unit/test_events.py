"""The run's record as types (launcher/core/events.py): the codec to and from a line of events.jsonl, lines of
kinds or fields the types do not know, and the contract's table of kinds checked against the types."""
from __future__ import annotations

import json

from support.helpers import contract_table, types_table

from launcher.core.events import (KINDS, AttemptEnded, Failed, Outcome, Retrying, UnknownEvent, decode, encode,
                                  fields_of)
from launcher.core.rundir import append_event, read_events

SECTION = "## events.jsonl: the kinds of event and their fields"
HEADER = "| event | fields | what |"


def kinds_table() -> str:
    """The contract's table of event kinds, as the types give it: kind, fields, what it records."""
    return types_table(HEADER, {f"`{kind}`": cls for kind, cls in KINDS.items()}, fields_of)


def test_the_contract_lists_every_kind_with_the_fields_of_its_type():
    table = contract_table(SECTION, HEADER)
    assert table == kinds_table(), "docs/design-contract.md's table of event kinds differs from launcher/core/events.py:\n" \
        + kinds_table()


def test_a_line_reads_back_as_the_event_written_every_field_present(tmp_path):
    ended = AttemptEnded(attempt=2, job_id="7", outcome=Outcome.STALLED, rank=1, node="n2", step=40, trained=True)
    append_event(tmp_path, ended)
    line = json.loads((tmp_path / "events.jsonl").read_text())
    assert line["event"] == "attempt_ended" and line["outcome"] == "STALLED" and line["cause"] is None
    assert set(line) == {"time", "event", *fields_of(AttemptEnded)}  # an unset field is written as null
    assert decode(line) == ended and decode(line).outcome is Outcome.STALLED
    assert read_events(tmp_path) == [ended]


def test_a_line_written_before_the_types_reads_with_its_missing_fields_unset():
    old = {"time": 5.0, "event": "retrying", "job_id": "8", "exclude": ["n2"]}
    assert decode(old) == Retrying(time=5.0, job_id="8", exclude=["n2"])
    assert decode({"time": 1, "event": "failed", "final": True, "error": "boom"}) == Failed(time=1.0, final=True,
                                                                                          error="boom")


def test_an_unknown_kind_or_field_is_kept_and_written_back_unchanged():
    newer = {"time": 3.0, "event": "rebalanced", "nodes": ["n1"]}
    event = decode(newer)
    assert event == UnknownEvent(time=3.0, name="rebalanced", extra={"nodes": ["n1"]}) and encode(event) == newer
    extra = {"time": 4.0, "event": "attempt_ended", "outcome": "FAILED", "gpu_temp": 91}
    ended = decode(extra)
    assert ended.extra == {"gpu_temp": 91} and encode(ended)["gpu_temp"] == 91
    assert decode({"event": "attempt_ended", "outcome": "EXPLODED"}).outcome == "EXPLODED"  # an outcome kept as read
