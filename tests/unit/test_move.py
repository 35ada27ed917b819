"""``launcher move`` without a cluster: what a run in each state is told, the target's checks, the claim a move
takes over its waiting job (of two takers, one wins), the cluster every event naming a job carries, the move in
words, and the console's Move answered in one line where it cannot act."""
from __future__ import annotations

import json
import os

import pytest
from starlette.testclient import TestClient

from launcher.cli import main
from launcher.console import actions
from launcher.console.app import Console, application
from launcher.core.attempt_log import AttemptLog
from launcher.core.events import Attempt, Moved, Submitted
from launcher.core.rundir import append_event, names_this_job
from launcher.core.run_index import RunRecord, save_record
from launcher.errors import LaunchError
from launcher.job import claim
from launcher.remote.ssh import Remote
from launcher.service.move import moved_line, target_of, targets, unmovable


def a_record(tmp_path, cluster="local") -> RunRecord:
    run_dir = tmp_path / "r"
    run_dir.mkdir(exist_ok=True)
    rec = RunRecord(name="r", run_dir=str(run_dir), model="gpt_tiny", gpus=1, nodes=1, gpus_per_node=1, steps=6,
                    cluster=cluster, submitted_at=1.0, job_id="7")
    save_record(rec)
    return rec


def test_only_a_waiting_run_moves_and_the_others_are_told_what_to_do_instead():
    assert unmovable("r", "7", "PENDING") is None
    assert unmovable("r", "7", "RUNNING") == "r is RUNNING (job 7); only a waiting (PENDING) run moves: it trains " \
        "where it is"
    assert "move it once its next job waits in the queue" in unmovable("r", "7", "RECOVERING")
    assert unmovable("r", "7", "COMPLETED").startswith("r is COMPLETED; only a waiting (PENDING) run moves: "
                                                       "'launcher resume r' goes on where it ran")


def test_the_target_is_a_configured_cluster_other_than_the_runs_own(tmp_path):
    rec = a_record(tmp_path)
    with pytest.raises(LaunchError, match=r"^cluster=nosuch is not a configured cluster \("):
        target_of(rec, "nosuch")
    with pytest.raises(LaunchError, match="^r already waits on cluster local; move it to another"):
        target_of(rec, "local")
    with pytest.raises(LaunchError, match="^cluster=slurm is not a configured cluster"):
        target_of(rec, "slurm")
    assert "local" not in targets("local") and "slurm" not in targets("local")


def test_a_move_refused_is_one_line_and_exit_2(tmp_path, capsys):
    a_record(tmp_path)
    assert main(["move", "r", "gpus=2", "--root", str(tmp_path)]) == 2
    assert capsys.readouterr().err == "error: move takes cluster=NAME, the configured cluster the waiting run goes " \
        "to, or cluster=auto, where it starts first; got 'gpus=2'\n"
    assert main(["move", "r", "cluster=local", "--root", str(tmp_path)]) == 2  # Slurm's stubs: not known to wait
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "only a waiting (PENDING) run moves" in err, err


def test_of_two_moves_one_takes_the_claim_and_a_resume_after_it_is_refused(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    held = claim.take(run_dir, "launch", lambda job: "")
    claim.name(run_dir, held, "7")
    taken = claim.take_over(run_dir, "move", "7")
    with pytest.raises(claim.ClaimHeld, match=r"^r already has a submission by move on .*; one job of a run at a time"):
        claim.take_over(run_dir, "move", "7")
    with pytest.raises(claim.ClaimHeld, match="^r already has a submission by move"):
        claim.take(run_dir, "resume", lambda job: "")
    claim.drop(run_dir, taken)
    with pytest.raises(claim.ClaimHeld, match="^r already has job 7; one job"):
        claim.take_over(run_dir, "move", "8")  # not the job the claim names


def test_an_event_naming_a_job_names_the_runs_cluster_and_this_job_is_told_by_both(tmp_path, monkeypatch):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    append_event(run_dir, Submitted(job_id="7"))  # no config: no cluster known
    (run_dir / "config.yaml").write_text("cluster:\n  name: local2\n")
    append_event(run_dir, Attempt(attempt=1, job_id="7"))
    append_event(run_dir, Moved(job_id="3", cluster="local", from_job_id="7", from_cluster="local2"))
    lines = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [(line["job_id"], line["cluster"]) for line in lines] == [("7", None), ("7", "local2"), ("3", "local")]
    monkeypatch.setitem(os.environ, "SLURM_JOB_ID", "7")
    assert names_this_job(run_dir, "7", "local2") and names_this_job(run_dir, "7", None)
    assert not names_this_job(run_dir, "7", "local") and not names_this_job(run_dir, "8", "local2")


def test_a_move_in_words_and_the_wait_it_ended():
    log = AttemptLog([Submitted(time=100.0, job_id="7"), Attempt(time=160.0, job_id="7"),
                      Moved(time=200.0, job_id="3", cluster="b", from_job_id="8", from_cluster="a")])
    assert log.queued_since() == 200.0 and AttemptLog(log.events[:2]).queued_since() is None
    moved = Moved(time=200.0, job_id="3", cluster="local2", from_job_id="8", from_cluster="local", waited_s=2400,
                  by="ada")
    assert moved_line(moved).startswith("Moved: from local at ")
    assert moved_line(moved).endswith(" (job 8, waited 40m00s) to local2 (job 3) by ada")


def test_the_consoles_move_names_its_cluster_and_acts_only_on_this_machines_runs(tmp_path):
    web = TestClient(application(Console([tmp_path], tmp_path, "t", ["127.0.0.1:8000"])),
                     base_url="http://127.0.0.1:8000")
    web.get("/?token=t")
    own = {"origin": "http://127.0.0.1:8000"}
    answer = web.post("/api/run/r/move", headers=own)
    assert answer.status_code == 400 and answer.json()["error"] == "a move names the cluster it goes to: " \
        "/api/run/r/move?to=CLUSTER"
    a_record(tmp_path)
    answer = web.post("/api/run/r/move?to=local2", headers=own)  # Slurm's stubs: not known to wait
    assert answer.status_code == 400 and answer.json()["error"].startswith("r is UNKNOWN; only a waiting (PENDING)")
    with pytest.raises(LaunchError, match="^r is on site, reached over SSH: 'launcher move' there moves it$"):
        actions.act("move", tmp_path, "r", Remote("site", "site", 5.0, None, None, None), to="local2")


def test_a_moves_copy_that_did_not_become_a_run_is_removed_there_and_nothing_else(tmp_path, monkeypatch):
    from launcher.remote import agent

    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path))
    into = agent.incoming({"name": "r"})["path"]
    (tmp_path / "kept").mkdir()
    with pytest.raises(LaunchError, match="is no folder a move copies into"):
        agent.discard({"incoming": str(tmp_path / "kept")})
    assert agent.discard({"incoming": into}) == {} and not os.path.exists(into) and (tmp_path / "kept").is_dir()
    assert agent.discard({"incoming": into}) == {}  # gone already: nothing to do

    into = agent.incoming({"name": "r"})["path"]
    record = {**RunRecord(name="r", run_dir="/elsewhere/r", model="gpt_tiny", gpus=1, nodes=1, gpus_per_node=1,
                          steps=6, cluster="local", submitted_at=1.0, job_id="7").to_json()}
    with pytest.raises(Exception):  # a run the cluster's side cannot compose: not submitted
        agent.adopt({"name": "r", "incoming": into, "run": {}, "record": record, "moved": {}})
    assert not (tmp_path / "r").exists() and not os.path.exists(into)  # no run of that name left behind
