"""A trial's last step (launcher/search/hook.py, run by the batch script's ``end`` after srun): only a final outcome
is reported, so a trial the fault loop retried is one trial; the result is the trial's own metric; the next trial
is submitted from there; a run that is no trial costs nothing."""
from __future__ import annotations

import json

import pytest

from launcher.core.events import Attempt, AttemptEnded, Outcome, Retrying, decode, encode
from launcher.core.rundir import TRIAL, append_event, append_jsonl, read_events
from launcher.search import hook
from launcher.search.study import load, open_study
from launcher.search.trials import Tally, start, tally_of

from support.searches import Submitted, make_search


@pytest.mark.parametrize("events, outcome", [
    ([("attempt", {}), ("finished", {}), ("attempt_ended", {"outcome": "COMPLETED"})], "COMPLETED"),
    ([("attempt", {}), ("attempt_ended", {"outcome": "FAILED"}), ("retrying", {})], None),  # the fault loop goes on
    ([("attempt", {}), ("attempt_ended", {"outcome": "REQUEUED"})], None),
    ([("attempt", {}), ("attempt_ended", {"outcome": "FAILED"}),
      ("failed", {"final": True, "error": "RuntimeError: boom"})], "failed: RuntimeError: boom"),
    ([("attempt", {}), ("attempt_ended", {"outcome": "CANCELLED"})], "stopped: its job was cancelled"),
    ([("attempt", {}), ("finished", {"step": 2, "pruned": True}), ("attempt_ended", {"outcome": "COMPLETED"})],
     "PRUNED at step 2"),
    ([("attempt", {}), ("attempt_ended", {"outcome": "FAILED"}), ("retrying", {}), ("attempt", {}),
      ("finished", {}), ("attempt_ended", {"outcome": "COMPLETED"})], "COMPLETED"),  # a retried trial is one trial
])  # fmt: skip
def test_only_a_final_outcome_is_reported(events, outcome, tmp_path):
    for event, fields in events:
        append_event(tmp_path, decode({"event": event, **fields}))
    assert hook.final_outcome(read_events(tmp_path)) == outcome


def test_a_trials_last_step_reports_it_and_submits_the_next(tmp_path, monkeypatch):
    from launcher.search import submission

    path, submit = make_search(tmp_path), Submitted()
    start(path, submit)
    monkeypatch.setattr(submission, "submit_trial", submit)
    run = tmp_path / "run-0"
    run.mkdir()
    (run / TRIAL).write_text(json.dumps({"search": path.name, "trial": 0}))
    append_event(run, Attempt(attempt=1))
    append_event(run, AttemptEnded(outcome=Outcome.FAILED))
    append_event(run, Retrying())
    hook.trial_ended(run)  # a retry is on its way: nothing told
    assert tally_of(open_study(path, load(path))) == Tally(asked=2, ended=0, failed=0)
    append_event(run, Attempt(attempt=2))
    append_jsonl(run / "metrics.jsonl", {"step": 5, "loss": 3.1, "eval_loss": 3.25})
    append_event(run, AttemptEnded(outcome=Outcome.COMPLETED))
    hook.trial_ended(run)
    study = open_study(path, load(path))
    assert study.trials[0].value == 3.25 and submit.numbers == [0, 1, 2]
    assert encode(read_events(run)[-1])["event"] == "trial_reported" and read_events(run)[-1].submitted == [2]
    hook.trial_ended(tmp_path / "not-a-trial")  # no trial.json: nothing to do, and no error
