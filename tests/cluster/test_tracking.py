"""On the local cluster: a run preempted (USR2) and resumed keeps one tracker curve. TensorBoard's reader sees
every step of metrics.jsonl exactly once with its values; W&B's offline files of both attempts carry the run's
name as their id and log by global step; the W&B key from the secrets store is in no file of the run."""
from __future__ import annotations

import json

import pytest

from support.helpers import events, launch, preempt_after_a_checkpoint
from support.tracker_files import tensorboard_scalars, wandb_attempts

# One worker makes its two preempted runs (a module-scoped fixture) for all the tests here.
pytestmark = pytest.mark.xdist_group("tracking")

RUN = ("model=gpt_tiny", "gpus=2", "train.steps=200", "train.log_every=10", "train.checkpoint_every=20")

KEY = "wandb-test-key-" + "7" * 25


def logged(run_dir):
    """metrics.jsonl's records by step (the newest of a step logged twice), without the final summary."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r for r in map(json.loads, lines) if not r.get("final")}


@pytest.fixture(scope="module")
def preempted(slurm, tmp_path_factory):
    """One tensorboard and one wandb run, each preempted after its first checkpoint, run to the end."""
    root = tmp_path_factory.mktemp("tracked")
    home = {"LAUNCHER_HOME": str(root / "home")}
    made = slurm.launcher("secrets", "create", "env", f"WANDB_API_KEY={KEY}", root=root, env=home)
    assert made.returncode == 0, made.stderr
    jobs = {name: launch(slurm, root, f"name={name}", f"tracking={name}", defaults=RUN, env=home)
            for name in ("tensorboard", "wandb")}
    preempt_after_a_checkpoint(slurm, *((root / name, job) for name, job in jobs.items()))
    for job in jobs.values():
        assert slurm.wait(job, timeout=300) == "COMPLETED"
    return root


def resumed_step(run_dir):
    steps = [e["step"] for e in events(run_dir) if e["event"] == "resumed"]
    assert len(steps) == 1 and 0 < steps[0] < 200, steps
    return steps[0]


def test_tensorboard_shows_every_step_once_across_the_requeue(preempted, slurm):
    run_dir = preempted / "tensorboard"
    resumed_step(run_dir)
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one file per attempt
    curves, records = tensorboard_scalars(run_dir / "tensorboard"), logged(run_dir)
    assert sorted(curves["train/loss"]) == sorted(records) == list(range(10, 201, 10))
    for key, tag in (("loss", "train/loss"), ("lr", "train/lr"), ("grad_norm", "train/grad_norm"),
                     ("tokens_per_s", "perf/tokens_per_s"), ("peak_mem_gb", "system/peak_mem_gb")):
        assert curves[tag] == pytest.approx({s: r[key] for s, r in records.items()}, rel=1e-6), key
    evals = {s: r["eval_loss"] for s, r in records.items() if r["eval_loss"] is not None}
    assert evals and curves["eval/loss"] == pytest.approx(evals, rel=1e-6)
    described = slurm.launcher("describe", "tensorboard", root=preempted).stdout
    assert f"tensorboard --logdir {run_dir / 'tensorboard'}" in described


def test_wandb_attempts_continue_one_run_by_global_step(preempted, slurm):
    run_dir = preempted / "wandb"
    step = resumed_step(run_dir)
    first, second = wandb_attempts(run_dir / "wandb")
    assert first["ids"] == second["ids"] == {"wandb"}  # the run's name
    records = logged(run_dir)
    assert sorted(first["history"]) == [s for s in sorted(records) if s <= step]
    assert sorted(second["history"]) == [s for s in sorted(records) if s > step]
    for history in (first["history"], second["history"]):
        assert {s: h["train/loss"] for s, h in history.items()} == {s: records[s]["loss"] for s in history}
    assert "injected secrets: WANDB_API_KEY" in (run_dir / "logs" / "rank_0.log").read_text() \
        or "injected secrets: WANDB_API_KEY" in "".join(p.read_text() for p in (run_dir / "submitit").glob("*.out"))
    assert not [p for p in run_dir.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    described = slurm.launcher("describe", "wandb", root=preempted).stdout
    assert f"wandb sync --id wandb -p slurm-gpt-launcher {run_dir / 'wandb'}/offline-run-*" in described
