"""A stop, and Slurm's own end of a job, lose no step when there is time: ``launcher stop`` has every rank save the
step it is at before the job ends, and an ``scontrol requeue`` on a cluster with a site's KillWait (30 s) has them
save on Slurm's SIGTERM; either way the run goes on from that step with exactly the losses of the steady run
(launcher/train/interrupt.py, launcher/service/stop.py, launcher/job/endings.py)."""
from __future__ import annotations

import json
import re

import pytest

from support.helpers import (SITE_KILL_WAIT_S, STEADY_RUN, STEADY_STEPS, events, job_id_of, launch, losses, paced,
                             runs_json, wait_for)

from launcher.core.checkpoints import complete_checkpoints, step_of


def rows(run_dir) -> list[int]:
    """The step of every metrics row, in the order written (a step trained twice is there twice)."""
    path = run_dir / "metrics.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    return [row["step"] for row in map(json.loads, lines) if not row.get("final")]


def test_a_stop_and_a_requeue_from_outside_each_save_the_step_the_run_is_at(site_kill_wait, steady, tmp_path):
    """One paced run (its losses unchanged; still training when the stop and the requeue come), every step logged:
    ``launcher stop`` saves at step N and the attempt ends CANCELLED, ``launcher resume`` continues from N; then an
    administrator's ``scontrol requeue`` reaches every rank with Slurm's SIGTERM, they save the step they are at
    within the 30 s before its SIGKILL, and the requeued job starts from it. No step is trained twice. (One run and
    one cluster of its own for both: each costs the suite's CPU two rank starts.)"""
    cluster = site_kill_wait
    launch(cluster, tmp_path, "name=paused", "train.log_every=1", defaults=STEADY_RUN, env=paced(0.05))
    run_dir = tmp_path / "paused"
    wait_for(lambda: rows(run_dir), 180, "training", patient=True)

    stopped = cluster.launcher("stop", "paused", root=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    said = re.search(r"^Stopped paused \(job (\d+)\) at step (\d+): every rank saved it; 'launcher resume paused' "
                     r"continues from there\.$", stopped.stdout, re.M)
    assert said, stopped.stdout
    stop_at = int(said.group(2))
    assert 0 < stop_at < STEADY_STEPS and stop_at in map(step_of, complete_checkpoints(run_dir))
    asked = next(e for e in events(run_dir) if e["event"] == "stop_asked")
    ranks = next(e for e in events(run_dir) if e["event"] == "stopped")
    assert asked["by"] and (ranks["job_id"], ranks["step"], ranks["by"]) == (said.group(1), stop_at, asked["by"])
    ended = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"], 60, "the attempt's end")
    assert [(e["outcome"], e["step"]) for e in ended] == [("CANCELLED", stop_at)]
    row = runs_json(cluster, tmp_path)["paused"]
    assert (row["status"], row["reason"]) == ("CANCELLED", f"stopped at step {stop_at}"), row
    described = cluster.launcher("describe", "paused", root=tmp_path).stdout
    assert f"stopped by {asked['by']} (launcher stop) at step {stop_at}: every rank saved it" in described, described

    resumed = wait_for(lambda: (res := cluster.launcher("resume", "paused", root=tmp_path)).returncode == 0 and res,
                       60, "a resume accepted once the job has left the queue", interval=1)
    assert f"from its checkpoint of step {stop_at}; it was CANCELLED" in resumed.stdout, resumed.stdout
    job = job_id_of(resumed.stdout)
    wait_for(lambda: max(rows(run_dir)) > stop_at + 2, 180, "training again", patient=True)
    cluster.run("scontrol", "requeue", job)

    cluster.completes(job, run_dir, timeout=300)
    term = [e for e in events(run_dir) if e["event"] == "terminated"]
    assert [(e["saved"], e["kill_wait_s"], e["reason"]) for e in term] == [(True, SITE_KILL_WAIT_S, None)], term
    requeue_at = term[0]["step"]
    assert stop_at < requeue_at < STEADY_STEPS and term[0]["left_s"] > term[0]["save_s"] > 0
    ended = [e for e in events(run_dir) if e["event"] == "attempt_ended"]
    assert [(e["outcome"], e["step"]) for e in ended] == [
        ("CANCELLED", stop_at), ("REQUEUED", requeue_at), ("COMPLETED", None)], ended
    assert ended[1]["cause"] == (f"requeued from outside the run (scontrol requeue, a preemption, or a node that "
                                 f"came back) at step {requeue_at}: every rank saved it on Slurm's SIGTERM, nothing "
                                 "is trained again")
    assert [e["step"] for e in events(run_dir) if e["event"] == "resumed"] == [stop_at, requeue_at]
    assert sorted(rows(run_dir)) == list(range(1, STEADY_STEPS + 1))  # every step once: none lost or trained twice
    logged = losses(run_dir)
    assert {step: logged[step] for step in steady()} == steady()


def test_a_stopped_run_resumed_on_another_number_of_gpus_reads_the_same_global_batches(slurm, steady, tmp_path):
    """``launcher resume RUN gpus=1`` of a run stopped on 2: composed again with its global batch kept and checked
    as a launch is; its checkpoint, saved by 2 ranks, is resharded onto 1, and every step after it reads the global
    batch the steady run read (``batch_crc``), with the steady run's losses up to the rounding of another sum."""
    launch(slurm, tmp_path, "name=moved", defaults=STEADY_RUN, env=paced(0.05))
    run_dir = tmp_path / "moved"
    wait_for(lambda: rows(run_dir), 180, "training", patient=True)
    stopped = slurm.launcher("stop", "moved", root=tmp_path)
    assert stopped.returncode == 0 and " every rank saved it; " in stopped.stdout, stopped.stdout + stopped.stderr
    stop_at = max(map(step_of, complete_checkpoints(run_dir)))
    resumed = slurm.launcher("resume", "moved", "gpus=1", root=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert re.match(rf"Resumed moved as Slurm job (\d+) on 2 GPUs \(1 x 2\) to 1 GPU \(1 x 1\), from its checkpoint "
                    rf"of step {stop_at}; it was CANCELLED\.$", resumed.stdout), resumed.stdout
    slurm.completes(job_id_of(resumed.stdout), run_dir, timeout=300)
    (event,) = [e for e in events(run_dir) if e["event"] == "resubmitted"]
    assert event["layout"] == "2 GPUs (1 x 2) to 1 GPU (1 x 1)"
    assert [r["gpus"] for r in runs_json(slurm, tmp_path).values()] == [1]
    expected = steady()
    after = {step: crc for step, crc in batches(run_dir).items() if step > stop_at}
    assert after and after == {step: crc for step, crc in batches(steady.run_dir).items() if step in after}
    for step in after:
        assert losses(run_dir)[step] == pytest.approx(expected[step], rel=1e-3), f"loss at step {step}"


def batches(run_dir) -> dict[int, int]:
    """Each logged step's global batch (``batch_crc``), the newest record of a step logged twice."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {row["step"]: row["batch_crc"] for row in map(json.loads, lines) if not row.get("final")}
