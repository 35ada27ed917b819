"""Loop pieces: the LR schedule, batch splitting, and halving the micro-batch on out-of-memory."""
import dataclasses
import math

import pytest

from support import train_workers
from launcher.core.config import TrainConfig
from launcher.core.plan import read_plan
from launcher.train.loop import Batching
from launcher.train.optim import lr_factor
from support.train_harness import launch_forked, make_run_dir, make_tokens, metrics, tiny_config

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm


def test_lr_warmup_then_cosine_to_min():
    f = [lr_factor(s, warmup_steps=10, total_steps=110, min_lr_ratio=0.1) for s in range(120)]
    assert f[0] == pytest.approx(0.1) and f[4] == pytest.approx(0.5) and f[9] == pytest.approx(1.0)
    assert f[10] == pytest.approx(1.0)
    assert f[60] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert f[110] == pytest.approx(0.1) and f[119] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(f[10:], f[11:]))


def test_batching_from_plan_and_halving(tmp_path):
    run_dir = make_run_dir(tmp_path, tiny_config(tmp_path / "tokens.bin", global_batch=16), world_size=2,
                           micro_batch=8)
    plan = read_plan(run_dir)
    assert (plan.world_size, plan.global_batch, plan.micro_batch, plan.grad_accum) == (2, 16, 8, 1)
    b = Batching.from_plan(plan, TrainConfig(micro_batch="auto"), world_size=2)
    assert b.auto
    seen = []
    while b.micro_batch > 1:
        b.halve()
        seen.append((b.micro_batch, b.grad_accum))
    assert seen == [(4, 2), (2, 4), (1, 8)]
    odd = Batching(global_batch=12, micro_batch=6, grad_accum=1, auto=True)
    odd.halve()
    assert (odd.micro_batch, odd.grad_accum) == (3, 2)
    odd.halve()
    assert (odd.micro_batch, odd.grad_accum) == (1, 6)
    with pytest.raises(RuntimeError, match="made for 2 ranks but the job has 4"):
        Batching.from_plan(plan, TrainConfig(), world_size=4)
    with pytest.raises(ValueError, match="!= global_batch"):
        Batching.from_plan(dataclasses.replace(plan, grad_accum=3), TrainConfig(), world_size=2)


def test_auto_micro_batch_halves_on_out_of_memory(tmp_path):
    """Blocks 'run out of memory' above 1 sequence: both ranks agree to halve twice, then train;
    the losses equal those of the same run planned at micro-batch 1 from the start."""
    tokens = make_tokens(tmp_path / "tokens.bin")
    auto = make_run_dir(tmp_path / "auto", tiny_config(tokens, steps=3, micro_batch="auto"), world_size=2,
                        micro_batch=4)
    launch_forked(train_workers.train_run_oom_above, (auto, 1), world_size=2)
    log = (auto / "logs" / "rank_0.log").read_text()
    assert "out of memory on 2 rank(s): micro_batch now 2, grad_accum 2" in log
    assert "out of memory on 2 rank(s): micro_batch now 1, grad_accum 4" in log
    assert "micro_batch auto: 1 (grad_accum 4) fits" in log
    final = metrics(auto)[-1]
    assert (final["micro_batch"], final["grad_accum"]) == (1, 4)

    fixed = make_run_dir(tmp_path / "fixed", tiny_config(tokens, steps=3, micro_batch=1), world_size=2, micro_batch=1)
    launch_forked(train_workers.train_run, (fixed,), world_size=2)
    losses = lambda d: [r["loss"] for r in metrics(d) if not r.get("final")]
    assert losses(auto) == pytest.approx(losses(fixed), rel=1e-6)
