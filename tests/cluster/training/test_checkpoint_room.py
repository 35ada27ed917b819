"""The size of a checkpoint is one rule (launcher/core/checkpoints.py), just above a real one (the warnings it
gives: tests/unit/test_checkpoint_room.py)."""
from __future__ import annotations

import pytest

from launcher.core.config import load_run_config
from launcher.core.plan import read_plan
from launcher.core.checkpoints import checkpoint_bytes

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm


def test_the_size_rule_is_just_above_a_real_checkpoint(reference_run):
    cfg, plan = load_run_config(reference_run / "config.yaml"), read_plan(reference_run)
    for step in ("step_00000003", "step_00000006"):
        files = sum(f.stat().st_size for f in (reference_run / "checkpoints" / step).iterdir())
        assert files <= checkpoint_bytes(cfg.model, plan.params, plan.world_size) <= 1.05 * files
