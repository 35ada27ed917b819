"""A preempted job (USR2, as Slurm sends before a time limit or preemption) requeues itself, resumes from
its newest checkpoint, and ends with exactly the losses of a run that was never interrupted (the steady run)."""
from __future__ import annotations

from support.helpers import STEADY_RUN, STEADY_STEPS, events, launch, losses, preempt_after_a_checkpoint


def test_preempted_run_resumes_and_matches_an_uninterrupted_one(slurm, steady, tmp_path):
    job = launch(slurm, tmp_path, "name=preempted", defaults=STEADY_RUN)
    run_dir = tmp_path / "preempted"
    preempt_after_a_checkpoint(slurm, (run_dir, job))
    kinds = [e["event"] for e in events(run_dir)]
    assert "requeued" in kinds and "resumed" in kinds, kinds
    assert "failed" not in kinds, "ranks that lose their peer during a requeue have not failed"
    resumed = next(e for e in events(run_dir) if e["event"] == "resumed")
    assert 0 < resumed["step"] < STEADY_STEPS

    slurm.completes(job, run_dir, timeout=300)
    interrupted = losses(run_dir)
    assert max(interrupted) == STEADY_STEPS and interrupted == steady()  # bit-identical, before and after
    described = slurm.launcher("describe", "preempted", root=tmp_path).stdout
    assert "requeued" in described and f"step={resumed['step']}" in described
