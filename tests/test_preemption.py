"""A preempted job (USR2, as Slurm sends before a time limit or preemption) requeues itself, resumes from
its newest checkpoint, and ends with exactly the losses of a run that was never interrupted."""
from __future__ import annotations

import json
import re
import time

from conftest import overridden


def launch(slurm, root, name, *overrides, env=None):
    """Submit a 400-step 2-GPU run checkpointed every 20 steps (``overrides`` added); returns its job id."""
    res = slurm.launcher(*overridden(("model=gpt_tiny", "gpus=2", "train.steps=400", "train.log_every=20",
                                      "train.checkpoint_every=20", f"name={name}"), overrides), root=root, env=env)
    assert res.returncode == 0, res.stderr
    return re.search(r"as Slurm job (\d+)", res.stdout).group(1)


def events(run_dir):
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def losses(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if not r.get("final")}


def preempt_after_a_checkpoint(slurm, *runs):
    """Send Slurm's USR2 to each (run_dir, job_id) once its run has a checkpoint; return when every requeued
    job has resumed."""
    deadline = time.time() + 120
    for run_dir, job in runs:
        while not list((run_dir / "checkpoints").glob("step_????????")) and time.time() < deadline:
            time.sleep(0.2)
        slurm.run("scancel", "--signal=USR2", job)
    deadline = time.time() + 180
    for run_dir, _ in runs:
        while not any(e["event"] == "resumed" for e in events(run_dir)) and time.time() < deadline:
            time.sleep(1)


def test_preempted_run_resumes_and_matches_an_uninterrupted_one(slurm, tmp_path):
    steady_job = launch(slurm, tmp_path, "steady")
    job = launch(slurm, tmp_path, "preempted")
    run_dir = tmp_path / "preempted"
    preempt_after_a_checkpoint(slurm, (run_dir, job))
    kinds = [e["event"] for e in events(run_dir)]
    assert "requeued" in kinds and "resumed" in kinds, kinds
    assert "failed" not in kinds, "ranks that lose their peer during a requeue have not failed"
    resumed = next(e for e in events(run_dir) if e["event"] == "resumed")
    assert 0 < resumed["step"] < 400

    assert slurm.wait(job, timeout=300) == "COMPLETED"
    assert slurm.wait(steady_job, timeout=300) == "COMPLETED"
    interrupted, uninterrupted = losses(run_dir), losses(tmp_path / "steady")
    assert max(interrupted) == 400 and set(uninterrupted) <= set(interrupted)
    assert {s: interrupted[s] for s in uninterrupted} == uninterrupted  # bit-identical, before and after
    described = slurm.launcher("describe", "preempted", root=tmp_path).stdout
    assert "requeued" in described and f"step={resumed['step']}" in described
