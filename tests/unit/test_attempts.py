"""Cause attribution: the rank that died is blamed, not the peers that lost it (units on evidence as the
local cluster produced it: srun's stderr, ranks' failed events, heartbeats)."""
import os

import pytest

from launcher.core.events import Attempt, Fault, Finished, Requeued, decode
from launcher.core.failures import classify
from launcher.core.heartbeats import EXIT_STALLED, Pulse
from launcher.job.attempts import Cause, attribute
from launcher.job.policy import Decision, decide, schedulable
from launcher.job.recovery import batch_end, exit_status, trained
from launcher.slurm.output import TaskEnd, expand_ranks, srun_lost_nodes, srun_task_ends
from support.helpers import events as lines, run_launcher

SRUN_KILLED = """\
[rank0]: RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer
srun: error: local-node2: task 2: Killed
srun: Job step aborted: Waiting up to 32 seconds for job step to finish.
srun: error: local-node1: tasks 0-1: Exited with exit code 1
srun: error: local-node2: task 3: Exited with exit code 1
"""
PEER = "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection reset by peer [127.0.0.1]:4242"


def failed(rank, error, node="local-node1", step=40, time=1.0, fault=None):
    """A rank's ``failed`` event as launcher/core/failures.py records it: of a RuntimeError with this message,
    unless ``fault`` says otherwise."""
    fault = fault or classify(RuntimeError(error))
    return decode({"event": "failed", "rank": rank, "node": node, "error": error, "step": step, "time": time,
                   "fault": fault})


def pulse(rank, step, alive=100.0, node="local-node1"):
    return Pulse(rank=rank, node=node, pid=1000 + rank, step=step, step_since=alive - 1, alive=alive)


def test_srun_reports_are_parsed_in_order():
    assert srun_task_ends(SRUN_KILLED) == [TaskEnd("local-node2", [2], "Killed"),
                                           TaskEnd("local-node1", [0, 1], "Exited with exit code 1", after_end=True),
                                           TaskEnd("local-node2", [3], "Exited with exit code 1", after_end=True)]
    assert expand_ranks("0-2,5") == [0, 1, 2, 5]


def test_a_killed_rank_is_blamed_not_the_peers_that_lost_it():
    events = [failed(0, PEER), failed(1, PEER), failed(3, PEER, node="local-node2")]
    cause = attribute(events, srun_task_ends(SRUN_KILLED), [pulse(2, 37, node="local-node2")])
    assert cause == Cause("FAILED", "rank 2 on local-node2 at step 37: killed by a signal (SIGKILL)", Fault.KILLED,
                          rank=2,
                          node="local-node2", step=37, short="rank 2 killed")


def test_a_killed_rank_is_named_at_the_newest_of_its_heartbeat_and_the_logged_step():
    """Rank 2 was killed at step 120, which rank 0 had logged; its heartbeat, a few beats behind, said 91. A rank that
    left no heartbeat in this attempt is named at the logged step too."""
    killed = [TaskEnd("local-node2", [2], "Killed")]
    cause = attribute([failed(0, PEER)], killed, [pulse(2, 91, node="local-node2")], logged=120)
    assert (cause.step, cause.text) == (120, "rank 2 on local-node2 at step 120: killed by a signal (SIGKILL)")
    assert attribute([], killed, [], logged=120).step == 120
    assert attribute([], killed, [pulse(2, 125, node="local-node2")], logged=120).step == 125


def test_a_rank_own_exception_wins_over_srun_and_peers():
    events = [failed(1, PEER, time=2.0), failed(3, "OSError: [Errno 28] No space left on device", "local-node2",
                                                 step=50, time=3.0)]
    cause = attribute(events, srun_task_ends(SRUN_KILLED), [])
    assert (cause.rank, cause.node, cause.step, cause.short) == (3, "local-node2", 50, "disk full")
    assert cause.text == "rank 3 on local-node2 at step 50: OSError: [Errno 28] No space left on device"


def test_a_stall_is_its_own_outcome():
    events = [decode({"event": "stalled", "cause": "rank 1 on n2 froze, last seen at step 9", "ranks": [1]}),
              failed(0, PEER)]
    cause = attribute(events, [], [])
    assert (cause.outcome, cause.rank, cause.short) == ("STALLED", 1, "rank 1 hung")


def test_with_nothing_but_peer_losses_the_first_is_reported():
    cause = attribute([failed(2, PEER, time=5.0), failed(0, PEER, time=4.0)], [], [])
    assert (cause.rank, cause.short) == (0, "lost a peer")


def test_no_evidence_at_all_says_so_with_the_exit_status():
    assert attribute([], [], [], exit_code=137).text == "srun exited with status 137"


def test_history_has_one_row_per_attempt_with_what_came_next():
    from launcher.core.attempt_log import AttemptLog

    events = [{"event": "submitted", "job_id": "7", "time": 4.0},
              {"event": "attempt", "attempt": 1, "job_id": "7", "nodes": "n[1-2]", "time": 10.0},
              failed(2, PEER),
              {"event": "attempt_ended", "outcome": "FAILED", "cause": "rank 2 on n2: killed", "time": 20.0},
              {"event": "retrying", "job_id": "8", "exclude": ["n2"], "time": 21.0},
              {"event": "attempt", "attempt": 2, "job_id": "8", "nodes": "n[1,3]", "time": 30.0},
              {"event": "attempt_ended", "outcome": "COMPLETED", "time": 90.0}]
    rows = AttemptLog([e if not isinstance(e, dict) else decode(e) for e in events]).history()
    assert [(r.attempt, r.job_id, r.outcome) for r in rows] == [(1, "7", "FAILED"), (2, "8", "COMPLETED")]
    assert rows[0].then == "retried as job 8, excluding n2" and rows[1].then == ""
    assert [r.queued_s for r in rows] == [6.0, 9.0]  # from its submission, and from the retry's


def test_an_attempt_of_a_record_that_never_said_its_submission_has_no_queue_time():
    from launcher.core.attempt_log import AttemptLog

    events = [{"event": "attempt", "attempt": 1, "job_id": "7", "time": 10.0},
              {"event": "requeued", "job_id": "7", "by": "signal", "time": 50.0},
              {"event": "attempt_ended", "outcome": "REQUEUED", "time": 52.0},
              {"event": "attempt", "attempt": 2, "job_id": "7", "time": 70.0}]
    rows = AttemptLog([decode(e) for e in events]).history()
    assert [r.queued_s for r in rows] == [None, 18.0]  # a requeue waits from its attempt's end


def test_a_running_run_whose_steps_stopped_is_shown_stalled(tmp_path):
    import json as _json

    from launcher.core.heartbeats import Pulse, encode_node, node_path, stalled_for
    from launcher.core.rundir import write_json_atomic
    from launcher.status.job_state import JobState, in_its_words

    node_path(tmp_path, "n1").parent.mkdir()
    node_path(tmp_path, "n1").write_bytes(encode_node("n1", [Pulse(0, "n1", 1, 7, 1000.0, 1100.0)], 1100.0))
    # rank 1's file as a launcher before node files wrote it: an older run is read the same way
    write_json_atomic(tmp_path / "heartbeats" / "rank_00001.json", {"rank": 1, "node": "n1", "pid": 2, "step": 7,
                                                                   "step_since": 1010.0, "alive": 1100.0})
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
    from launcher.job.requeue import requeue, requeue_asked

    calls = requeue_scene(tmp_path, monkeypatch, "exit 0")
    append_event(tmp_path, Attempt(attempt=1, job_id="9"))
    append_event(tmp_path, Requeued(job_id="9", step=40, by="signal"))
    events = read_events(tmp_path)
    assert requeue_asked(events) == 40
    assert requeue(tmp_path, "9", 40, events) is None
    assert calls.read_text() == "requeue 9\n"
    assert requeue_asked([*events, decode({"event": "failed", "error": "x"})]) is None  # failed after: not a requeue
    assert requeue_asked([decode({"event": "requeued", "step": 3})]) is None  # submitit's own handler requeued it


def test_a_requeue_the_controller_refuses_is_recorded_as_an_infrastructure_failure(tmp_path, monkeypatch):
    from launcher.core.rundir import append_event, read_events
    from launcher.job.attempts import attribute
    from launcher.job.requeue import Clock, requeue

    calls = requeue_scene(tmp_path, monkeypatch,
                          'echo "scontrol: error: Unable to contact slurm controller" >&2; exit 1')
    append_event(tmp_path, Requeued(job_id="9", step=40, by="signal"))
    elapsed = [0.0]  # the back-off's own clock, moved by its sleeps: no real second is waited
    clock = Clock(now=lambda: elapsed[0], sleep=lambda s: elapsed.__setitem__(0, elapsed[0] + s))
    failure = requeue(tmp_path, "9", 40, read_events(tmp_path), clock)
    assert elapsed[0] >= 5  # asked again for max(5, signal_delay_s - 15) s
    assert len(calls.read_text().splitlines()) >= 2
    assert failure.error == ("scontrol requeue 9 failed: scontrol: error: Unable to contact slurm "
                             "controller") and not failure.final
    cause = attribute(read_events(tmp_path), [], [])
    assert (cause.short, cause.node, cause.step) == ("requeue failed", "n1", 40) and cause.fault == Fault.INFRASTRUCTURE


def test_requeues_without_progress_are_counted_and_end_the_run(tmp_path, monkeypatch):
    from launcher.core.rundir import append_event, read_events
    from launcher.job.requeue import requeue

    calls = requeue_scene(tmp_path, monkeypatch, "exit 0", max_requeues=2)
    for _ in range(3):  # two earlier attempts ended at step 40, and this third one again
        append_event(tmp_path, Requeued(job_id="9", step=40, by="signal"))
    failure = requeue(tmp_path, "9", 40, read_events(tmp_path))
    verdict = lines(tmp_path)[-1]
    assert (verdict["event"], verdict["final"], verdict["short"]) == ("failed", True, "no progress") == (
        "failed", failure.final, failure.short)
    assert "3 attempts in a row ended at step 40" in verdict["error"] and not calls.exists()
    append_event(tmp_path, Requeued(job_id="9", step=41, by="signal"))  # progress: the count starts again
    assert requeue(tmp_path, "9", 41, read_events(tmp_path)) is None


def test_a_time_limit_within_the_signal_delay_is_refused():

    res = run_launcher("cluster.time_limit_min=1", "cluster.signal_delay_s=60", "dry_run=json", timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert "cluster.time_limit_min=1 (60 s) leaves no time to train" in res.stderr


def test_a_rank_that_dies_after_the_run_finished_does_not_fail_the_attempt(tmp_path, monkeypatch):
    """Seen in CI: Slurm's time-limit signal reached a rank while Python shut down after the final checkpoint
    (Python puts the default action back then): srun reported the rank killed. The run is complete, and the job
    must read COMPLETED too (the batch script's exit status)."""
    from launcher.core.rundir import append_event
    from launcher.job.recovery import main

    requeue_scene(tmp_path, monkeypatch, "exit 1")  # no Slurm to ask: the answer must not depend on it
    monkeypatch.setenv("SLURM_JOB_ID", "9")
    append_event(tmp_path, Attempt(attempt=1, job_id="9"))
    append_event(tmp_path, Finished(step=40, loss=2.0))
    assert main(["end", str(tmp_path), "143"]) == 0
    ended = lines(tmp_path)[-1]
    assert (ended["event"], ended["outcome"], ended["exit_code"]) == ("attempt_ended", "COMPLETED", 143)
    assert "after the run finished" in ended["note"]


# srun's stderr when one node of two was lost with its ranks (its slurmd and ranks SIGKILLed on the local cluster),
# and when a retry was placed on a node whose slurmd had died before Slurm marked it down.
SRUN_NODE_DIED = """\
srun: error: local-node2: tasks 2-3: Killed
srun: launch/slurm: _step_signal: Terminating StepId=207.0
srun: error: local-node1: tasks 0-1: Terminated
srun: Force Terminated StepId=207.0
"""
SRUN_LAUNCH_FAILED = """\
srun: error: Task launch for StepId=209.1 failed on node local-node2: Communication connection failure
srun: error: Application launch failed: Communication connection failure
srun: Job step aborted
srun: error: Node failure on local-node3
"""
# Rank 2 was SIGSTOPped: the watchdogs of ranks 0, 1 and 3 fired, and srun killed the stopped rank last.
SRUN_WATCHDOGS = """\
srun: error: local-node1: task 1: Exited with exit code 75
srun: error: local-node1: task 0: Exited with exit code 75
srun: error: local-node2: task 3: Exited with exit code 75
srun: error: local-node2: task 2: Killed
"""


def test_the_nodes_srun_could_not_reach_are_read_from_its_words():
    assert srun_lost_nodes(SRUN_LAUNCH_FAILED) == ["local-node2", "local-node3"]
    assert srun_lost_nodes(SRUN_NODE_DIED) == []


def test_a_lost_node_is_the_cause_whatever_its_ranks_and_peers_reported():
    events = [failed(0, PEER, step=52), failed(1, PEER, step=52)]
    cause = attribute(events, srun_task_ends(SRUN_NODE_DIED), [pulse(0, 52), pulse(2, 41, node="local-node2")],
                      lost=["local-node2"])
    assert cause == Cause("LOST", "node local-node2 lost at step 52: Slurm could not reach it", Fault.NODE_LOST,
                          node="local-node2",
                          step=52, short="local-node2 lost", nodes=("local-node2",))
    assert attribute([], [], [], lost=["n2", "n3"]).text == "node n2, n3 lost during start-up: Slurm could not reach it"


# A retry's rank 1 SIGKILLed while rank 0 still imported torch: srun ended the step, rank 0's SIGTERM was passed over
# (submitit's handler, before the task's), and srun SIGKILLed it after KillWait.
SRUN_ONE_KILLED_EARLY = """\
srun: error: local-node1: task 1: Killed
srun: launch/slurm: _step_signal: Terminating StepId=17.0
slurmstepd-local-node1: error: *** STEP 17.0 ON local-node1 CANCELLED AT 2026-12-05T06:23:34 ***
srun: error: local-node1: task 0: Killed
srun: Force Terminated StepId=17.0
"""


def test_a_rank_srun_killed_while_ending_the_step_is_not_blamed_with_the_one_killed_first():
    cause = attribute([], srun_task_ends(SRUN_ONE_KILLED_EARLY), [])
    assert (cause.text, cause.rank) == ("rank 1 on local-node1: killed by a signal (SIGKILL)", 1)


def test_every_rank_killed_together_is_named():
    ends = [TaskEnd("n1", [1], "Killed"), TaskEnd("n2", [3], "Killed"), TaskEnd("n1", [0], "Terminated")]
    cause = attribute([], ends, [pulse(1, 20), pulse(3, 21, node="n2")])
    assert cause.text == "2 ranks killed by a signal (SIGKILL): rank 1 on n1 at step 20; rank 3 on n2 at step 21"
    assert (cause.short, cause.nodes, cause.rank) == ("ranks 1,3 killed", ("n1", "n2"), 1)


def test_a_stall_left_unrecorded_blames_the_rank_that_stopped_first_not_the_watchdogs():
    pulses = [pulse(0, 90, alive=200.0), pulse(1, 90, alive=199.0), pulse(2, 90, alive=160.0, node="local-node2"),
              pulse(3, 90, alive=200.5, node="local-node2")]
    cause = attribute([], srun_task_ends(SRUN_WATCHDOGS), pulses, exit_code=EXIT_STALLED)
    assert (cause.outcome, cause.rank, cause.node, cause.short) == ("STALLED", 2, "local-node2", "rank 2 hung")
    assert cause.text == ("stalled: rank 2 on local-node2 stopped first, at step 90 (the watchdog of rank 0, 1, 3 "
                          "ended the attempt)")


def ended(outcome, short="", step=None, trained=True, nodes=(), fault=None, rank=None, **more):
    return decode({"event": "attempt_ended", "outcome": outcome, "short": short, "step": step, "trained": trained,
                   "nodes": list(nodes), "node": nodes[0] if nodes else None, "fault": fault, "rank": rank, **more})


def retrying(**fields):
    return decode({"event": "retrying", **fields})


def test_a_lost_node_costs_no_retry_the_first_time_and_is_excluded():
    lost = Cause("LOST", "node n2 lost", Fault.NODE_LOST, node="n2", step=52, short="n2 lost", nodes=("n2",))
    spent = [ended("FAILED", "rank 1 killed", 10), retrying(exclude=[])]
    decision = decide(spent, lost, max_retries=1)
    assert (decision.retry, decision.exclude, decision.free) == (True, ["n2"], True)
    # The same node lost again (it came back, then died again) is a counted retry: here none is left.
    again = [*spent, ended("LOST", "n2 lost", 52, nodes=("n2",)), retrying(exclude=["n2"], free=True)]
    assert decide(again, lost, max_retries=1).reason == "all cluster.max_retries=1 retries spent"
    first = decide([], Cause("LOST", "node n2 lost during start-up", Fault.NODE_LOST, node="n2", nodes=("n2",)), 0,
                   progressed=False)
    assert first.retry and first.free  # before any step: still the node's fault, not the code's


def test_a_fault_during_start_up_is_retried_and_the_same_failure_twice_needs_two_attempts_that_trained():
    killed = Cause("FAILED", "rank 0 killed", Fault.KILLED, rank=0, node="n1", step=91, short="rank 0 killed")
    history = [ended("FAILED", "rank 0 killed", 91, fault="killed", rank=0), retrying(exclude=[])]
    during = decide(history, killed, max_retries=3, trained=False)
    assert during.retry and during.reason == "retry 2 of 3 from the newest good checkpoint"
    assert decide(history, killed, max_retries=3, trained=True).reason == \
        "the same failure at step 91 twice, not retried again"
    untrained = [ended("FAILED", "rank 0 killed", 91, trained=False, fault="killed", rank=0), retrying(exclude=[])]
    assert decide(untrained, killed, max_retries=3).retry


def test_a_full_disk_is_retried_once_and_only_when_there_is_room_again():
    """A full disk is the file system's fault: no node is left out for it, the first one is retried only when the
    run directory has room for a checkpoint again, and a second (since the user last resumed) ends the run."""
    full = Cause("FAILED", "rank 0 at step 120: CheckpointSaveError: ... No space left on device", Fault.DISK_FULL,
                 rank=0, step=120, short="disk full")
    history = [ended("FAILED", "rank 1 killed", 10, nodes=("n2",)), retrying(exclude=["n2"])]
    retried = decide(history, full, max_retries=3, held=["n3"], room=True)
    assert (retried.retry, retried.exclude, retried.free) == (True, ["n2", "n3"], False)  # earlier exclusions only
    assert decide(history, full, max_retries=3, room=False) == Decision(
        False, "the disk is still full: not retried; free space there, then launcher resume the run")
    before_first_step = decide([], full, max_retries=3, progressed=False, trained=False, room=True)
    assert before_first_step.retry  # launched into a full disk, then freed: not the code's fault
    again = [*history, ended("FAILED", "disk full", 120, fault="disk full"), retrying(exclude=["n2"])]
    assert decide(again, full, max_retries=3, room=True).reason == (
        "the disk was full again after its retry: not retried again; free space there, then launcher resume the run")
    resumed = [*again, ended("FAILED", "disk full", 120, fault="disk full"), decode({"event": "resubmitted"})]
    assert decide(resumed, full, max_retries=5, room=True).retry  # the user freed space and resumed: one more


def test_an_attempt_trained_only_when_a_rank_got_past_the_step_it_started_from():
    resumed = [decode({"event": "resumed", "step": 90})]
    assert not trained(resumed, [pulse(0, 90)]) and trained(resumed, [pulse(0, 91)])
    assert not trained([], []) and trained([failed(0, PEER, step=3)], [])


def test_exclusions_that_would_leave_too_few_nodes_are_allowed_again_least_certain_first():
    events = [ended("STALLED", "rank 2 hung", 10, nodes=("n2",)), ended("LOST", "n3 lost", 20, nodes=("n3",))]
    wanted = Decision(True, "retry 2 of 3", ["n2", "n3"])
    kept = schedulable(wanted, events, held=[], partition=["n1", "n2", "n3"], needed=2)
    assert (kept.exclude, kept.allowed) == (["n3"], ["n2"])  # the hung rank's node, not the lost one
    assert "would leave 1 of the 2 nodes the run needs, so n2 is allowed again" in kept.reason
    assert schedulable(wanted, events, [], ["n1", "n2", "n3", "n4"], 2) == wanted  # room enough: unchanged
    both = schedulable(wanted, events, [], ["n1", "n2", "n3"], 3)
    assert (both.exclude, both.allowed) == ([], ["n2", "n3"])  # Slurm then waits for the nodes it holds down


def test_damaged_data_is_not_retried_whatever_its_path_says():
    from launcher.core.dataset import DatasetError

    message = "shard /data/rebecca/nccl-peer/tokens_00001.bin has 10,000 bytes, not the 20,000"
    error, fault = f"DatasetError: {message}", classify(DatasetError(message))
    cause = attribute([failed(0, error, step=9, fault=fault), failed(1, error, step=9, fault=fault)], [], [pulse(0, 9)])
    assert (cause.rank, cause.error, cause.fault) == (0, error, Fault.DATA)  # the rank's own error, not a lost peer
    decision = decide([], cause, max_retries=3)
    assert (decision.retry, decision.reason) == (
        False, "the data is damaged: every node and try would read it alike, not retried")
    assert classify(RuntimeError("NCCL error in: x.cpp")) == Fault.INFRASTRUCTURE


def test_a_lost_node_slurm_still_reads_idle_is_allowed_again_only_after_slurm_can_mark_it_down():
    """On a cluster with no node to spare, the retry needs the lost node back; placed at once, it would land on
    the dead node Slurm still reads idle. It begins after SlurmdTimeout instead, and then waits for nodes."""
    events = [ended("LOST", "n2 lost", 20, nodes=("n2",))]
    waited = schedulable(Decision(True, "n2 was lost", ["n2"], free=True), events, held=[], partition=["n1", "n2"],
                         needed=2, settle_s=60)
    assert (waited.exclude, waited.allowed, waited.begin_s, waited.free) == ([], ["n2"], 65, True)
    assert waited.reason.endswith("; it begins in 65 s, once Slurm has marked n2 down (SlurmdTimeout)")
    marked = schedulable(Decision(True, "n2 was lost", ["n2"]), events, ["n2"], ["n1", "n2"], 2, settle_s=60)
    assert (marked.allowed, marked.begin_s) == (["n2"], 0)  # already down: Slurm waits for it by itself



@pytest.mark.parametrize("state, exit_code, words, status", [
    ("FAILED", "0:9", "killed by SIGKILL", 137),
    ("FAILED", "3:0", "exit status 3", 3),
    ("OUT_OF_MEMORY", "0:125", "out of memory", 253),
    ("CANCELLED by 1000", "0:0", "cancelled", 0),
    ("", "", "how, Slurm's accounting does not say", 1),
])
def test_a_dead_batch_step_is_told_in_words_from_saccts_state_and_exit_code(state, exit_code, words, status):
    assert (batch_end(state, exit_code), exit_status(exit_code)) == (words, status)


def test_a_store_that_did_not_answer_is_retried_even_before_the_first_step_and_blames_no_node():
    """An object store's outage (launcher/core/store.py, StoreError: Fault.STORE) is no sign of a bad run or node;
    a changed object (the data's fault) is never retried."""
    store = Cause("FAILED", "store unreachable: rank 1 ...", Fault.STORE, rank=1, node="n2", short="store unreachable")
    first = decide([], store, max_retries=3, progressed=False)
    assert (first.retry, first.exclude, first.free) == (True, [], False)
    changed = Cause("FAILED", "bad data: shard s3://b/ds/tokens_00003.bin has changed", Fault.DATA, rank=1, node="n2")
    assert not decide([], changed, max_retries=3, progressed=True).retry
