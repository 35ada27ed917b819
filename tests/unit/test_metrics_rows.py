"""The rows of metrics.jsonl as types (launcher/core/metrics.py): the codec to and from a line, lines written before
the types or by a newer launcher, damaged lines, and the contract's table of rows checked against the types."""
from __future__ import annotations

from support.helpers import contract_table, types_table

from launcher.core.metrics import ROWS, EvalRow, FinalRow, PrunedRow, Row, decode, encode, fields_of

SECTION = "## metrics.jsonl: the rows and their keys"
HEADER = "| row | keys | what |"


def rows_table() -> str:
    """The contract's table of rows, as the types give it: row, keys, what it records."""
    return types_table(HEADER, ROWS, fields_of)


def test_the_contract_lists_every_row_with_the_keys_of_its_type():
    assert contract_table(SECTION, HEADER) == rows_table(), "docs/design-contract.md's table of metrics rows " \
        "differs from launcher/core/metrics.py:\n" + rows_table()


def test_a_row_reads_back_as_written_every_field_present():
    row = Row(step=40, time=12.5, loss=3.2, lr=3e-4, batch_crc=7, step_time=0.25, tokens_per_s=1234.0)
    line = encode(row)
    assert line["step"] == 40 and line["time"] == 12.5 and line["eval_loss"] is None and "final" not in line
    assert set(line) == {"step", "time", *fields_of(Row)}  # an unset field is written as null
    assert decode(line) == row


def test_the_kind_of_row_is_read_from_its_line():
    evaluated = decode({"step": 20, "loss": 3.0, "eval_loss": 3.1})
    assert evaluated == EvalRow(step=20, loss=3.0, eval_loss=3.1)
    final = decode({"final": True, "step": 20, "loss": 3.0, "eval_loss": 3.1, "steps_run": 20})
    assert final == FinalRow(step=20, loss=3.0, eval_loss=3.1, steps_run=20)
    assert encode(final)["final"] is True and set(encode(final)) == {"step", "final", *fields_of(FinalRow)}
    pruned = decode({"final": True, "pruned": True, "step": 2, "eval_loss": 3.1})
    assert pruned == PrunedRow(step=2, eval_loss=3.1) and encode(pruned)["pruned"] is encode(pruned)["final"] is True
    assert "pruned" not in encode(final)  # a trial that trained on: no key at all
    assert type(decode({"step": 20, "eval_loss": None})) is Row


def test_a_line_written_before_the_types_reads_with_its_missing_fields_unset():
    assert decode({"step": 5, "loss": 2.0}) == Row(step=5, loss=2.0)  # no time: a row before rows had one
    assert "time" not in encode(Row(step=5))


def test_an_unknown_key_is_kept_and_written_back_unchanged():
    row = decode({"step": 3, "time": 4.0, "gpu_temp": 91})
    assert row.extra == {"gpu_temp": 91} and encode(row)["gpu_temp"] == 91
    assert row.value("gpu_temp") == 91 and row.value("loss") is None and row.value("step") == 3
    assert decode({"step": 3, "steps_run": 3}).extra == {"steps_run": 3}  # a final row's key on a step's row


def test_a_line_without_an_integer_step_or_with_text_for_a_number_is_no_row():
    assert decode({"loss": 2.0}) is None
    assert decode({"step": "5"}) is None and decode({"step": True}) is None
    assert decode({"step": 5, "loss": "high"}) is None
    assert decode({"final": True, "step": 5, "steps_run": "all"}) is None
    assert decode({"step": 5, "pruned": True}).extra == {"pruned": True}  # only a final row is a pruned one
    assert decode({"step": 5, "time": "noon"}) == Row(step=5)  # an unreadable time is none
