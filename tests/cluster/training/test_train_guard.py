"""Training stops at the first non-finite loss or gradient norm, naming the step and the value, before
that step's metrics or checkpoint are written."""
import math

import pytest
import torch

from support import train_workers
from launcher.train.guard import NonFiniteError, check_finite
from support.train_harness import launch_forked, make_run_dir, make_tokens, metrics, tiny_config

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm


@pytest.mark.parametrize("loss, norm, message, short", [
    (math.nan, 1.0, "loss is nan at step 5", "loss nan"),
    (math.inf, math.nan, "loss is inf at step 5", "loss inf"),
    (2.0, math.inf, "gradient norm is inf at step 5", "grad norm inf"),
    (2.0, -math.inf, "gradient norm is -inf at step 5", "grad norm -inf"),
])  # fmt: skip
def test_a_non_finite_value_names_itself_and_the_step(loss, norm, message, short):
    with pytest.raises(NonFiniteError) as caught:
        check_finite(5, torch.tensor(loss), torch.tensor(norm))
    assert str(caught.value).startswith(message + ": training diverged; lower train.lr")
    assert caught.value.short == short


def test_finite_values_pass():
    check_finite(0, torch.tensor(2.5), torch.tensor(0.0))
    check_finite(0, torch.tensor(1e30, dtype=torch.bfloat16), torch.tensor(3.0, dtype=torch.float64))


def test_a_diverging_run_stops_before_saving_the_poisoned_step(tmp_path):
    """lr=1e30 turns the weights to ~1e30 after the first update, so the second step's loss is not finite:
    both ranks stop there; the metrics and the one checkpoint are of the first step only, all finite."""
    tokens = make_tokens(tmp_path / "tokens.bin")
    run_dir = make_run_dir(tmp_path / "run", tiny_config(tokens, steps=5, lr=1e30, warmup_steps=0,
                                                         checkpoint_every=1), world_size=2, micro_batch=2)
    with pytest.raises(Exception, match=r"NonFiniteError: loss is nan at step 1: training diverged"):
        launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    records = metrics(run_dir)
    assert [r["step"] for r in records] == [1] and math.isfinite(records[0]["loss"])
    assert sorted(p.name for p in (run_dir / "checkpoints").glob("step_*")) == ["step_00000001"]
