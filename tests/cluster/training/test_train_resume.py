"""Resume is exact, and a crash in the middle of a checkpoint save costs nothing but time.

One uninterrupted run of 6 steps (``python -m launcher.train``, 2 ranks) is the reference.
A second run of the same config dies while saving step 6, after its shards are
partly written; a third resumes. The resumed run must start from step 3 (the
half-written step 6 ignored), log ``resumed at step 3``, record the event, and
reproduce the reference's losses exactly.
"""

import pytest
import torch.multiprocessing as mp

from support import train_workers
from launcher.core.checkpoints import latest_checkpoint
from support.helpers import losses
from support.helpers import events as read_events
from support.train_harness import launch_forked, make_run_dir, metrics

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm

STEPS, EVERY = 6, 3  # the reference run (tests/cluster/training/conftest.py)


def test_uninterrupted_run_records_everything(reference_run):
    records = metrics(reference_run)
    assert [r["step"] for r in records if not r.get("final")] == list(range(1, STEPS + 1))
    final = records[-1]
    assert final["final"] and final["step"] == STEPS and final["steps_run"] == STEPS
    assert final["loss"] < records[0]["loss"]
    assert len({r["batch_crc"] for r in records[:-1]}) == STEPS  # each step's global batch its own
    assert [r["eval_loss"] is not None for r in records[:-1]] == [s % EVERY == 0 for s in range(1, STEPS + 1)]
    events = [e["event"] for e in read_events(reference_run)]
    assert events == ["preflight", "started", "ready", "finished"]
    assert sorted(p.name for p in (reference_run / "checkpoints").iterdir()) == ["step_00000003", "step_00000006"]
    assert "allreduce 3 ok" in (reference_run / "logs" / "rank_1.log").read_text()


def test_crash_during_save_then_resume_matches_uninterrupted(tmp_path, reference_config, reference_run):
    run_dir = make_run_dir(tmp_path / "run", reference_config, world_size=2, micro_batch=2)
    with pytest.raises(mp.ProcessExitedException, match="exit code 9"):
        launch_forked(train_workers.train_run_killed_in_save, (run_dir, STEPS), world_size=2)
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "step_00000006.tmp").is_dir() and not (ckpts / "step_00000006").exists()
    assert latest_checkpoint(run_dir) == ckpts / "step_00000003"
    assert losses(run_dir) == losses(reference_run)  # identical up to the crash

    launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    assert "resumed at step 3" in (run_dir / "logs" / "rank_0.log").read_text()
    events = read_events(run_dir)
    assert [e["event"] for e in events] == ["preflight", "started", "ready", "preflight", "started", "resumed",
                                            "ready", "finished"]
    assert events[5]["step"] == 3 and events[6]["load_s"] > 0 and events[2]["load_s"] == 0  # resumed, from scratch
    assert set(events[4]["bring_up"]) == {"imports", "rendezvous", "preflight", "data"}
    resumed = [r for r in metrics(run_dir) if r.get("final")][-1]
    assert resumed["resumed_from"] == 3 and resumed["steps_run"] == 3
    # Exactly the uninterrupted losses (float equality, not approx), eval included.
    assert losses(run_dir) == losses(reference_run)
    eval_losses = lambda d: [r["eval_loss"] for r in metrics(d) if r.get("eval_loss") is not None and not r.get("final")]
    assert eval_losses(run_dir)[-1] == eval_losses(reference_run)[-1]
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000003", "step_00000006"]
    assert batches(run_dir) == batches(reference_run)


def test_a_resume_on_another_number_of_ranks_reads_the_same_global_batches(tmp_path, reference_config,
                                                                            reference_run):
    """Trained on 2 ranks to its checkpoint of step 3 (killed saving step 6), then resumed on 4 (the checkpoint
    resharded): every step reads the global batch the 2-rank run read (``batch_crc``), and the losses agree to the
    sharding tests' tolerance (a sum over other ranks rounds otherwise)."""
    run_dir = make_run_dir(tmp_path / "run", reference_config, world_size=2, micro_batch=2)
    with pytest.raises(mp.ProcessExitedException, match="exit code 9"):
        launch_forked(train_workers.train_run_killed_in_save, (run_dir, STEPS), world_size=2)
    make_run_dir(run_dir, reference_config, world_size=4, micro_batch=1)  # the plan resume gpus=4 writes
    launch_forked(train_workers.train_run, (run_dir,), world_size=4)
    assert "resumed at step 3" in (run_dir / "logs" / "rank_0.log").read_text()
    assert batches(run_dir) == batches(reference_run)
    for step, loss in losses(reference_run).items():
        assert losses(run_dir)[step] == pytest.approx(loss, rel=1e-5), f"loss at step {step}"


def batches(run_dir):
    """Each logged step's global batch (``batch_crc``), the newest record of a step logged twice."""
    return {r["step"]: r["batch_crc"] for r in metrics(run_dir) if not r.get("final")}
