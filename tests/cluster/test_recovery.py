"""The fault loop on the real cluster: a rank SIGKILLed mid-run ends its attempt within seconds, is named with
its node and signal (not the peers that lost it), and the run recovers from its checkpoint on its own and
ends with exactly the losses of a run that was never interrupted."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

from support.helpers import (STEADY_RUN, STEADY_STEPS, TASKS_WITHOUT_SLURM, batch_shell_pid, events, job_id_of, launch,
                             losses, paced, rank_pids, runs_json, wait_for)

from launcher.core.checkpoints import complete_checkpoints, latest_checkpoint, step_of

# A run that a test interrupts is paced (losses unchanged): it is still training when the fault comes, however fast
# the machine, and waits rather than spends the CPU the other tests share.
FAULTED = paced(0.05)


def rank_pid(run_dir: Path, job_id: str, rank: int) -> int:
    pids = rank_pids(run_dir, job_id)
    assert rank in pids, f"no process for rank {rank} of job {job_id}"
    return pids[rank]


def test_a_killed_rank_is_named_and_the_run_recovers_exactly(slurm, steady, tmp_path):
    job = launch(slurm, tmp_path, "name=victim", defaults=STEADY_RUN, env=FAULTED)
    run_dir = tmp_path / "victim"
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    killed_at = time.time()
    os.kill(rank_pid(run_dir, job, 1), signal.SIGKILL)

    ended = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"], 60, "attempt end")[0]
    detected = ended["time"] - killed_at  # printed below; the wait above bounds it
    assert (ended["outcome"], ended["rank"], ended["short"]) == ("FAILED", 1, "rank 1 killed"), ended
    assert ended["node"] in slurm.nodes and "killed by a signal (SIGKILL)" in ended["cause"]
    logged = max(row["step"] for row in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
                 if row["time"] < ended["time"])
    assert ended["step"] >= logged and f"at step {ended['step']}:" in ended["cause"]  # never a lagging heartbeat's
    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 30, "retry")[0]
    assert retry["previous_job_id"] == job and retry["job_id"] != job
    assert retry["exclude"] == []  # a killed rank (the OOM killer, say) does not make its node suspect

    slurm.completes(retry["job_id"], run_dir, timeout=400)
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("attempt") == 2 and "resumed" in kinds and kinds[-1] == "attempt_ended"
    interrupted = losses(run_dir)
    assert max(interrupted) == STEADY_STEPS and interrupted == steady()  # a later record of a step wins
    listed = json.loads(slurm.launcher("runs", "--json", root=tmp_path).stdout)
    assert {r["name"]: r["status"] for r in listed}["victim"] == "COMPLETED"
    described = slurm.launcher("describe", "victim", root=tmp_path).stdout
    assert "rank 1 on " in described and "SIGKILL" in described
    print(f"detected in {detected:.1f} s; recovered at {retry['time'] - killed_at:.1f} s; "
          f"completed {time.time() - killed_at:.0f} s after the kill")


def test_a_second_fault_during_recovery_is_retried_and_the_run_still_recovers_exactly(slurm, steady, tmp_path):
    """The retry's rank killed before it trained a step: judged by its own attempt's evidence (not the heartbeats
    the first attempt left), "failed during start-up", and retried while retries last."""
    job = launch(slurm, tmp_path, "name=twice", defaults=STEADY_RUN, env=FAULTED)
    run_dir = tmp_path / "twice"
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    os.kill(rank_pid(run_dir, job, 1), signal.SIGKILL)
    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 60, "retry")[0]
    pids = wait_for(lambda: len(rank_pids(run_dir, retry["job_id"])) == 2 and rank_pids(run_dir, retry["job_id"]), 180, "retry's ranks")
    os.kill(pids[1], signal.SIGKILL)

    second = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"][1:], 90, "2nd end")[0]
    assert second["trained"] is False and second["cause"].startswith("failed during start-up: rank 1 "), second
    again = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"][1:], 60, "second retry")[0]
    assert again["previous_job_id"] == retry["job_id"] and again["reason"].startswith("retry 2 of 3")
    slurm.completes(again["job_id"], run_dir, timeout=400)
    assert losses(run_dir) == steady()


def test_a_hang_on_a_cluster_too_small_to_leave_its_node_out_is_retried_on_it(own_cluster, tmp_path):
    """Excluding the hung rank's node would leave one node for a two-node run, which sbatch refuses: the retry
    allows it again (a hung process is the least certain blame) and says so."""
    job = launch(own_cluster, tmp_path, "name=small", "layout.nodes=2", "train.stall_timeout_s=20",
                 "train.checkpoint_every=50", defaults=STEADY_RUN, env=paced(0.1))
    run_dir = tmp_path / "small"
    # Stopped between saves, after the step logged past the first checkpoint: rank 1 on a node of its own has no
    # neighbour to see it stopped, and a peer frozen while the other saves (its rename's barrier) gets a save's
    # allowance (SLOW_PHASE_S), not the stall limit. The next save is 40 steps of at least 0.1 s away.
    wait_for(lambda: (run_dir / "metrics.jsonl").exists() and max(losses(run_dir), default=0) > 50, 180, "step 60")
    os.kill(rank_pid(run_dir, job, 1), signal.SIGSTOP)

    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 120, "retry")[0]
    ended = next(e for e in events(run_dir) if e["event"] == "attempt_ended")
    assert (ended["outcome"], ended["rank"]) == ("STALLED", 1), ended
    assert (retry["exclude"], retry["allowed"]) == ([], [ended["node"]]), retry
    assert f"would leave 1 of the 2 nodes the run needs, so {ended['node']} is allowed again" in retry["reason"]
    own_cluster.completes(retry["job_id"], run_dir, timeout=400)
    described = own_cluster.launcher("describe", "small", root=tmp_path).stdout
    assert f"allowed again: {ended['node']}" in described, described


def newest_step(run_dir):
    newest = latest_checkpoint(run_dir)
    return step_of(newest) if newest else 0


def test_a_damaged_checkpoint_is_set_aside_and_the_requeued_job_resumes_from_the_one_before(slurm, steady, tmp_path):
    """Twice: the job requeued by hand and the newest checkpoint damaged before it starts again (a shard
    truncated; then values overwritten inside a shard, its size unchanged). Each resume names the damage and uses the checkpoint
    before it, and the run ends with the uninterrupted run's losses."""
    job = launch(slurm, tmp_path, "name=spoiled", "train.keep_checkpoints=3", defaults=STEADY_RUN, env=FAULTED)
    run_dir = tmp_path / "spoiled"

    def truncate(shard):
        os.truncate(shard, shard.stat().st_size // 2)

    def overwrite(shard):
        with open(shard, "r+b") as f:  # 1e30 as float32
            f.seek(shard.stat().st_size // 2)
            f.write(bytes.fromhex("cbd94a71") * 4)

    resumed = {"step": 0}
    for round_no, (damage, words) in enumerate([(truncate, "has"), (overwrite, "wrong checksum")], start=1):
        since = resumed["step"]  # two checkpoints after the last resume: the newest and the one to fall back to
        wait_for(lambda: newest_step(run_dir) >= since + 40, 240, f"checkpoints, round {round_no}")
        slurm.run("scontrol", "requeuehold", job)  # requeued, and held until the damage is done
        wait_for(lambda: not rank_pids(run_dir, job), 60, "the ranks gone")
        *kept, spoiled = complete_checkpoints(run_dir)
        damage(spoiled / "__1_0.distcp")
        slurm.run("scontrol", "release", job)
        released = time.time()
        resumed = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "resumed"][round_no - 1:], 180,
                           f"resume {round_no}")[0]
        damaged = [e for e in events(run_dir) if e["event"] == "checkpoint_damaged"]
        assert len(damaged) == round_no and damaged[-1]["step"] == step_of(spoiled), damaged
        assert "__1_0.distcp" in damaged[-1]["damage"] and words in damaged[-1]["damage"], damaged[-1]
        # The one before: no more than one interval lost (the newest may be the final one, off the interval, when
        # the run reached its last step before the requeue came).
        assert resumed["step"] == step_of(kept[-1]) >= step_of(spoiled) - 20
        print(f"{damaged[-1]['damage']}: resumed from step {resumed['step']} {resumed['time'] - released:.0f} s "
              "after the job was released")
    slurm.completes(job, run_dir, timeout=400)
    assert losses(run_dir) == steady()
    ended = [e for e in events(run_dir) if e["event"] == "attempt_ended"]
    assert [e["outcome"] for e in ended] == ["REQUEUED", "REQUEUED", "COMPLETED"], ended
    assert "scontrol requeue" in ended[0]["cause"]


def test_a_hung_rank_is_named_with_its_stack_and_the_run_recovers_elsewhere(slurm, tmp_path):
    job = launch(slurm, tmp_path, "name=hung", "layout.nodes=1", "train.stall_timeout_s=30", defaults=STEADY_RUN,
                 env=FAULTED)
    run_dir = tmp_path / "hung"
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    stopped_at = time.time()
    pid = rank_pid(run_dir, job, 1)
    os.kill(pid, signal.SIGSTOP)

    stall = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "stalled"], 90, "stall")[0]
    assert stall["ranks"] == [1], stall
    assert f"process {pid} state T (stopped)" in stall["cause"]
    assert "Python stacks follow" in (run_dir / "logs" / "rank_0.log").read_text()
    ended = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"], 60, "attempt end")[0]
    assert (ended["outcome"], ended["rank"]) == ("STALLED", 1)
    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 30, "retry")[0]
    assert retry["exclude"] == [stall["nodes"][0]]  # the hung rank's node is avoided
    slurm.completes(retry["job_id"], run_dir, timeout=400)
    attempts = [e for e in events(run_dir) if e["event"] == "attempt"]
    assert stall["nodes"][0] not in attempts[-1]["nodes"]
    print(f"stall recorded {stall['time'] - stopped_at:.0f} s after SIGSTOP; retry at {retry['time'] - stopped_at:.0f} s")


def test_an_error_of_the_code_own_ends_the_run_after_one_attempt(slurm, tmp_path):
    res = slurm.launcher("model=gpt_tiny", "gpus=2", "train.steps=50", "name=buggy", root=tmp_path,
                         env={"LAUNCHER_FAULT": "raise@5"})
    assert res.returncode == 0, res.stderr
    job = job_id_of(res.stdout)
    assert slurm.wait(job, timeout=120) == "FAILED"
    run_dir = tmp_path / "buggy"
    final = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "failed" and e.get("final")], 30, "verdict")[0]
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("attempt") == 1 and "retrying" not in kinds
    assert final["step"] == 5 and final["short"] == "InjectedFault" and "not retried" in final["reason"]
    assert "at step 5: InjectedFault: fault injected" in final["error"]
    listed = {r["name"]: r for r in json.loads(slurm.launcher("runs", "--json", root=tmp_path).stdout)}
    assert (listed["buggy"]["status"], listed["buggy"]["reason"]) == ("FAILED", "InjectedFault")


def test_a_batch_shell_killed_mid_run_is_judged_by_its_watcher_and_the_run_recovers_exactly(slurm, steady, tmp_path):
    """The job's batch shell SIGKILLed (as its host's OOM killer would): no end step runs, but the watcher job
    submitted beside it (afternotok) records the attempt's cause and retries it, with no command from the user."""
    job = launch(slurm, tmp_path, "name=orphan", defaults=STEADY_RUN, env=FAULTED)
    run_dir = tmp_path / "orphan"
    watching = [e for e in events(run_dir) if e["event"] == "watching"]
    assert [(e["job_id"], e["refused"]) for e in watching] == [(job, None)] and watching[0]["watcher"], watching
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    os.kill(batch_shell_pid(run_dir, job), signal.SIGKILL)
    seen = []  # what `runs --json` says from the kill until its retry is submitted: never a final state (FAILED)

    def retried():
        seen.append(runs_json(slurm, tmp_path)["orphan"]["status"])
        kinds = {(e["event"], e.get("job_id") == job) for e in events(run_dir)}
        return ("retrying", False) in kinds and "RECOVERING" in seen or ("attempt", False) in kinds
    wait_for(retried, 180, "the retry, seen by `runs`", interval=1, patient=True)
    assert set(seen) <= {"RUNNING", "RECOVERING"} and "RECOVERING" in seen, seen

    ended = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"], 120, "attempt end")[0]
    assert (ended["job_id"], ended["outcome"], ended["fault"], ended["short"]) == (
        job, "FAILED", "batch step died", "batch step died"), ended
    assert ended["cause"].startswith("the job's batch step died: killed by SIGKILL on ") and ended["node"], ended
    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 60, "retry")[0]
    assert retry["previous_job_id"] == job and "retry 1 of" in retry["reason"]
    slurm.completes(retry["job_id"], run_dir, timeout=400)
    assert losses(run_dir) == steady()
    described = slurm.launcher("describe", "orphan", root=tmp_path)
    assert "the job's batch step died: killed by SIGKILL" in described.stdout, described.stdout
    assert "requeued from outside" not in described.stdout


def test_a_node_failing_preflight_is_left_out_and_the_run_completes_on_another(own_cluster, tmp_path):
    sick = own_cluster.nodes[0]  # Slurm places a one-node job on the first node that is free
    wait_for(lambda: not own_cluster.run("squeue", "-h", "-w", sick).stdout.strip(), 120, f"{sick} free")
    res = own_cluster.launcher("model=gpt_tiny", "gpus=2", "layout.nodes=1", "train.steps=30", "name=sick", root=tmp_path,
                         env={"LAUNCHER_FAULT": f"preflight:{sick}"})
    assert res.returncode == 0, res.stderr
    run_dir = tmp_path / "sick"
    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 120, "retry")[0]
    failed = [e for e in events(run_dir) if e["event"] == "preflight_failed"]
    assert failed and {e["node"] for e in failed} == {sick}
    assert "metrics.jsonl" not in {p.name for p in run_dir.iterdir()}  # caught before training
    assert retry["exclude"] == [sick] and retry["free"] is True
    own_cluster.completes(retry["job_id"], run_dir, timeout=300)
    attempts = [e for e in events(run_dir) if e["event"] == "attempt"]
    assert [a["nodes"] for a in attempts] == [sick, own_cluster.nodes[1]]
    report = next(e for e in events(run_dir) if e["event"] == "preflight")
    assert report["ranks"] == 2 and report["median_gbps"] > 0 and {r["rank"] for r in report["slowest"]} == {0, 1}
    table = json.loads((run_dir / report["table"]).read_text())  # every rank's figure, beside the summary
    assert [r["rank"] for r in table["ranks"]] == [0, 1] and table["median_gbps"] == report["median_gbps"]


def test_a_failed_run_resumes_from_its_checkpoint_and_completes(slurm, tmp_path):
    res = slurm.launcher("model=gpt_tiny", "gpus=2", "train.steps=40", "train.checkpoint_every=10",
                         "train.log_every=5", "name=again", root=tmp_path, env={"LAUNCHER_FAULT": "raise@25"})
    job = job_id_of(res.stdout)
    assert slurm.wait(job, timeout=120) == "FAILED"
    run_dir = tmp_path / "again"
    wait_for(lambda: [e for e in events(run_dir) if e["event"] == "failed" and e.get("final")], 30, "verdict")

    resumed = slurm.launcher("resume", "again", root=tmp_path)  # without the fault this time
    assert resumed.returncode == 0, resumed.stderr
    assert "from its checkpoint of step 20; it was FAILED" in resumed.stdout
    new_job = job_id_of(resumed.stdout)
    assert new_job != job
    status = lambda: {r["name"]: r["status"] for r in json.loads(slurm.launcher("runs", "--json", root=tmp_path).stdout)}
    assert wait_for(lambda: status()["again"] in ("PENDING", "RUNNING") and status()["again"], 60, "active")
    slurm.completes(new_job, run_dir, timeout=300)
    assert status()["again"] == "COMPLETED"
    assert [e["step"] for e in events(run_dir) if e["event"] == "resumed"] == [20]
    assert max(losses(run_dir)) == 40
    again = slurm.launcher("resume", "again", root=tmp_path)
    assert again.returncode == 2 and "already trained all 40 steps" in again.stderr


def test_every_signal_costs_no_step_and_the_losses_stay_exact(slurm, steady, tmp_path):
    """Four time-limit/preemption signals (USR2, as Slurm sends them): every rank saves the step just done
    and the job requeues, so no step is ever trained twice and none is lost, with no periodic checkpoint, and the
    losses are the steady run's. The tasks cannot reach Slurm (as in a container without its client): the batch
    shell on the host requeues. Before them a SIGTERM to one rank from outside Slurm (a user's kill): the rank
    records it and trains on. A warning of 8 s has the ranks agree on the signal every 2 s of steps
    (launcher/train/interrupt.py), so that each signal is acted on well before the last step, which would end the
    run instead of requeuing it; steps paced to 0.1 s leave each signal 20 steps at most."""
    job = launch(slurm, tmp_path, "name=cut", "train.log_every=1", "train.checkpoint_every=0",
                 "cluster.signal_delay_s=8", TASKS_WITHOUT_SLURM, defaults=STEADY_RUN, env=paced(0.1))
    run_dir = tmp_path / "cut"
    metrics_lines = lambda: (run_dir / "metrics.jsonl").read_text().count("\n") if (run_dir / "metrics.jsonl").exists() else 0  # noqa: E731
    wait_for(lambda: metrics_lines() > 5, 180, "progress before the SIGTERM")
    terminated = rank_pid(run_dir, job, 1)
    os.kill(terminated, signal.SIGTERM)
    wait_for(lambda: [e for e in events(run_dir) if e["event"] == "signalled"], 60, "the SIGTERM's record")
    for signal_no in range(4):
        seen = metrics_lines()
        wait_for(lambda: metrics_lines() > seen + 5, 180, f"progress before signal {signal_no + 1}")
        slurm.run("scancel", "--signal=USR2", job)
        wait_for(lambda: sum(e["event"] == "resumed" for e in events(run_dir)) == signal_no + 1, 180,
                 f"resume after signal {signal_no + 1}")
    slurm.completes(job, run_dir, timeout=300)
    kinds = [e["event"] for e in events(run_dir)]
    requeued = [e["step"] for e in events(run_dir) if e["event"] == "requeued"]
    resumed = [e["step"] for e in events(run_dir) if e["event"] == "resumed"]
    assert len(requeued) == 4 and requeued == resumed, (requeued, resumed)  # resumed exactly where it stopped
    assert kinds.count("attempt") == 5 and "retrying" not in kinds and not any(
        e["event"] == "failed" for e in events(run_dir))
    trained = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
               if not json.loads(line).get("final")]
    assert sorted(trained) == list(range(1, STEADY_STEPS + 1))  # every step once: none lost, none trained twice
    signalled = [e for e in events(run_dir) if e["event"] == "signalled"]
    assert [(e["job_id"], e["signal"], e["rank"], e["pid"], e["action"]) for e in signalled] == [
        (job, "SIGTERM", 1, terminated, "ignored: training went on (1 of 2 ranks got one)")], signalled
    assert signalled[0]["node"] in slurm.nodes and signalled[0]["step"] > 5
    assert "signalled  job_id=" in slurm.launcher("describe", "cut", root=tmp_path).stdout
    expected = steady()  # logged every 10 steps: the same steps' losses, bit for bit
    assert {step: loss for step, loss in losses(run_dir).items() if step in expected} == expected


def test_a_drained_node_left_out_of_a_retry_is_shown_with_slurms_state_and_reason(own_cluster, tmp_path):
    res = own_cluster.launcher(*STEADY_RUN, "name=drained", root=tmp_path, env=FAULTED)
    job = job_id_of(res.stdout)
    run_dir = tmp_path / "drained"
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    node = [e for e in events(run_dir) if e["event"] == "attempt"][0]["nodes"]
    own_cluster.run("scontrol", "update", f"nodename={node}", "state=drain", "reason=trial")
    os.kill(rank_pid(run_dir, job, 1), signal.SIGKILL)
    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 90, "retry")[0]
    assert retry["exclude"] == [node] and retry["left_out"][node].endswith(": trial"), retry
    assert retry["left_out"][node].split(":")[0] in ("draining", "drained"), retry
    own_cluster.completes(retry["job_id"], run_dir, timeout=400)
    described = own_cluster.launcher("describe", "drained", root=tmp_path).stdout
    assert f"excluding {node} ({retry['left_out'][node]})" in described, described
