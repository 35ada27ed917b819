"""The first step after a resume is checked against the loss and gradient norm its checkpoint recorded: a
checkpoint whose checksums match but whose weights are wrong is set aside, and training starts again, in
the same attempt, from the previous one; a healthy resume passes.

The run is the reference's (tests/cluster/training/conftest.py: 2 ranks, 6 steps) checkpointed every 2 steps and stopped by
an injected error at step 4 (LAUNCHER_FAULT), so it holds checkpoints of steps 2 and 4. Each test resumes a
copy of it, and the losses of every step must equal those of the uninterrupted reference run.
"""
import json
import math
import shutil

import pytest

from support import train_workers
from launcher.train import manifest
from launcher.train.faults import VARIABLE
from launcher.train.resume import first_step_problem
from support.helpers import events, losses
from support.train_harness import launch_forked, make_run_dir, metrics

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
# One worker makes its interrupted run (a module-scoped fixture) for all the tests here.
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("resume_check")]

EVERY, STOPPED_AT = 2, 4



@pytest.fixture(scope="module")
def interrupted_run(tmp_path_factory, reference_config):
    config = {**reference_config, "train": {**reference_config["train"], "checkpoint_every": EVERY,
                                            "keep_checkpoints": 3}}
    run_dir = make_run_dir(tmp_path_factory.mktemp("interrupted") / "run", config, world_size=2, micro_batch=2)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(VARIABLE, f"raise@{STOPPED_AT}")
        with pytest.raises(Exception, match=f"fault injected by {VARIABLE}=raise@{STOPPED_AT}"):
            launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000002", "step_00000004"]
    return run_dir


def resumed_copy(interrupted_run, tmp_path, spoil=None):
    run_dir = tmp_path / "run"
    shutil.copytree(interrupted_run, run_dir)
    if spoil:
        launch_forked(train_workers.spoil_checkpoint, (run_dir, STOPPED_AT, spoil), world_size=2)
    launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    return run_dir


def test_a_healthy_resume_passes_the_check(interrupted_run, reference_run, tmp_path):
    run_dir = resumed_copy(interrupted_run, tmp_path)
    assert [e["event"] for e in events(run_dir)][-4:] == ["started", "resumed", "ready", "finished"]
    assert [e["step"] for e in events(run_dir) if e["event"] == "resumed"] == [STOPPED_AT]
    assert losses(run_dir) == losses(reference_run)


def test_spoiled_weights_with_matching_checksums_fall_back_to_the_previous_checkpoint(interrupted_run,
                                                                                      reference_run, tmp_path):
    run_dir = resumed_copy(interrupted_run, tmp_path, spoil=100.0)
    ckpts = run_dir / "checkpoints"
    recorded = json.loads((ckpts / "step_00000004.damaged" / "meta.json").read_text())
    damaged = [e for e in events(run_dir) if e["event"] == "checkpoint_damaged"]
    assert len(damaged) == 1 and damaged[0]["step"] == STOPPED_AT, damaged
    words = damaged[0]["damage"]
    assert words.startswith("first step after resume: loss ") and words.endswith(
        f" vs {recorded['loss']:.2f} recorded"), words
    first_loss = float(words.split()[5])
    assert first_loss > 2 * recorded["loss"] + 3  # far outside the rule, not near its edge
    assert manifest.damage(ckpts / "step_00000004.damaged", 2) == []  # its checksums matched all along
    # Set aside, then resumed from step 2 in the same attempt: one "started", two "resumed".
    after = [e["event"] for e in events(run_dir)][-6:]
    assert after == ["started", "resumed", "checkpoint_damaged", "resumed", "ready", "finished"]
    assert [e["step"] for e in events(run_dir) if e["event"] == "resumed"] == [STOPPED_AT, EVERY]
    final = metrics(run_dir)[-1]
    assert final["final"] and final["step"] == 6 and final["resumed_from"] == EVERY and final["steps_run"] == 4
    assert losses(run_dir) == losses(reference_run)  # steps 3-6 trained again, exactly as before
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000002", "step_00000004", "step_00000004.damaged",
                                                       "step_00000006"]
    assert manifest.damage(ckpts / "step_00000004", 2) == []  # step 4 saved again, whole


# The worst healthy rises measured (docs/recovery.md): consecutive steps of gpt_tiny at global batch 2 and 4.
@pytest.mark.parametrize("record, loss, norm, problem", [
    ({"loss": 1.60, "grad_norm": 1.0}, 3.30, 1.0, None),
    ({"loss": 2.17, "grad_norm": 0.788}, 3.30, 10.69, None),
    ({"loss": 0.20, "grad_norm": 0.5}, 3.19, 49.9, None),  # a low loss may still rise by 3.0
    ({"loss": 5.0, "grad_norm": 0.5}, 9.9, 0.1, None),  # a high one may double
    ({"loss": 2.60, "grad_norm": 1.0}, 5.61, 1.0, "first step after resume: loss 5.61 vs 2.60 recorded"),
    ({"loss": 2.60, "grad_norm": 1.0}, math.nan, 1.0, "first step after resume: loss nan vs 2.60 recorded"),
    ({"loss": 2.60, "grad_norm": 1.0}, 2.5, 101.0, "first step after resume: gradient norm 101 vs 1 recorded"),
    ({"loss": 2.60, "grad_norm": 0.25}, 2.5, math.inf, "first step after resume: gradient norm inf vs 0.25 recorded"),
])  # fmt: skip
def test_the_rule_allows_measured_noise_and_names_what_broke_it(record, loss, norm, problem):
    assert first_step_problem(record, loss, norm) == problem
