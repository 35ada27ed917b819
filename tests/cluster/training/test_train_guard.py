"""Training stops at the first non-finite loss or gradient norm, naming the step and the value, before
that step's metrics or checkpoint are written; the host reads these values where it reads the device anyway (a
metrics row, an evaluation, a save) or every few seconds of steps, not at every step."""
import math

import pytest
import torch

from support import train_workers
from launcher.train.guard import Checks, NonFiniteError
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
    checks = Checks(torch.device("cpu"))
    for step, values in [(4, (2.0, 1.0)), (5, (loss, norm)), (6, (math.nan, math.nan)), (7, (2.0, 1.0))]:
        checks.note(step, *map(torch.tensor, values))  # noted on the device; a later step hides nothing
    with pytest.raises(NonFiniteError) as caught:
        checks.read()
    assert str(caught.value).startswith(message + ": training diverged; lower train.lr")
    assert caught.value.short == short


def test_finite_values_pass():
    checks = Checks(torch.device("cpu"))
    checks.note(0, torch.tensor(2.5), torch.tensor(0.0))
    checks.note(1 << 40, torch.tensor(1e30, dtype=torch.bfloat16), torch.tensor(3.0, dtype=torch.float64))
    checks.read()


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


def test_the_host_reads_the_device_a_few_times_an_attempt_not_every_step(tmp_path):
    """Every read goes through launcher/train/host_sync.py, which counts them: a run three times as long (no
    metrics row, evaluation or save between its first step and its end) reads twice more, for one more agreement on
    Slurm's signal (steps 1, 2, 4, 8, 16, and 32: the doubling, not held to 10 s here) and the finiteness read with
    it; at every step it would be 80 more."""
    tokens = make_tokens(tmp_path / "tokens.bin")
    reads = {}
    for steps in (20, 60):
        config = tiny_config(tokens, steps=steps, log_every=steps)
        config["cluster"]["signal_delay_s"] = 3600
        run_dir = make_run_dir(tmp_path / f"run{steps}", config, world_size=2, micro_batch=2)
        launch_forked(train_workers.train_run_counting_reads, (run_dir,), world_size=2)
        reads[steps] = [int((run_dir / f"reads_{rank}").read_text()) for rank in range(2)]
        assert [r["step"] for r in metrics(run_dir)] == [steps, steps]  # the last row, and the final summary
    assert reads[20][0] == reads[20][1] and reads[60][0] == reads[60][1]
    # 5 agreements and their finiteness reads; the last step's finiteness, its metrics row and its save (2 each)
    assert reads[20][0] == 5 * 2 + 1 + 2 + 2
    assert reads[60][0] - reads[20][0] == 2
