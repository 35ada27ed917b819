"""Cause attribution: the rank that died is blamed, not the peers that lost it (units on evidence as the
local cluster produced it: srun's stderr, ranks' failed events, heartbeats)."""
import os
import time

from launcher.job.attempts import Cause, TaskEnd, attribute, expand_ranks, srun_task_ends

SRUN_KILLED = """\
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer
srun: error: local-node2: task 2: Killed
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
srun: error: local-node1: tasks 0-1: Exited with exit code 1
srun: error: local-node2: task 3: Exited with exit code 1
"""
PEER = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer [127.0.0.1]:4242"


def failed(rank, error, node="local-node1", step=40, time=1.0):
    return {"event": "failed", "rank": rank, "node": node, "error": error, "step": step, "time": time}


def test_srun_reports_are_parsed_in_order():
    assert srun_task_ends(SRUN_KILLED) == [TaskEnd("local-node2", [2], "Killed"),
                                           TaskEnd("local-node1", [0, 1], "Exited with exit code 1"),
                                           TaskEnd("local-node2", [3], "Exited with exit code 1")]
    assert expand_ranks("0-2,5") == [0, 1, 2, 5]


def test_a_killed_rank_is_blamed_not_the_peers_that_lost_it():
    events = [failed(0, PEER), failed(1, PEER), failed(3, PEER, node="local-node2")]
    cause = attribute(events, srun_task_ends(SRUN_KILLED), steps={2: 37})
    assert cause == Cause("FAILED", "rank 2 on local-node2 at step 37: killed by a signal (SIGKILL)", rank=2,
                          node="local-node2", step=37, short="rank 2 killed")


def test_a_rank_own_exception_wins_over_srun_and_peers():
    events = [failed(1, PEER, time=2.0), failed(3, "OSError: [Errno 28] No space left on device", "local-node2",
                                                 step=50, time=3.0)]
    cause = attribute(events, srun_task_ends(SRUN_KILLED), steps={})
    assert (cause.rank, cause.node, cause.step, cause.short) == (3, "local-node2", 50, "OSError")
    assert cause.text == "rank 3 on local-node2 at step 50: OSError: [Errno 28] No space left on device"


def test_a_stall_is_its_own_outcome():
    events = [{"event": "stalled", "cause": "rank 1 on n2 froze, last seen at step 9", "ranks": [1]},
              failed(0, PEER)]
    cause = attribute(events, [], steps={})
    assert (cause.outcome, cause.rank, cause.short) == ("STALLED", 1, "rank 1 hung")


def test_with_nothing_but_peer_losses_the_first_is_reported():
    cause = attribute([failed(2, PEER, time=5.0), failed(0, PEER, time=4.0)], [], steps={})
    assert (cause.rank, cause.short) == (0, "lost a peer")


def test_no_evidence_at_all_says_so_with_the_exit_status():
    assert attribute([], [], {}, exit_code=137).text == "srun exited with status 137"


def test_history_has_one_row_per_attempt_with_what_came_next():
    from launcher.status.attempt_log import history

    events = [{"event": "attempt", "attempt": 1, "job_id": "7", "nodes": "n[1-2]", "time": 10.0},
              failed(2, PEER),
              {"event": "attempt_ended", "outcome": "FAILED", "cause": "rank 2 on n2: killed", "time": 20.0},
              {"event": "retrying", "job_id": "8", "exclude": ["n2"], "time": 21.0},
              {"event": "attempt", "attempt": 2, "job_id": "8", "nodes": "n[1,3]", "time": 30.0},
              {"event": "attempt_ended", "outcome": "COMPLETED", "time": 90.0}]
    rows = history(events)
    assert [(r["attempt"], r["job_id"], r["outcome"]) for r in rows] == [(1, "7", "FAILED"), (2, "8", "COMPLETED")]
    assert rows[0]["then"] == "retried as job 8, excluding n2" and rows[1]["then"] == ""


def test_a_running_run_whose_steps_stopped_is_shown_stalled(tmp_path):
    import json as _json

    from launcher.core.heartbeats import heartbeat_path, stalled_for
    from launcher.core.rundir import write_json_atomic
    from launcher.status.job_state import JobState, in_its_words

    heartbeat_path(tmp_path, 0).parent.mkdir()
    for rank, since in ((0, 1000.0), (1, 1010.0)):
        write_json_atomic(heartbeat_path(tmp_path, rank), {"rank": rank, "node": "n1", "pid": 1, "step": 7,
                                                           "step_since": since, "alive": 1100.0})
    assert stalled_for(tmp_path, limit=30, step_time=None, now=1030.0) is None  # 20 s since rank 1's step began
    assert stalled_for(tmp_path, limit=30, step_time=None, now=1050.0) == 40.0
    assert stalled_for(tmp_path, limit=None, step_time=1.0, now=1300.0) is None  # derived: at least 300 s
    assert stalled_for(tmp_path, limit=None, step_time=20.0, now=1420.0) == 410.0  # 20 x 20 s = 400 s
    (tmp_path / "config.yaml").write_text(_json.dumps({"train": {"stall_timeout_s": 30}}))
    state = in_its_words(JobState("RUNNING", "", "squeue"), tmp_path)
    assert state.state == "RUNNING" and state.reason.startswith("stalled? no step for ")


def requeue_scene(tmp_path, monkeypatch, scontrol: str, max_requeues: int = 2):
    """A run directory whose ranks asked for a requeue, and an ``scontrol`` on PATH that runs ``scontrol``
    (a shell body) and logs its arguments to ``calls``."""
    from omegaconf import OmegaConf

    from launcher.core.config import ClusterConfig, ModelConfig, RunConfig

    cfg = RunConfig(model=ModelConfig(name="gpt_tiny", d_model=64, n_heads=2, n_layers=2, seq_len=32), name="cut",
                    cluster=ClusterConfig(max_requeues=max_requeues, signal_delay_s=20))
    OmegaConf.save(OmegaConf.structured(cfg), tmp_path / "config.yaml", resolve=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "calls"}\n{scontrol}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("SLURMD_NODENAME", "n1")
    return tmp_path / "calls"


def test_the_batch_shell_requeues_after_the_ranks_saved(tmp_path, monkeypatch):
    """On the host, not in a rank (which may run in a container without scontrol): the requeue the ranks asked
    for is made by the batch script's last step."""
    from launcher.core.rundir import append_event, read_events
    from launcher.job.recovery import requeue, requeue_asked

    calls = requeue_scene(tmp_path, monkeypatch, "exit 0")
    append_event(tmp_path, "attempt", attempt=1, job_id="9")
    append_event(tmp_path, "requeued", job_id="9", step=40, by="signal")
    events = read_events(tmp_path)
    assert requeue_asked(events) == 40
    assert requeue(tmp_path, "9", 40, events) is None
    assert calls.read_text() == "requeue 9\n"
    assert requeue_asked([*events, {"event": "failed", "error": "x"}]) is None  # failed after: not a requeue
    assert requeue_asked([{"event": "requeued", "step": 3}]) is None  # submitit's own handler requeued it


def test_a_requeue_the_controller_refuses_is_recorded_as_an_infrastructure_failure(tmp_path, monkeypatch):
    from launcher.core.rundir import append_event, read_events
    from launcher.job.attempts import attribute
    from launcher.job.recovery import INFRASTRUCTURE, requeue

    calls = requeue_scene(tmp_path, monkeypatch,
                          'echo "scontrol: error: Unable to contact slurm controller" >&2; exit 1')
    append_event(tmp_path, "requeued", job_id="9", step=40, by="signal")
    started = time.monotonic()
    failure = requeue(tmp_path, "9", 40, read_events(tmp_path))
    assert time.monotonic() - started >= 5  # asked again for max(5, signal_delay_s - 15) s
    assert len(calls.read_text().splitlines()) >= 2
    assert failure["error"] == ("ConnectionError: scontrol requeue 9 failed: scontrol: error: Unable to contact slurm "
                                "controller") and not failure.get("final")
    cause = attribute(read_events(tmp_path), [], {})
    assert (cause.short, cause.node, cause.step) == ("requeue failed", "n1", 40) and INFRASTRUCTURE.search(cause.error)


def test_requeues_without_progress_are_counted_and_end_the_run(tmp_path, monkeypatch):
    from launcher.core.rundir import append_event, read_events
    from launcher.job.recovery import requeue

    calls = requeue_scene(tmp_path, monkeypatch, "exit 0", max_requeues=2)
    for _ in range(3):  # two earlier attempts ended at step 40, and this third one again
        append_event(tmp_path, "requeued", job_id="9", step=40, by="signal")
    failure = requeue(tmp_path, "9", 40, read_events(tmp_path))
    verdict = read_events(tmp_path)[-1]
    assert (verdict["event"], verdict["final"], verdict["short"]) == ("failed", True, "no progress") == (
        "failed", failure["final"], failure["short"])
    assert "3 attempts in a row ended at step 40" in verdict["error"] and not calls.exists()
    append_event(tmp_path, "requeued", job_id="9", step=41, by="signal")  # progress: the count starts again
    assert requeue(tmp_path, "9", 41, read_events(tmp_path)) is None


def test_a_time_limit_within_the_signal_delay_is_refused():
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-m", "launcher", "cluster.time_limit_min=1", "cluster.signal_delay_s=60",
                          "dry_run=json"], capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "cluster.time_limit_min=1 (60 s) leaves no time to train" in res.stderr


def test_a_rank_that_dies_after_the_run_finished_does_not_fail_the_attempt(tmp_path, monkeypatch):
    """Seen in CI: Slurm's time-limit signal reached a rank while Python shut down after the final checkpoint
    (Python puts the default action back then): srun reported the rank killed. The run is complete, and the job
    must read COMPLETED too (the batch script's exit status)."""
    from launcher.core.rundir import append_event, read_events
    from launcher.job.recovery import main

    requeue_scene(tmp_path, monkeypatch, "exit 1")  # no Slurm to ask: the answer must not depend on it
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    append_event(tmp_path, "attempt", attempt=1, job_id="9")
    append_event(tmp_path, "finished", step=40, loss=2.0)
    assert main(["end", str(tmp_path), "143"]) == 0
    ended = read_events(tmp_path)[-1]
    assert (ended["event"], ended["outcome"], ended["exit_code"]) == ("attempt_ended", "COMPLETED", 143)
    assert "after the run finished" in ended["note"]
