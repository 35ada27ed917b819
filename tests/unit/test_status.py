"""Parsing and formatting behind the status commands (no Slurm needed)."""
from __future__ import annotations

import io
import json
import os
import re
import sys
import time

import pytest

from launcher import cli
from launcher.commands import runs
from launcher.service import runs as listing
from launcher.views.lookup import duration, parse_since, slurm_seconds
from launcher.core.metrics import Row
from launcher.core.rundir import last_metrics
from launcher.core.run_index import RunRecord, find_run, list_records, save_record
from launcher.slurm.output import JobRow, parse_gres
from launcher.status.job_state import JobState, fold, from_run_dir, in_its_words, job_states, settled_state


@pytest.mark.parametrize(
    "slurm_state, expected",
    [
        ("RUNNING", ("RUNNING", "")),
        ("CANCELLED by 0", ("CANCELLED", "")),
        ("NODE_FAIL", ("FAILED", "node failure")),
        ("OUT_OF_MEMORY", ("FAILED", "out of memory")),
        ("REQUEUED", ("REQUEUED", "")),
        ("COMPLETING", ("RUNNING", "completing")),
        ("PREEMPTED", ("PREEMPTED", "")),
        ("WEIRD", ("UNKNOWN", "Slurm state 'WEIRD'")),
    ],
)
def test_slurm_states_fold_into_ours(slurm_state, expected):
    assert fold(slurm_state) == expected


@pytest.mark.parametrize("gres, gpus, kind", [("gpu:8", 8, None), ("gpu:h100:4(S:0-1)", 4, "h100"),
                                             ("(null)", 0, None), ("craynetwork:1,gpu:a100:2", 2, "a100")])
def test_gres_strings(gres, gpus, kind):
    assert (parse_gres(gres).gpus, parse_gres(gres).gpu_type) == (gpus, kind)


def test_times_format_and_parse():
    assert [duration(s) for s in (4.25, 45, 125, 7500, 200000)] == ["4.2s", "45s", "2m05s", "2h05m", "2d07h"]
    assert slurm_seconds("1-02:03:04") == 93784 and slurm_seconds("03:04") == 184 and slurm_seconds("") is None
    assert abs(parse_since("2h") - (time.time() - 7200)) < 2
    with pytest.raises(cli.LaunchError, match="--since 'soon'"):
        parse_since("soon")


def make_run(root, name, submitted, **fields):
    run_dir = root / name
    run_dir.mkdir(parents=True)
    rec = RunRecord(name=name, run_dir=str(run_dir), model=fields.get("model", "gpt_tiny"), gpus=2, nodes=1,
                    gpus_per_node=2, steps=10, cluster="local", submitted_at=submitted, job_id=fields.get("job_id", "1"),
                    sweep=fields.get("sweep"))
    save_record(rec)
    os.utime(run_dir / "run.json", (submitted, submitted))
    return run_dir


def test_records_are_listed_newest_first_and_found_by_prefix(tmp_path):
    for i, name in enumerate(["alpha-1", "beta-2", "alpha-3"]):
        make_run(tmp_path, name, 1000 + i)
    (tmp_path / "not-a-run").mkdir()
    assert [r.name for r in list_records(tmp_path)] == ["alpha-3", "beta-2", "alpha-1"]
    assert [r.name for r in list_records(tmp_path, limit=1)] == ["alpha-3"]
    assert find_run(tmp_path, "bet").name == "beta-2"
    with pytest.raises(LookupError, match="ambiguous: alpha-1, alpha-3"):
        find_run(tmp_path, "alpha")
    with pytest.raises(LookupError, match="did you mean beta-2"):
        find_run(tmp_path, "betta-2")


def test_last_metrics_skips_a_torn_line_and_run_dir_marks_the_end(tmp_path):
    run_dir = make_run(tmp_path, "r", 1.0)
    (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 5, "loss": 2.0}) + "\n" + '{"step": 6, "lo')
    assert last_metrics(run_dir) == Row(step=5, loss=2.0)
    assert from_run_dir(run_dir) is None
    (run_dir / "events.jsonl").write_text('{"event": "started"}\n{"event": "failed", "error": "boom"}\n')
    assert (from_run_dir(run_dir).state, from_run_dir(run_dir).reason) == ("FAILED", "boom")


def test_a_pruned_trial_is_completed_and_says_where_it_was_pruned(tmp_path):
    """A search trial its study pruned completed as asked, early: `runs` shows COMPLETED (pruned at step N),
    whether the run directory or Slurm tells the state."""
    run_dir = make_run(tmp_path, "r", 1.0)
    events = [{"event": "attempt", "attempt": 1}, {"event": "finished", "step": 20, "pruned": True}]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert (from_run_dir(run_dir).state, from_run_dir(run_dir).reason) == ("COMPLETED", "pruned at step 20")
    state = in_its_words(JobState("COMPLETED", "", "sacct"), run_dir)
    assert (state.state, state.reason) == ("COMPLETED", "pruned at step 20")
    row = listing.build_row(RunRecord(name="r", run_dir=str(run_dir), model="gpt_tiny", gpus=1, nodes=1,
                                      gpus_per_node=1, steps=40, cluster="local", submitted_at=1.0), state)
    assert runs.table_row(row)[5] == "COMPLETED (pruned at step 20)"


@pytest.mark.parametrize("failure, shown", [
    ({"error": "NonFiniteError: loss is nan at step 1: training diverged", "short": "loss nan"}, "loss nan"),
    ({"error": "ConfigKeyError: Key 'newkey' not in 'TrainConfig'"}, "ConfigKeyError"),
])  # fmt: skip
def test_a_failure_the_attempt_never_judged_shows_its_words_not_the_exit_code(tmp_path, failure, shown):
    """The batch script died before judging the attempt (no final verdict): `runs` still shows the rank's
    own failure in a word or two, not sacct's "exit code 1:0"."""
    run_dir = make_run(tmp_path, "r", 1.0)
    events = [{"event": "attempt", "attempt": 1}, {"event": "failed", "rank": "0", **failure}]
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    state = in_its_words(JobState("FAILED", "exit code 1:0", "sacct"), run_dir)
    assert (state.state, state.reason) == ("FAILED", shown)


@pytest.mark.parametrize("outcome, shown", [("COMPLETED", "COMPLETED"), ("REQUEUED", "RUNNING"), (None, "RUNNING")])
def test_a_run_that_recorded_its_end_is_not_running_whatever_a_stale_controller_says(tmp_path, outcome, shown):
    """A controller killed before it saved a job's end lists the job RUNNING for good after its restart; the
    run's own record of a completed last attempt wins. A requeued attempt, or one still going, does not."""
    run_dir = make_run(tmp_path, "r", 1.0)
    events = [{"event": "attempt", "attempt": 1}] + ([{"event": "attempt_ended", "outcome": outcome}] if outcome else [])
    (run_dir / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    assert in_its_words(JobState("RUNNING", "", "squeue"), run_dir).state == shown


@pytest.mark.parametrize(
    "args, message",
    [
        (["runs", "--status", "DONE"], "--status DONE: allowed PENDING"),
        (["runs", "--limit", "0"], "--limit must be positive, got 0"),
        (["runs", "--watch", "--interval", "0"], "--interval must be positive, got 0"),
        (["runs", "--since", "yesterday"], "--since 'yesterday'"),
        (["runs", "--bogus"], "launcher runs: unrecognized arguments: --bogus; see --help"),
        (["describe", "nosuchrun"], "no run named 'nosuchrun'"),
        (["logs", "nosuchrun"], "no run named 'nosuchrun'"),
        (["stop"], "name at least one run, or --sweep ID"),
        (["stop", "--sweep", "sweep-x"], "no sweep 'sweep-x'"),
        (["delete", "r"], "delete r: confirm with --yes"),
    ],
)
def test_status_command_errors_are_one_line(tmp_path, capsys, monkeypatch, args, message):
    make_run(tmp_path, "r", 1.0)
    monkeypatch.setattr("sys.stdin", open(os.devnull))
    assert cli.main([*args, "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert (tmp_path / "r" / "run.json").exists()  # nothing removed


def test_a_settled_slurm_state_is_kept_and_accounting_not_asked_again(tmp_path, monkeypatch):
    run_dir = make_run(tmp_path, "done", 1.0, job_id="42")
    (run_dir / "slurm_state.json").write_text(json.dumps(
        {"job_id": "42", "state": "COMPLETED", "source": "sacct", "elapsed": "00:01:10", "exit_code": "0:0"}))
    rec = list_records(tmp_path)[0]
    queue = []  # what squeue lists; only the queue is asked about a settled job
    monkeypatch.setattr("launcher.slurm.client.Slurm.unreachable", lambda self: None)
    monkeypatch.setattr("launcher.slurm.client.Slurm.sacct", lambda self, ids: pytest.fail("accounting was asked"))
    monkeypatch.setattr("launcher.slurm.client.Slurm.squeue", lambda self: queue)
    state = job_states([rec])["done"]
    assert (state.state, state.source, state.elapsed) == ("COMPLETED", "sacct", "00:01:10")
    # Requeued by hand (scontrol requeue): the same job id lives again, and the kept answer goes.
    queue.append(JobRow("42", "RUNNING", "None", "n1", "2026-11-30T08:00:00", source="squeue"))
    assert job_states([rec])["done"].state == "RUNNING"
    assert not (run_dir / "slurm_state.json").exists()
    rec.job_id = "43"  # a cached answer about another job is ignored
    assert settled_state(rec) is None


def settled(run_dir, state):
    """Slurm's final answer about the run's job, as job_states keeps it (so Slurm is not asked)."""
    (run_dir / "slurm_state.json").write_text(json.dumps({"job_id": "1", "state": state, "source": "sacct"}))


def test_sweep_ids_take_a_unique_prefix(tmp_path, capsys):
    for i, (name, sweep) in enumerate([("a1", "sweep-0101-aa"), ("a2", "sweep-0101-aa"), ("b1", "sweep-0102-bb"),
                                       ("c1", "sweep-0103-cc")]):
        settled(make_run(tmp_path, name, 1000 + i, sweep=sweep), "COMPLETED")
    assert cli.main(["runs", "--sweep", "sweep-0101", "--json", "--root", str(tmp_path)]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["a2", "a1"]
    assert cli.main(["runs", "--sweep", "sweep-0102-bb", "--json", "--root", str(tmp_path)]) == 0
    assert [r["name"] for r in json.loads(capsys.readouterr().out)] == ["b1"]
    for args, message in [
        (["runs", "--sweep", "sweep-010"], "error: sweep 'sweep-010' is ambiguous: sweep-0101-aa, sweep-0102-bb, "
                                           "sweep-0103-cc"),
        (["compare", "--sweep", "sweep-0104-cc"], f"error: no sweep 'sweep-0104-cc' in {tmp_path}; did you mean "
                                                  "sweep-0103-cc, sweep-0102-bb, sweep-0101-aa?"),
        (["stop", "--sweep", "zzz"], f"error: no sweep 'zzz' in {tmp_path}"),
    ]:
        assert cli.main([*args, "--root", str(tmp_path)]) == 2
        assert capsys.readouterr().err.splitlines() == [message]


def test_watch_into_a_pipe_is_plain_text_and_ends_when_nothing_is_active(tmp_path, capsys, monkeypatch):
    for i, state in enumerate(["COMPLETED", "FAILED"]):
        settled(make_run(tmp_path, f"r{i}", 1000 + i), state)
    pauses, sleep = [], time.sleep

    def pause(seconds):  # subprocess's waits sleep in steps of at most 0.05 s: those are kept
        pauses.append(seconds)
        if seconds < 1:
            sleep(seconds)

    monkeypatch.setattr(time, "sleep", pause)
    assert cli.main(["runs", "--watch", "--interval", "30", "--root", str(tmp_path)]) == 0
    assert [p for p in pauses if p >= 1] == []  # no refresh (a pause of --interval): nothing was active
    out = capsys.readouterr().out
    assert "\x1b" not in out
    lines = out.splitlines()
    assert re.fullmatch(r"\d\d:\d\d:\d\d  no run active: final table", lines[0])
    assert lines[1].split()[:2] == ["NAME", "JOB"] and [line.split()[0] for line in lines[3:]] == ["r1", "r0"]


def test_watch_on_a_terminal_redraws_in_place_until_the_runs_end(tmp_path, monkeypatch):
    """The drawing only: Slurm's answer is stood in by the run's own events, which the pause between refreshes
    turns from started to finished (tests/cluster/test_status.py watches a real job)."""

    run_dir = make_run(tmp_path, "r", 1000)
    (run_dir / "events.jsonl").write_text('{"event": "started"}\n')
    monkeypatch.setattr(listing, "job_states", lambda records: {"r": from_run_dir(run_dir) or JobState("RUNNING")})
    monkeypatch.setattr(runs.time, "sleep", lambda s: (run_dir / "events.jsonl").write_text('{"event": "finished"}\n'))

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    monkeypatch.setattr("sys.stdout", Terminal())
    assert cli.main(["runs", "--watch", "--root", str(tmp_path)]) == 0
    frames = sys.stdout.getvalue().split("\x1b[H\x1b[2J")
    assert frames[0] == "" and len(frames) == 3
    assert "1 of 1 runs active; every 2s" in frames[1] and "RUNNING" in frames[1]
    assert "no run active: final table" in frames[2] and "COMPLETED" in frames[2]


def test_goodput_counts_kept_steps_and_where_the_rest_of_the_wall_time_went():
    from launcher.core.events import decode
    from launcher.core.metrics import decode as decode_row
    from launcher.status.goodput import goodput

    def record(step, at):
        return {"step": step, "step_time": 1.0, "loss": 2.0, "time": at}

    events = [{"event": "submitted", "time": 0.0}, {"event": "attempt", "time": 10.0}, {"event": "started", "time": 15.0},
              {"event": "attempt_ended", "outcome": "FAILED", "step": 105, "time": 130.0},
              {"event": "attempt", "time": 160.0}, {"event": "resumed", "step": 50, "time": 170.0},
              {"event": "finished", "step": 200, "time": 322.0}, {"event": "attempt_ended", "outcome": "COMPLETED",
                                                                  "time": 330.0}]
    metrics = [record(s, 15.0 + s) for s in range(10, 101, 10)] + [record(s, 120.0 + s) for s in range(60, 201, 10)]
    events = [decode(e) for e in events]
    metrics = [decode_row(m) for m in metrics + [{"final": True, "step": 200, "time": 321.0}]]
    measured = goodput(events, metrics, now=999.0)
    assert (measured.wall_s, measured.kept_s) == (330.0, 200.0)  # steps 0-50 of the first attempt, 50-200 of the second
    assert measured.lost_s == {"queue": 40.0, "start-up": 15.0, "re-trained": 55.0, "checkpoints and evaluation": 0.0,
                               "detection and ending": 25.0}
    assert measured.line() == ("Goodput: 0.61 of 330 s since submission trained kept steps; lost: queue 40 s, "
                               "start-up 15 s, re-trained 55 s, detection and ending 25 s")
    assert goodput(events[:2], [], now=20.0) is None  # no timed record yet


def test_a_long_cause_is_cut_to_one_short_status_in_the_table_and_kept_whole_in_the_row(tmp_path):
    run_dir = make_run(tmp_path, "r", 1.0)
    cause = ("cluster gone is not reachable (scontrol: error: Unable to contact slurm controller (connect failure)); "
             "start it or check its slurm.conf")
    row = listing.build_row(RunRecord(name="r", run_dir=str(run_dir), model="gpt_tiny", gpus=1, nodes=1,
                                      gpus_per_node=1, steps=40, cluster="gone", submitted_at=1.0),
                            JobState("UNKNOWN", cause, "squeue"))
    status = runs.table_row(row)[5]
    assert len(status) <= runs.STATUS_WIDTH and status.startswith("UNKNOWN (cluster gone is not reachable")
    assert status.endswith(" controller…)") and row.reason == cause  # shortened by words, never mid-word


class _Answers:
    """The queue's and accounting's rows of a cluster, as Slurm's client returns them (launcher/slurm/client.py)."""

    def __init__(self, queued, accounted):
        self.queued, self.accounted = queued, accounted

    def squeue(self):
        return self.queued

    def sacct(self, job_ids):
        return [row for row in self.accounted if row.job_id in job_ids]


def test_the_queue_tells_a_live_job_and_accounting_an_ended_one():
    """Accounting learns of a start seconds after the queue: a job just started reads PENDING there while it runs
    (``launcher stop`` cancelled such a run at once instead of asking it to save). It learns of an end first: the
    queue keeps a failed job COMPLETING while its processes are killed."""
    from launcher.slurm.output import JobRow
    from launcher.status.job_state import _ask_slurm

    queued = [JobRow("1", "RUNNING", "None", "n1", "2026-12-05T08:00:00", source="squeue"),
              JobRow("2", "COMPLETING", "None", "n1", "2026-12-05T08:00:00", source="squeue")]
    accounted = [JobRow("1", "PENDING", "None", "", "Unknown", source="sacct"),
                 JobRow("2", "FAILED", "None", "n1", "2026-12-05T08:00:00", exit_code="1:0", source="sacct"),
                 JobRow("3", "COMPLETED", "None", "n1", "2026-12-05T07:00:00", exit_code="0:0", source="sacct")]
    states, failures = _ask_slurm(_Answers(queued, accounted), ["1", "2", "3"])
    assert failures == [] and {job: (s.state, s.source) for job, s in states.items()} == {
        "1": ("RUNNING", "squeue"), "2": ("FAILED", "sacct"), "3": ("COMPLETED", "sacct")}
