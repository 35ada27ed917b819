"""A run root too small for the checkpoints a run keeps is warned of, in one line, by ``launcher plan``, dry
runs and launches (the launch goes on); the size of a checkpoint is one rule (launcher/core/checkpoints.py),
also the one preflight refuses a node by."""
import os

import pytest

from launcher.core.config import ModelConfig, RunConfig, TrainConfig
from launcher.compose.layout import single_node_plan
from launcher.core.checkpoints import checkpoints_on_disk
from launcher.core.rundir import frozen_files
from launcher.forecast.disk import free_space
from launcher.train.preflight import disk_problem
from support.helpers import REPO, run_launcher, said

TINY_2 = 1_707_776  # checkpoint_bytes of gpt_tiny on 2 ranks: 12 B x 119,104 + 2 x (16 KiB + 4 x 15 x 2 KiB)


@pytest.mark.parametrize("steps, every, keep, on_disk", [
    (100, 10, 2, 3),  # keep 2, and the third being written before the oldest goes
    (100, 10, 5, 6),
    (100, 50, 5, 2),  # the run saves only twice: steps 50 and 100
    (7, 3, 2, 3),  # 3, 6 and the last, 7
    (6, 0, 4, 1),  # only the last
])  # fmt: skip
def test_checkpoints_on_disk_at_the_peak_of_a_save(steps, every, keep, on_disk):
    assert checkpoints_on_disk(TrainConfig(steps=steps, checkpoint_every=every, keep_checkpoints=keep)) == on_disk


def launcher(*args, root):
    return run_launcher(*args, cwd=REPO, env={**os.environ, "LAUNCHER_RUN_ROOT": str(root)}, timeout=60)


def test_plan_and_dry_runs_warn_in_one_line_when_the_run_root_is_too_small(tmpfs):
    disk = tmpfs("2m")
    root = disk / "runs" / "not-yet"  # the nearest existing parent's filesystem counts
    where, free = free_space(root)
    assert where == disk and 2_000_000 < free <= 2 * 2**20
    code = sum(path.stat().st_size for path in frozen_files())
    need = f"checkpoints need 5.1 MB (3 x 1.7 MB: train.keep_checkpoints=2 kept and the one being saved) " \
           f"but the run root's filesystem ({disk}) has {free / 1e6:,.1f} MB free, {(free - code) / 1e6:,.1f} MB " \
           f"once the run's code ({code / 1e6:,.1f} MB) is copied there: saves will fail; lower " \
           "train.keep_checkpoints or set run_root=... on a larger filesystem"
    args = ("model=gpt_tiny", "gpus=2", "train.checkpoint_every=10")
    for command in (("plan", *args), ("plan", "--json", *args), (*args, "dry_run=true"), (*args, "dry_run=json")):
        result = launcher(*command, root=root)
        assert result.returncode == 0, result.stderr
        assert said(result.stderr) == [f"warning: {need}"], command
    assert not root.exists()  # nothing made by a plan or a dry run
    sweep = launcher("plan", "-m", "model=gpt_tiny", "gpus=2,4", "train.keep_checkpoints=3", root=root)
    assert [line.split(" checkpoints need ")[0] for line in sweep.stderr.splitlines()] == [
        "warning: [model=gpt_tiny gpus=2 train.keep_checkpoints=3]",
        "warning: [model=gpt_tiny gpus=4 train.keep_checkpoints=3]"]
    assert f"(2 x {TINY_2 / 1e6:.1f} MB: all the run saves, with train.checkpoint_every=50)" in sweep.stderr


def test_no_warning_where_the_checkpoints_fit(tmpfs):
    root = tmpfs("7m")  # 5.1 MB of gpt_tiny checkpoints fit beside the frozen code (about 1.2 MB)
    result = launcher("plan", "model=gpt_tiny", "gpus=2", "train.checkpoint_every=10", root=root)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    result = launcher("plan", "model=gpt_tiny", "gpus=2", "train.checkpoint_every=10", "train.keep_checkpoints=3",
                      root=root)
    assert "checkpoints need 6.8 MB (4 x 1.7 MB" in result.stderr


def test_preflight_refuses_a_run_directory_without_room_for_one_checkpoint(tmpfs):
    model = ModelConfig(name="gpt_tiny", d_model=64, n_heads=2, n_layers=2, seq_len=64, vocab_size=256)
    plan = single_node_plan(RunConfig(model=model), 2)
    small, big = tmpfs("1m"), tmpfs("2m")
    assert disk_problem(big, plan, model) == (None, False)
    assert disk_problem(small, plan, model) == (
        f"the run directory {small} has {free_space(small)[1] / 1e6:.1f} MB free; a checkpoint needs about "
        f"{TINY_2 / 1e6:.1f} MB", True)  # a full disk, not the node's fault
