"""A preempted job (USR2, as Slurm sends before a time limit or preemption) requeues itself, resumes from
its newest checkpoint, and ends with exactly the losses of a run that was never interrupted."""
from __future__ import annotations

from support.helpers import events, launch, losses, preempt_after_a_checkpoint

# A 200-step 2-GPU run checkpointed every 20 steps.
STEPS = 200
RUN = ("model=gpt_tiny", "gpus=2", f"train.steps={STEPS}", "train.log_every=20", "train.checkpoint_every=20")


def test_preempted_run_resumes_and_matches_an_uninterrupted_one(slurm, tmp_path):
    steady_job = launch(slurm, tmp_path, "name=steady", defaults=RUN)
    job = launch(slurm, tmp_path, "name=preempted", defaults=RUN)
    run_dir = tmp_path / "preempted"
    preempt_after_a_checkpoint(slurm, (run_dir, job))
    kinds = [e["event"] for e in events(run_dir)]
    assert "requeued" in kinds and "resumed" in kinds, kinds
    assert "failed" not in kinds, "ranks that lose their peer during a requeue have not failed"
    resumed = next(e for e in events(run_dir) if e["event"] == "resumed")
    assert 0 < resumed["step"] < STEPS

    slurm.completes(job, run_dir, timeout=300)
    assert slurm.wait(steady_job, timeout=300) == "COMPLETED"
    interrupted, uninterrupted = losses(run_dir), losses(tmp_path / "steady")
    assert max(interrupted) == STEPS and set(uninterrupted) <= set(interrupted)
    assert {s: interrupted[s] for s in uninterrupted} == uninterrupted  # bit-identical, before and after
    described = slurm.launcher("describe", "preempted", root=tmp_path).stdout
    assert "requeued" in described and f"step={resumed['step']}" in described
