"""Turn the plain GPT into the model that trains: FSDP2, precision, checkpointing, compile.

Everything about parallelism lives in :func:`parallelize`, so ``model.py`` stays a
readable single-device model and the loop only sees an ``nn.Module``.
"""
from __future__ import annotations

import logging

import torch
import torch.nn as nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from launcher.core.config import CHECKPOINTING, PRECISIONS, SHARDINGS, ParallelConfig, checkpointed, compute_precision
from launcher.train.dist import DistEnv
from launcher.train.model import GPT

log = logging.getLogger(__name__)

def parallelize(model: GPT, cfg: ParallelConfig, env: DistEnv, seed: int) -> nn.Module:
    """Shard ``model`` over the process group and give it real, initialised weights.

    ``model`` is normally built on the meta device; its storage is only allocated
    here, after sharding, so no rank ever holds the full model. The order is
    torchtitan's: activation checkpointing wraps each block, compile compiles the
    wrapped block, and FSDP shards the result; FSDP goes on every block (one
    all-gather per block, overlapped with the previous block's compute) and on the
    root, which holds the embeddings and the final LayerNorm.

    Sharding: ``full`` shards over the whole world; ``hybrid`` builds a 2-D mesh
    (replicate across nodes, shard within a node) so the all-gathers stay on the
    fast intra-node links; ``grad_op`` keeps parameters gathered between forward
    and backward (more memory, one all-gather fewer per step).

    A world of one computing in fp32 (any CPU run, or ``precision=fp32`` on one GPU) is not wrapped at
    all: there is nothing to shard and no precision to cast, and FSDP2 would only copy every parameter
    into and out of its all-gather buffers and every gradient through its reduce-scatter buffers, each
    step (6-11% of a CPU step, docs/performance.md). The maths is the same (FSDP's all-gather and
    reduce-scatter on one rank are copies; gradients of micro-batches are summed in the same order), and so
    is the checkpoint: DCP saves the same keys, each tensor as one chunk of its full shape, whichever wraps
    it, and reshards on load, so such a checkpoint resumes on any world size and vice versa. With bf16
    (one GPU) the model stays wrapped: FSDP's MixedPrecisionPolicy is what casts it.
    """
    _check_choice("sharding", cfg.sharding, SHARDINGS)
    _check_choice("activation_checkpointing", cfg.activation_checkpointing, CHECKPOINTING)
    _check_choice("precision", cfg.precision, PRECISIONS)

    mesh = _device_mesh(cfg.sharding, env)
    bf16 = compute_precision(cfg.precision, env.device.type == "cuda") == "bf16"
    mp_policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16 \
        else MixedPrecisionPolicy()
    # Resharding after forward frees a block's gathered parameters until backward gathers them again;
    # with one rank per shard group there is nothing to free, only copies to make.
    reshard_after_forward = cfg.sharding != "grad_op" and mesh.shape[-1] > 1
    wrap = env.world_size > 1 or bf16

    for i, block in enumerate(model.blocks):
        if checkpointed(cfg.activation_checkpointing, i):
            block = checkpoint_wrapper(block)
        if cfg.compile:
            block.compile()
        if wrap:
            fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard_after_forward)
        model.blocks[i] = block
    # The root (embeddings, final norm, tied head) is the first unit backward needs: keep it gathered
    # (as torchtitan does) rather than reshard and gather it again at once.
    if wrap:
        fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=False)

    model.to_empty(device=env.device)
    model.init_weights(seed)
    log.info("parallelized: sharding %s %smesh %s precision %s activation checkpointing %s compile %s",
             cfg.sharding, "" if wrap else "(one rank in fp32: no FSDP wrapper) ", tuple(mesh.shape),
             "bf16" if bf16 else "fp32", cfg.activation_checkpointing, cfg.compile)
    return model


def _device_mesh(sharding: str, env: DistEnv) -> DeviceMesh:
    """1-D over the world, or for ``hybrid`` 2-D: ("replicate", "shard") = (nodes, ranks per node)."""
    if sharding != "hybrid":
        return init_device_mesh(env.device.type, (env.world_size,), mesh_dim_names=("shard",))
    if env.world_size % env.nodes:
        raise ValueError(f"hybrid sharding needs the same number of ranks on each of {env.nodes} nodes, "
                         f"but world size is {env.world_size}")
    per_node = env.world_size // env.nodes
    if env.local_rank != env.rank % per_node:
        raise ValueError(f"hybrid sharding needs ranks numbered node by node (Slurm's block distribution), "
                         f"but rank {env.rank} is local rank {env.local_rank} on {env.node}")
    return init_device_mesh(env.device.type, (env.nodes, per_node), mesh_dim_names=("replicate", "shard"))


def _check_choice(what: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"parallel.{what} must be one of {', '.join(choices)}, not {value!r}")
