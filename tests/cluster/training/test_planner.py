"""The planner's memory model against a real (CPU, gloo) FSDP2 run, byte for byte (the rest of the planner:
tests/unit/test_planner.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.core.config import ModelConfig, ParallelConfig, RunConfig, TrainConfig
from launcher.core.plan import parameter_counts
from launcher.forecast.target import Assumptions
from launcher.forecast.memory import local_param_numel, memory
from launcher.forecast.timing import timing
from launcher.compose.layout import plan_of as layout_of
from support.helpers import H100

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm


TINY = {"name": "measure", "d_model": 40, "n_heads": 2, "n_layers": 2, "seq_len": 20, "vocab_size": 70}


def _measure_states(parallel: dict, micro_batch: int, grad_accum: int, out_dir: Path) -> None:
    """One optimizer step through launcher/train/loop.py's forward_backward; writes this rank's bytes of parameter,
    gradient and optimizer-state shards, what is held between micro-batches (just before the second
    micro-batch's forward: unsharded gradients, gradient shards), and the gradient collectives FSDP2 ran
    (calls and input bytes of reduce-scatters and all-reduces, in all and by then)."""
    import inspect

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    from launcher.train.dist import init_distributed
    from launcher.train.loop import build_model, forward_backward
    from launcher.train.optim import build_optimizer

    def nbytes(t) -> int:
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    env = init_distributed(timeout_s=60)
    cfg = RunConfig(model=ModelConfig(**TINY), parallel=ParallelConfig(**parallel))
    model = build_model(cfg, env)
    extra = (env.device,) if len(inspect.signature(build_optimizer).parameters) > 2 else ()
    optimizer, _ = build_optimizer(model, cfg.train, *extra)
    generator = torch.Generator().manual_seed(env.rank)
    micro_batches = [tuple(torch.randint(0, TINY["vocab_size"], (micro_batch, TINY["seq_len"]), generator=generator)
                           for _ in range(2)) for _ in range(grad_accum)]

    # Every gradient collective FSDP2 issues (it calls them through torch.distributed at run time).
    comms = {"reduce_scatter": [0, 0], "all_reduce": [0, 0]}

    def counted(name, real):
        def call(*args, **kwargs):
            tensor = kwargs.get("input", args[1] if len(args) > 1 else None) if name == "reduce_scatter" \
                else kwargs.get("tensor", args[0] if args else None)
            comms[name][0] += 1
            comms[name][1] += nbytes(tensor)
            return real(*args, **kwargs)
        return call

    real_rs, real_ar = dist.reduce_scatter_single, dist.all_reduce
    dist.reduce_scatter_single, dist.all_reduce = counted("reduce_scatter", real_rs), counted("all_reduce", real_ar)

    between = {}
    forwards = []

    def before_forward(module, args):  # runs before FSDP2's own pre-forward (all-gather)
        forwards.append(len(forwards))
        if len(forwards) != 2:
            return
        unsharded = 0
        for sub in model.modules():
            group = sub._get_fsdp_state()._fsdp_param_group if isinstance(sub, FSDPModule) else None
            for param in group.fsdp_params if group else ():
                for grad in (param.unsharded_accumulated_grad,
                             getattr(getattr(param, "_unsharded_param", None), "grad", None)):
                    unsharded += nbytes(grad) if grad is not None else 0
        between.update(unsharded_grads=unsharded,
                       grad_shards=sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None),
                       reduce_scatters=comms["reduce_scatter"][0], all_reduces=comms["all_reduce"][0])

    hook = model.register_forward_pre_hook(before_forward, prepend=True)
    forward_backward(model, micro_batches)
    hook.remove()
    dist.reduce_scatter_single, dist.all_reduce = real_rs, real_ar
    params = sum(nbytes(p) for p in model.parameters())
    grads = sum(nbytes(p.grad) for p in model.parameters() if p.grad is not None)
    optimizer.step()
    states = sum(nbytes(v) for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v))
    result = {"params": params, "grads": grads, "optimizer": states, "between": between,
              "reduce_scatter": comms["reduce_scatter"], "all_reduce": comms["all_reduce"]}
    (out_dir / f"rank{env.rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


@pytest.mark.parametrize("sharding, world, per_node", [("full", 3, 3), ("hybrid", 4, 2)])
def test_state_memory_matches_a_real_fsdp2_run(tmp_path, sharding, world, per_node):
    """The training state, byte for byte, and gradient accumulation: between micro-batches FSDP2 holds no
    unsharded gradient (launcher/train/loop.py reduce-scatters every micro-batch into the gradient shards), and
    each FSDP unit reduce-scatters (and, hybrid, all-reduces across nodes) once per micro-batch."""
    from support.train_harness import launch_forked

    micro_batch, grad_accum = 2, 2
    launch_forked(_measure_states, ({"sharding": sharding}, micro_batch, grad_accum, tmp_path), world, per_node)
    cfg = RunConfig(model=ModelConfig(**TINY), parallel=ParallelConfig(sharding=sharding),
                    train=TrainConfig(batch_per_gpu=micro_batch * grad_accum, micro_batch=micro_batch))
    cfg.layout.gpus, cfg.layout.nodes, cfg.cluster.gpus_per_node = world, world // per_node, per_node
    plan = layout_of(cfg)
    assert (plan.nodes, plan.tasks_per_node, plan.grad_accum) == (world // per_node, per_node, grad_accum)
    predicted = memory(cfg, plan, H100, Assumptions())
    predicted_comm = timing(cfg, plan, H100, Assumptions())
    shards = per_node if sharding == "hybrid" else world
    units = 1 + TINY["n_layers"]  # the root and one per block
    tensors = 3 + 6 * TINY["n_layers"]
    total_params = parameter_counts(ModelConfig(**TINY))[1]
    # FSDP2 pads every tensor to ceil(rows/n) rows per rank: the reduce-scatter input is n x rank 0's shard.
    padded = shards * local_param_numel(cfg.model, shards, 0)
    assert total_params <= padded  # equal over 2 shards; over 3, rows of 40 and 70 are padded
    for rank in range(world):
        measured = json.loads((tmp_path / f"rank{rank}.json").read_text())
        local = local_param_numel(cfg.model, shards, rank % shards)  # the mesh puts rank r at shard r % per_node
        assert {k: measured[k] for k in ("params", "grads", "optimizer")} == {
            "params": 4 * local, "grads": 4 * local, "optimizer": 8 * local + 4 * tensors}, rank
        # Between the micro-batches: only the (already accumulating) gradient shards, nothing unsharded.
        assert measured["between"] == {"unsharded_grads": 0, "grad_shards": 4 * local, "reduce_scatters": units,
                                       "all_reduces": units if sharding == "hybrid" else 0}, rank
        # Per step: grad_accum reduce-scatters of every unit's padded fp32 gradient, and for hybrid as many
        # all-reduces of this rank's fp32 shard across the nodes.
        assert measured["reduce_scatter"] == [grad_accum * units, grad_accum * 4 * padded], rank
        assert measured["all_reduce"] == ([grad_accum * units, grad_accum * 4 * padded // shards]
                                          if sharding == "hybrid" else [0, 0]), rank
        if rank == 0:  # the planner's figure is rank 0's, the largest shard
            assert (predicted.params, predicted.grads, predicted.optimizer) == (
                measured["params"], measured["grads"], measured["optimizer"])
    # The planner's volumes: grad_accum x 4 B x P x (n-1)/n received per GPU (unpadded P).
    assert predicted_comm.reduce_scatter_bytes == pytest.approx(grad_accum * 4 * total_params * (shards - 1) / shards)
    if sharding == "hybrid":
        m = world // per_node
        assert predicted_comm.allreduce_bytes == pytest.approx(grad_accum * 2 * 4 * total_params / shards * (m - 1) / m)
