"""One attempt at a time, and the last known state: what ``runs``, ``describe`` and the console show of a run that
restarted, whose attempt failed before its retry, or whose Slurm is slow, from recorded events and metrics rows;
Slurm's client tools are scripts on PATH that answer from files, or too late."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from launcher.console import readers
from launcher.core.attempt_log import AttemptLog
from launcher.core.events import decode
from launcher.core.heartbeats import Pulse, encode_node, node_path
from launcher.core.metrics import decode as decode_row
from launcher.core.run_index import RunRecord
from launcher.service.runs import build_row
from launcher.slurm import client
from launcher.status import job_state
from launcher.status.goodput import goodput
from launcher.status.job_state import JobState, in_its_words, job_states


def step_rows(steps, at, loss=2.0):
    """Metrics lines of ``steps``, one a second from ``at``, a second a step."""
    return [{"step": s, "loss": loss, "step_time": 1.0, "tokens_per_s": 800.0, "time": at + i}
            for i, s in enumerate(steps)]


def write(run_dir: Path, events, rows=()) -> None:
    run_dir.mkdir(exist_ok=True)
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def a_record(run_dir: Path, job_id: str = "7") -> RunRecord:
    return RunRecord(name=run_dir.name, run_dir=str(run_dir), model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2,
                     steps=300, cluster="local", submitted_at=100.0, job_id=job_id)


# A run that trained to step 40 without a checkpoint, failed for good, and was resumed: its job waits to restart.
FIRST = [{"event": "submitted", "job_id": "7", "time": 100.0}, {"event": "attempt", "attempt": 1, "job_id": "7",
                                                                   "time": 110.0},
         {"event": "started", "time": 111.0},
         {"event": "attempt_ended", "attempt": 1, "job_id": "7", "outcome": "FAILED", "short": "rank 1 killed",
          "step": 40, "time": 160.0},
         {"event": "failed", "final": True, "short": "rank 1 killed", "time": 161.0},
         {"event": "resubmitted", "job_id": "8", "previous_job_id": "7", "time": 200.0}]


def test_a_restart_from_scratch_shows_no_step_loss_or_eta_until_its_new_attempt_logs_one(tmp_path):
    run_dir = tmp_path / "r"
    write(run_dir, FIRST, step_rows([10, 20, 30, 40], 120.0))
    row = build_row(a_record(run_dir, "8"), JobState("PENDING", source="squeue"))
    assert (row.step, row.loss, row.eta_s, row.tokens_per_s) == (None, None, None, None)

    begun = FIRST + [{"event": "attempt", "attempt": 2, "job_id": "8", "time": 300.0}]
    write(run_dir, begun, step_rows([10, 20, 30, 40], 120.0))
    assert build_row(a_record(run_dir, "8"), JobState("RUNNING", source="squeue")).step is None

    write(run_dir, begun, step_rows([10, 20, 30, 40], 120.0) + step_rows([10], 310.0, loss=3.5))
    row = build_row(a_record(run_dir, "8"), JobState("RUNNING", source="squeue"))
    assert (row.step, row.loss, row.eta_s, row.attempts) == (10, 3.5, 290.0, 2)


def test_the_curves_are_the_current_attempts_and_earlier_ones_are_drawn_on_request_as_one_line():
    events = [decode(e) for e in FIRST + [{"event": "attempt", "attempt": 2, "job_id": "8", "time": 300.0},
                                          {"event": "attempt", "attempt": 3, "job_id": "9", "time": 400.0},
                                          {"event": "resumed", "step": 20, "time": 405.0}]]
    lines = step_rows([10, 20, 30, 40], 120.0) + step_rows([10, 20, 30], 310.0) + step_rows([30, 40], 410.0)
    current = AttemptLog(events).current()
    assert (current.since, current.resumed_at) == (400.0, 20)
    curves = readers.curves(lines, gpus=2, points=1000, current=current)
    assert curves["step"] == [30, 40] and curves["earlier_rows"] == 7 and "earlier" not in curves
    drawn = readers.curves(lines, gpus=2, points=1000, current=current, earlier=True)
    # of the steps two attempts logged, the later attempt's: the restart from scratch, not the loop 10..40, 10..30
    assert drawn["step"] == [30, 40] and drawn["earlier"]["step"] == [10, 20, 30]
    waiting = AttemptLog([decode(e) for e in FIRST]).current()
    assert readers.curves(lines[:4], gpus=2, points=1000, current=waiting)["step"] == []


def test_goodput_counts_only_steps_a_checkpoint_holds_or_a_finish():
    events, rows = [decode(e) for e in FIRST], [decode_row(r) for r in step_rows([10, 20, 30, 40], 120.0)]
    assert goodput(events, rows, now=500.0, saved=[]).kept_s == 0.0  # "Checkpoints: none": nothing kept
    running = [decode(e) for e in FIRST[:3]]
    measured = goodput(running, rows, now=130.0, saved=[20])
    assert measured.kept_s == 20.0 and measured.lost_s["not saved yet"] == 20.0
    finished = running + [decode({"event": "finished", "step": 40, "time": 124.0})]
    assert goodput(finished, rows, now=130.0, saved=[20]).kept_s == 40.0


def test_a_failed_attempt_is_recovering_until_its_retry_or_verdict_is_recorded(tmp_path):
    run_dir = tmp_path / "r"
    began = [{"event": "submitted", "job_id": "7", "time": 100.0},
             {"event": "watching", "job_id": "7", "watcher": "70", "time": 101.0},
             {"event": "attempt", "attempt": 1, "job_id": "7", "time": 110.0}]
    write(run_dir, began)
    died = JobState("FAILED", "exit code 0:9", "sacct")  # its batch step died: the watcher judges the attempt
    watcher = {"70": JobState("PENDING", "Dependency", "squeue")}
    state = in_its_words(died, run_dir, jobs=watcher)
    assert state.state == "RECOVERING" and "job 70 judges attempt 1" in state.reason, state
    assert in_its_words(died, run_dir, jobs={}).state == "FAILED"  # no watcher in the queue: no judge is coming

    judged = began + [{"event": "attempt_ended", "attempt": 1, "job_id": "7", "outcome": "FAILED",
                       "short": "rank 1 killed", "time": 120.0}]
    write(run_dir, judged)  # its end step judged it while the job still runs, and decides
    state = in_its_words(JobState("RUNNING", "", "squeue"), run_dir)
    assert (state.state, state.reason) == ("RECOVERING", "attempt 1 ended (rank 1 killed); its retry is being decided")
    write(run_dir, judged + [{"event": "failed", "final": True, "short": "rank 1 killed", "time": 121.0}])
    assert in_its_words(died, run_dir, jobs=watcher).state == "FAILED"  # the verdict: final


def test_a_failed_job_read_after_its_retry_was_recorded_is_recovering(tmp_path):
    """`runs` reads the record (still the array element's job) before the watcher's retry rewrites it, and the
    events after the retry is recorded: Slurm's FAILED is of the old job, and the run is recovering."""
    run_dir = tmp_path / "r"
    events = [{"event": "submitted", "job_id": "5_1", "time": 100.0},
              {"event": "watching", "job_id": "5_1", "watcher": "9", "time": 101.0},
              {"event": "attempt", "attempt": 1, "job_id": "6", "time": 110.0},
              {"event": "attempt_ended", "attempt": 1, "job_id": "6", "outcome": "FAILED", "short": "rank 0 killed",
               "time": 130.0},
              {"event": "retrying", "attempt": 1, "job_id": "12", "previous_job_id": "6", "time": 131.0}]
    write(run_dir, events)
    died = JobState("FAILED", "exit code 0:9", "sacct")
    state = in_its_words(died, run_dir, jobs={}, job_id="5_1")
    assert (state.state, state.reason) == ("RECOVERING", "attempt 2 submitted as job 12 after rank 0 killed (job 5_1)")
    assert in_its_words(died, run_dir, jobs={}).state == "FAILED"  # without the job's id nothing says it is old
    retry_failed = in_its_words(JobState("FAILED", "exit code 1:0", "sacct"), run_dir, jobs={}, job_id="12")
    assert retry_failed.state == "FAILED"  # the retry's own job failing is told as it is


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """Slurm's client tools as scripts on PATH: ``scontrol ping`` answers UP; squeue and sacct print their files
    (``squeue.out``, ``sacct.out``), and while ``slow`` exists take 30 s first (past the listing's timeout)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\necho "Slurmctld(primary) at head is UP"\n')
    for tool in ("squeue", "sacct"):
        slow = f'[ -e "{bin_dir}/slow" ] && exec sleep 30'  # exec: the timeout's kill ends the sleep too
        (bin_dir / tool).write_text(f'#!/bin/sh\n{slow}\ncat "{bin_dir}/{tool}.out"\n')
    for tool in ("scontrol", "squeue", "sacct"):
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(job_state, "STATUS_TIMEOUT_S", 1)
    return bin_dir


def squeue_line(job_id, state, user):
    return "|".join([job_id, job_id, state, "None", "n1", "2026-12-06T04:00:00", "1:00", user, "debug",
                     "cpu=1", "1", "normal"]) + "|\n"


def test_a_failed_job_whose_watcher_waits_in_the_queue_lists_recovering(tmp_path, fake_slurm):
    run_dir = tmp_path / "r"
    write(run_dir, [{"event": "submitted", "job_id": "7", "time": 100.0},
                    {"event": "watching", "job_id": "7", "watcher": "70", "time": 101.0},
                    {"event": "attempt", "attempt": 1, "job_id": "7", "time": 110.0}])
    (fake_slurm / "sacct.out").write_text("7|7|FAILED|None|0:9|2026-12-06T04:00:00|2026-12-06T04:01:00|00:01:00|n1|\n")
    (fake_slurm / "squeue.out").write_text(squeue_line("70", "PENDING", client.user_name()))
    state = job_states([a_record(run_dir)])["r"]
    assert (state.state, state.source) == ("RECOVERING", "sacct") and "job 70 judges attempt 1" in state.reason


def test_an_array_element_whose_batch_step_died_is_recovering_while_the_arrays_watcher_waits(tmp_path, fake_slurm):
    run_dir = tmp_path / "r"  # the element's attempt is recorded under its own job id; its record names it 7_1
    write(run_dir, [{"event": "submitted", "job_id": "7_1", "time": 100.0},
                    {"event": "watching", "job_id": "7_1", "watcher": "70", "time": 101.0},
                    {"event": "attempt", "attempt": 1, "job_id": "9", "time": 110.0}])
    (fake_slurm / "sacct.out").write_text("7_1|9|FAILED|None|0:9|2026-12-06T04:00:00|2026-12-06T04:01:00|00:01:00"
                                          "|n1|\n")
    (fake_slurm / "squeue.out").write_text(squeue_line("70", "PENDING", client.user_name()))
    state = job_states([a_record(run_dir, job_id="7_1")])["r"]
    assert state.state == "RECOVERING" and "job 70 judges attempt 1" in state.reason, state
    (fake_slurm / "squeue.out").write_text("")  # the watcher ended: its judgement is the record's
    assert job_states([a_record(run_dir, job_id="7_1")])["r"].state == "FAILED"


def test_with_slurm_slow_a_run_is_what_was_last_known_dated_never_unknown(tmp_path, fake_slurm, monkeypatch):
    run_dir = tmp_path / "r"
    write(run_dir, [{"event": "submitted", "job_id": "7", "time": 100.0},
                    {"event": "attempt", "attempt": 1, "job_id": "7", "time": time.time() - 60}])
    (fake_slurm / "squeue.out").write_text(squeue_line("7", "RUNNING", client.user_name()))
    (fake_slurm / "sacct.out").write_text("7|7|RUNNING|None|0:0|2026-12-06T04:00:00|Unknown|00:01:00|n1|\n")
    shared = client.SharedAnswers()  # the console's shared answers, kept briefly
    shared.max_age_s = 0.01
    monkeypatch.setattr(client, "SHARED", shared)
    assert job_states([a_record(run_dir)])["r"].as_of is None  # Slurm answers: no date

    (fake_slurm / "slow").touch()
    time.sleep(0.02)
    state = job_states([a_record(run_dir)])["r"]
    assert (state.state, state.source) == ("RUNNING", "squeue") and state.as_of is not None
    assert state.reason.startswith("as of ") and "; Slurm not answering for " in state.reason, state.reason

    shared.max_age_s = 0  # a command: nothing kept, only the run's own record
    beat = time.time() - 5
    node_path(run_dir, "n1").parent.mkdir()
    node_path(run_dir, "n1").write_bytes(encode_node("n1", [Pulse(0, "n1", 1, 12, beat, beat)], beat))
    state = job_states([a_record(run_dir)])["r"]
    assert (state.state, state.source, state.as_of) == ("RUNNING", "heartbeats", beat), state
    assert state.reason.startswith(f"{client.as_of(beat)} by its own heartbeats and metrics; Slurm could not be "
                                   "reached on cluster local"), state.reason
