"""A run frozen by a launcher of the old flat layout (``launcher/entry.py``, ``-m launcher.recovery``) runs its
own frozen copy for every requeue and retry inside its job, but this launcher cannot submit it again: its
batch script would name modules that copy lacks. ``launcher resume`` says so in one line and how to go on,
and submits nothing."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from launcher import cli
from launcher.compose.layout import single_node_plan
from launcher.core.config import ModelConfig, RunConfig
from launcher.job.submission import frozen_layout_problem, resubmit
from launcher.errors import LaunchError
from launcher.core.run_index import RunRecord, save_record
from launcher.submit.freeze import freeze


def old_run(root, name="old"):
    """A failed run whose frozen code has the layout before launcher/job/."""
    run_dir = root / name
    (run_dir / "code" / "launcher").mkdir(parents=True)
    (run_dir / "code" / "launcher" / "entry.py").write_text("class TrainTask: ...\n")
    (run_dir / "code" / "launcher" / "recovery.py").write_text("")
    cfg = RunConfig(model=ModelConfig(name="gpt_tiny", d_model=64, n_heads=2, n_layers=2, seq_len=32), name=name)
    OmegaConf.save(OmegaConf.structured(cfg), run_dir / "config.yaml", resolve=True)
    (run_dir / "plan.json").write_text(json.dumps(single_node_plan(cfg, 2).to_dict()))
    save_record(RunRecord(name=name, run_dir=str(run_dir), model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2,
                          steps=40, cluster="local", submitted_at=1.0, job_id="7"))
    (run_dir / "slurm_state.json").write_text(json.dumps({"job_id": "7", "state": "FAILED", "source": "sacct"}))
    return run_dir


def test_a_run_frozen_now_has_no_problem_and_an_old_one_is_named(tmp_path):
    freeze(tmp_path / "new")
    assert frozen_layout_problem(tmp_path / "new") is None
    assert frozen_layout_problem(tmp_path / "nothing-frozen") is None  # runs made without the launcher
    problem = frozen_layout_problem(old_run(tmp_path))
    assert problem.startswith("run old was frozen by an older launcher (its code has no launcher/job/entry.py)")
    assert f"launcher -f {tmp_path / 'old'}/run.yaml" in problem and "source.json" in problem
    with pytest.raises(LaunchError, match="frozen by an older launcher"):
        resubmit(tmp_path / "old")


def test_a_run_frozen_before_an_entry_point_moved_is_named(tmp_path):
    """The batch script's progress comment was launcher/job/progress.py before it became launcher/job/comment.py:
    a run frozen then cannot run this launcher's batch script, and resume says which module its code lacks."""
    freeze(tmp_path / "moved")
    job = tmp_path / "moved" / "code" / "launcher" / "job"
    (job / "comment.py").rename(job / "progress.py")
    assert frozen_layout_problem(tmp_path / "moved").startswith(
        "run moved was frozen by an older launcher (its code has no launcher/job/comment.py)")


def test_resume_of_an_old_run_says_why_in_one_line_and_submits_nothing(tmp_path, capsys):
    run_dir = old_run(tmp_path)
    before = sorted(p.name for p in run_dir.iterdir())
    assert cli.main(["resume", "old", "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: run old was frozen by an older launcher")
    assert sorted(p.name for p in run_dir.iterdir()) == before  # no submitit folder, no new event
