"""Sharding must not change the maths: 1 rank vs 2 and 4 ranks, full and hybrid sharding.

Same model, data and global batch (8 sequences): one rank accumulates 4
micro-batches of 2, two ranks 2 each, four ranks 1 each (or 2 of 1 each, hybrid).
Every micro-batch's gradients are reduce-scattered into the sharded ones
(launcher/train/loop.py), so accumulation across ranks is checked as well as the
reduction. Activation checkpointing and grad_op sharding must not change the
numbers either. Losses, gradient norms and
every full gradient must agree to 1e-5 (relative) for several steps. This is
the test that catches FSDP reducing gradients wrongly (torch 2.7-2.8 on gloo).
"""
import pytest
import torch

from support import train_workers
from support.train_harness import launch_forked, make_tokens, tiny_config

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
# One worker makes its reference losses (a module-scoped fixture) for all the tests here.
pytestmark = [pytest.mark.slurm, pytest.mark.xdist_group("train_parity")]

STEPS = 3
RTOL = 1e-5


@pytest.fixture(scope="module")
def tokens(tmp_path_factory):
    return make_tokens(tmp_path_factory.mktemp("data") / "tokens.bin")


def run_parity(out_dir, tokens, world_size, local_world_size=None, micro_batch=2, **parallel):
    config = tiny_config(tokens, steps=STEPS)
    config["parallel"] = parallel
    launch_forked(train_workers.parity, (config, micro_batch, out_dir), world_size, local_world_size)
    return torch.load(out_dir / "parity.pt")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tokens):
    return run_parity(tmp_path_factory.mktemp("reference"), tokens, 1)


def assert_same_training(reference, other):
    assert len(other["steps"]) == len(reference["steps"]) == STEPS
    for step, (ref, got) in enumerate(zip(reference["steps"], other["steps"])):
        assert got["loss"] == pytest.approx(ref["loss"], rel=RTOL), f"loss at step {step}"
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=RTOL), f"grad norm at step {step}"
        assert got["grads"].keys() == ref["grads"].keys()
        for name, g in ref["grads"].items():
            err = (got["grads"][name] - g).norm() / g.norm()
            assert err < RTOL, f"gradient of {name} at step {step} differs by {err:.2e} (relative)"
    # Training moved: every step has its own loss.
    assert len({s["loss"] for s in reference["steps"]}) == STEPS


@pytest.mark.parametrize("world_size", [2, 4])
def test_full_sharding_matches_one_rank(reference, tokens, tmp_path, world_size):
    result = run_parity(tmp_path, tokens, world_size)
    assert_same_training(reference, result)
    assert result["nodes"] == 1
    # The bring-up check ran on every rank: the sum of rank+1 over the world.
    assert result["allreduce"] == world_size * (world_size + 1) // 2
    for rank in range(world_size):
        log = (tmp_path / "logs" / f"rank_{rank}.log").read_text()
        assert f"rank {rank}/{world_size} local {rank} node " in log
        assert f"device cpu threads 1 allreduce {result['allreduce']} ok" in log


@pytest.mark.parametrize("micro_batch", [2, 1], ids=["grad_accum_1", "grad_accum_2"])
def test_hybrid_sharding_two_nodes_of_two_matches_one_rank(reference, tokens, tmp_path, micro_batch):
    # 8 sequences over 4 ranks: micro-batch 2 x grad_accum 1, or 1 x 2 (reduce-scatter and the
    # cross-node all-reduce on each micro-batch, summed into the gradient shards).
    result = run_parity(tmp_path, tokens, 4, local_world_size=2, micro_batch=micro_batch, sharding="hybrid")
    assert result["nodes"] == 2
    assert "sharding hybrid mesh (2, 2)" in (tmp_path / "logs" / "rank_0.log").read_text()
    assert "rank 3/4 local 1 node " in (tmp_path / "logs" / "rank_3.log").read_text()
    assert_same_training(reference, result)


@pytest.mark.parametrize("world_size,parallel", [
    (2, {"sharding": "grad_op"}),
    (1, {"activation_checkpointing": "full"}),
    (2, {"activation_checkpointing": "selective"}),
], ids=["grad_op", "checkpointing_full", "checkpointing_selective"])
def test_other_parallel_settings_match_one_rank(reference, tokens, tmp_path, world_size, parallel):
    result = run_parity(tmp_path, tokens, world_size, **parallel)
    log = (tmp_path / "logs" / "rank_0.log").read_text()
    assert f"sharding {parallel.get('sharding', 'full')} " in log
    assert f"activation checkpointing {parallel.get('activation_checkpointing', 'none')} " in log
    assert_same_training(reference, result)


@pytest.mark.parametrize("world_size,local_world_size,sharding", [(2, 2, "full"), (4, 2, "hybrid")])
def test_clipping_on_the_local_shards_matches_torchs_on_the_dtensors(tokens, tmp_path, world_size, local_world_size,
                                                                     sharding):
    """launcher/train/optim.py sums the local shards' squares and all-reduces them over the shard dimension; torch
    reduces DTensor norms. The same norm on every bound, the same gradients scaled below it, untouched above it."""
    config = tiny_config(tokens, steps=1)
    config["parallel"] = {"sharding": sharding}
    launch_forked(train_workers.clipping, (config, 2, tmp_path), world_size, local_world_size)
    results = torch.load(tmp_path / "clipping.pt")
    for bound in (1e-3, 1e9):
        torchs, ours = results[("torch", bound)], results[("ours", bound)]
        assert ours["norm"] == pytest.approx(torchs["norm"], rel=1e-6) and ours["norm"] > 1e-3
        for got, want in zip(ours["grads"], torchs["grads"]):
            assert torch.allclose(got, want, rtol=1e-6, atol=0)
    clipped, kept = results[("ours", 1e-3)], results[("ours", 1e9)]
    scale = 1e-3 / (kept["norm"] + 1e-6)
    assert all(torch.allclose(c, k * scale, rtol=1e-5) for c, k in zip(clipped["grads"], kept["grads"]))
