"""The run's claim (launcher/job/claim.py): one job of a run at a time, whoever submits it. Slurm's answer about
a job is given as a function here; the cluster tests (tests/cluster/test_one_job.py) ask the real one."""
from __future__ import annotations

import json
import multiprocessing
import threading
import time

import pytest

from launcher.job import claim
from launcher.job.claim import ClaimHeld
from launcher.slurm.output import SlurmError


def states(**by_job):
    """Slurm's state of each job named (``j123="RUNNING"``); "" (forgotten) for any other."""
    return lambda job_id: by_job.get(f"j{job_id}", "")


def test_the_first_claim_names_its_job_and_a_second_submission_is_refused_naming_it(tmp_path):
    taken = claim.take(tmp_path, "launch", states())
    assert (taken.generation, taken.job_id, taken.by) == (1, None, "launch")
    claim.name(tmp_path, taken, "123")
    assert claim.current(tmp_path).job_id == "123"
    with pytest.raises(ClaimHeld, match=r"already has job 123 \(RUNNING\); one job of a run at a time"):
        claim.take(tmp_path, "resume", states(j123="RUNNING"))
    with pytest.raises(ClaimHeld, match=r"job 123 \(PENDING\)"):
        claim.take(tmp_path, "resume", states(j123="PENDING"))


@pytest.mark.parametrize("state", ["", "COMPLETED", "FAILED", "CANCELLED by 1000", "TIMEOUT", "NODE_FAIL"])
def test_a_claim_whose_job_ended_is_taken_over(tmp_path, state):
    claim.name(tmp_path, claim.take(tmp_path, "launch", states()), "123")
    again = claim.take(tmp_path, "resume", states(j123=state))
    assert again.generation == 2 and claim.current(tmp_path) == again


def test_a_job_retrying_itself_takes_over_its_own_claim_without_asking_slurm(tmp_path):
    claim.name(tmp_path, claim.take(tmp_path, "launch", states()), "123")

    def unanswered(job_id):
        raise SlurmError("squeue: Unable to contact slurm controller", transient=True)

    assert claim.take(tmp_path, "retry", unanswered, holder="123").generation == 2


def test_a_controller_that_does_not_answer_refuses_rather_than_guesses(tmp_path):
    claim.name(tmp_path, claim.take(tmp_path, "launch", states()), "123")

    def unanswered(job_id):
        raise SlurmError("squeue: Unable to contact slurm controller", transient=True)

    with pytest.raises(ClaimHeld, match="cannot tell whether job 123 of the run still runs: squeue: Unable"):
        claim.take(tmp_path, "resume", unanswered)


def test_a_submission_in_progress_holds_the_run_until_its_window_passes(tmp_path):
    taken = claim.take(tmp_path, "resume", states())
    with pytest.raises(ClaimHeld, match=r"already has a submission by resume on .* \(pid \d+, \d+ s ago\)"):
        claim.take(tmp_path, "resume", states())
    path = tmp_path / claim.CLAIMS / "00000001.json"  # as a submitter that died after sbatch leaves it
    path.write_text(json.dumps({**json.loads(path.read_text()), "time": time.time() - claim.SUBMIT_WINDOW_S - 1}))
    assert claim.take(tmp_path, "resume", states()).generation == taken.generation + 1


def test_a_failed_submission_gives_the_claim_back(tmp_path):
    first = claim.name(tmp_path, claim.take(tmp_path, "launch", states()), "123")
    second = claim.take(tmp_path, "resume", states())
    claim.drop(tmp_path, second)
    assert claim.current(tmp_path) == first


def test_a_damaged_newest_generation_is_passed_over_and_never_reused(tmp_path):
    first = claim.name(tmp_path, claim.take(tmp_path, "launch", states()), "123")
    (tmp_path / claim.CLAIMS / "00000002.json").write_text('{"generation": 2, "job_')
    assert claim.current(tmp_path) == first
    assert claim.take(tmp_path, "resume", states()).generation == 3


def test_old_generations_are_pruned(tmp_path):
    for job in range(6):
        claim.name(tmp_path, claim.take(tmp_path, "resume", states()), str(job))
    assert sorted(p.name for p in (tmp_path / claim.CLAIMS).iterdir()) == [
        "00000004.json", "00000005.json", "00000006.json"]


def _take(run_dir, ready, results):
    ready.wait()
    try:
        results.put(claim.take(run_dir, "resume", states()).generation)
    except ClaimHeld as err:
        results.put(str(err))


def test_of_eight_processes_taking_the_claim_at_once_exactly_one_gets_it(tmp_path):
    claim.name(tmp_path, claim.take(tmp_path, "launch", states()), "123")  # job 123 has ended
    ctx = multiprocessing.get_context("fork")
    ready, results = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_take, args=(tmp_path, ready, results)) for _ in range(8)]
    for proc in procs:
        proc.start()
    ready.set()
    answers = [results.get(timeout=30) for _ in procs]
    for proc in procs:
        proc.join()
    assert sorted(answers, key=str)[0] == 2 and answers.count(2) == 1, answers
    assert all("already has a submission by resume" in a for a in answers if a != 2), answers


def test_a_starting_job_trains_only_if_the_claim_names_it(tmp_path):
    claim.name(tmp_path, claim.take(tmp_path, "launch", states()), "123")
    assert claim.enter(tmp_path, states(j123="RUNNING"), "123") is None
    refused = claim.enter(tmp_path, states(j123="RUNNING"), "456")
    assert isinstance(refused, ClaimHeld) and "already has job 123 (RUNNING)" in str(refused)
    assert claim.current(tmp_path).job_id == "123"
    # job 123 ended: a job submitted without the claim (by hand, or by an older launcher) takes it over
    assert claim.enter(tmp_path, states(j123="COMPLETED"), "456") is None
    assert (claim.current(tmp_path).job_id, claim.current(tmp_path).by) == ("456", "job")


def test_a_run_without_a_claim_is_claimed_by_its_first_job(tmp_path):
    assert claim.enter(tmp_path, states(), "77_3") is None
    assert claim.current(tmp_path).job_id == "77_3"


def test_a_starting_job_waits_for_the_submission_that_names_it(tmp_path):
    taken = claim.take(tmp_path, "resume", states())
    threading.Timer(0.5, claim.name, (tmp_path, taken, "123")).start()
    started = time.monotonic()
    assert claim.enter(tmp_path, states(j123="RUNNING"), "123", poll_s=0.1) is None
    assert time.monotonic() - started >= 0.4
    assert claim.current(tmp_path).generation == taken.generation  # named, not taken over


def test_this_job_is_named_as_the_run_record_names_it(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "901")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_TASK_ID", raising=False)
    assert claim.this_job() == "901"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "900")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "1")
    assert claim.this_job() == "900_1"
