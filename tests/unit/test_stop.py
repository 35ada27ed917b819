"""A stop that saves first: ``launcher stop``'s refusals and its words, the rule by which the ranks save on Slurm's
SIGTERM, and how an attempt the user or Slurm ended is recorded and shown (launcher/service/stop.py,
launcher/core/preemption.py, launcher/job/endings.py). The ranks' side is in test_train_dist.py; the real thing, on
a cluster, in tests/cluster/test_stop.py."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from launcher import cli
from launcher.core import stop_request
from launcher.core.events import Attempt, AttemptEnded, Outcome, Stopped, Terminated
from launcher.core.preemption import kill_wait_s, save_fits
from launcher.core.rundir import append_event, read_events
from launcher.core.run_index import RunRecord, save_record
from launcher.status.job_state import JobState, in_its_words
from support.helpers import wait_for


@pytest.mark.parametrize("kill_wait, heard_s, save_s, why", [
    (30.0, 10.0, 4.0, None),  # 4 x 1.5 + 2 = 8 s of the 20 left
    (30.0, 23.0, 4.0, "a save (about 4.0 s) would not fit in the 7.0 s left of KillWait=30 s"),
    (5.0, 7.0, 0.1, "a save (about 0.1 s) would not fit in the 0.0 s left of KillWait=5 s"),
    (None, 1.0, 0.1, "Slurm's KillWait is unknown here"),
    (30.0, 1.0, None, "no checkpoint was saved or loaded in this attempt yet"),
])
def test_the_ranks_save_on_slurms_sigterm_only_when_the_save_fits_before_its_sigkill(kill_wait, heard_s, save_s, why):
    said = save_fits(kill_wait, heard_s, save_s)
    assert said == why if why is None else said.startswith(why), said


def test_kill_wait_reaches_the_ranks_as_whole_seconds_or_not_at_all():
    assert [kill_wait_s(env) for env in ({"LAUNCHER_KILL_WAIT_S": "30"}, {"LAUNCHER_KILL_WAIT_S": ""}, {})] == [
        30.0, None, None]


def record(root: Path, name: str = "r", job_id: str = "5") -> Path:
    run_dir = root / name
    run_dir.mkdir(parents=True)
    save_record(RunRecord(name=name, run_dir=str(run_dir), model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2,
                          steps=100, cluster="local", submitted_at=time.time(), job_id=job_id))
    return run_dir


@pytest.mark.parametrize("args, words", [
    (["--now", "--wait", "10", "r"], "error: --now cancels at once and --wait waits for a save first: give one of "
                                     "them"),
    (["--wait", "0", "r"], "error: launcher stop: argument --wait: a whole number of seconds, at least 1, is needed "
                           "(--now stops at once), not '0'; see --help"),
    (["--wait", "1m", "r"], "not '1m'; see --help"),
    ([], "error: name at least one run, or --sweep ID"),
    (["nosuch"], "error: no run named 'nosuch' in "),
])
def test_a_bad_stop_is_refused_in_one_line(tmp_path, capsys, args, words):
    record(tmp_path)
    assert cli.main(["stop", *args, "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


@pytest.fixture
def running(tmp_path, monkeypatch):
    """Run ``r`` (job 5) running, as Slurm would say, and the jobs ``launcher stop`` cancels."""
    from launcher.service import stop

    run_dir = record(tmp_path)
    cancelled: list = []
    monkeypatch.setattr(stop, "job_states", lambda records: {rec.name: JobState(
        "CANCELLED" if cancelled else "RUNNING") for rec in records})
    monkeypatch.setattr(stop, "scancel", lambda rec: cancelled.append(rec.job_id))
    monkeypatch.setattr(stop, "POLL_S", 0.01)
    return run_dir, cancelled


def test_a_running_run_is_asked_to_save_and_its_job_is_left_to_end(running, tmp_path, capsys, monkeypatch):
    """Its ranks save step 40 (rank 0's ``stopped``) and the batch script's last step records the attempt: the
    stop says where it saved, cancels nothing, and takes its request back."""
    run_dir, cancelled = running
    monkeypatch.setenv("SLURM_JOB_ID", "5")  # as rank 0 of job 5 looks for the request

    def ranks():  # rank 0 at the next agreement, then the batch script's last step
        asked = wait_for(lambda: stop_request.asked(run_dir), 10, "a stop request", interval=0.01)
        append_event(run_dir, Stopped(job_id=asked.job_id, step=40, by=asked.by))
        append_event(run_dir, AttemptEnded(attempt=1, job_id="5", outcome=Outcome.CANCELLED, step=40))

    threading.Thread(target=ranks, daemon=True).start()
    assert cli.main(["stop", "r", "--root", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == ["Asked r (job 5) to save the step it is at and end; waiting up to 300 s before cancelling it "
                   "(--now: at once).",
                   "Stopped r (job 5) at step 40: every rank saved it; 'launcher resume r' continues from there."]
    assert cancelled == [] and not (run_dir / stop_request.REQUEST).exists()
    asked = next(e for e in read_events(run_dir) if e.kind == "stop_asked")
    assert (asked.job_id, asked.wait_s, bool(asked.by)) == ("5", 300, True)


def test_a_run_that_does_not_save_within_the_wait_is_cancelled(running, tmp_path, capsys):
    run_dir, cancelled = running
    began = time.monotonic()
    assert cli.main(["stop", "r", "--wait", "1", "--root", str(tmp_path)]) == 0
    assert 1 <= time.monotonic() - began < 10 and cancelled == ["5"]
    assert capsys.readouterr().out.splitlines()[-1] == (
        "Stopped r (job 5): its ranks did not save within the wait, so its job was cancelled; 'launcher resume r' "
        "continues from its newest checkpoint.")
    assert [e.kind for e in read_events(run_dir)] == ["stop_asked", "cancelled"]


def end_of(tmp_path, monkeypatch, *events, step="end") -> dict:
    """The attempt's end as the batch script's ``end`` step (or the next attempt's ``begin``) records it after
    ``events``, in a run of job 9 whose Slurm cannot be asked."""
    from launcher.job.recovery import main

    monkeypatch.setenv("SLURM_JOB_ID", "9")
    append_event(tmp_path, Attempt(attempt=1, job_id="9"))
    for event in events:
        append_event(tmp_path, event)
    assert main([step, str(tmp_path), "0"]) == 0
    return next(json.loads(line) for line in reversed((tmp_path / "events.jsonl").read_text().splitlines())
                if json.loads(line)["event"] == "attempt_ended")


def test_an_attempt_stopped_after_its_ranks_saved_ends_cancelled_at_that_step(tmp_path, monkeypatch):
    ended = end_of(tmp_path, monkeypatch, Stopped(job_id="9", step=40, by="ann"))
    assert (ended["outcome"], ended["step"], ended["short"]) == ("CANCELLED", 40, "stopped at step 40")
    assert ended["cause"] == ("stopped by ann (launcher stop) at step 40: every rank saved it, and 'launcher resume' "
                              "continues from there")
    shown = in_its_words(JobState("COMPLETED", "", "sacct"), tmp_path)  # the job itself ended well
    assert (shown.state, shown.reason) == ("CANCELLED", "stopped at step 40")


def test_a_requeue_from_outside_says_whether_the_ranks_saved_on_slurms_sigterm(tmp_path, monkeypatch):
    """The next attempt's begin step records the one Slurm requeued (its batch shell was killed with it)."""
    saved = Terminated(job_id="9", signal="SIGTERM", step=47, saved=True, kill_wait_s=30, left_s=25.0, save_s=0.4)
    ended = end_of(tmp_path, monkeypatch, saved, step="begin")
    assert (ended["outcome"], ended["step"]) == ("REQUEUED", 47)
    assert ended["cause"] == ("requeued from outside the run (scontrol requeue, a preemption, or a node that came "
                              "back) at step 47: every rank saved it on Slurm's SIGTERM, nothing is trained again")


def test_a_cancel_that_left_no_time_to_save_says_why_and_what_is_trained_again(tmp_path, monkeypatch):
    from launcher.job.endings import cancelled

    (tmp_path / "checkpoints" / "step_00000040").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step_00000040" / "meta.json").write_text("{}")
    late = Terminated(job_id="9", step=47, saved=False, reason="a save (about 4.0 s) would not fit in the 1.0 s "
                      "left of KillWait=5 s")
    ended = cancelled(tmp_path, [late], 1, "9")
    assert (ended.outcome, ended.step, ended.short) == (Outcome.CANCELLED, 47, "cancelled at step 47")
    assert ended.cause == ("cancelled (launcher stop --now, scancel, or Slurm) at step 47: not saved on Slurm's "
                           "SIGTERM: a save (about 4.0 s) would not fit in the 1.0 s left of KillWait=5 s; the steps "
                           "after step 40 (the newest checkpoint) are trained again")
