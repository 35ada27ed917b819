"""FLOPs, step time and FSDP communication per step at stated efficiency and bandwidths
(docs/planning.md, "Time")."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional

from launcher.core.config import RunConfig
from launcher.core.plan import FLOPS_PER_TOKEN, Plan, flops_per_token
from launcher.forecast.target import GB, Assumptions, TargetGpu, dtype_bytes, precision_of
from launcher.forecast.memory import _numel, checkpointed_blocks, param_shapes, shard_group


@dataclass(frozen=True)
class Timing:
    """A step's FLOPs and communication, and where the GPU's peak is known, its time (None otherwise: the FLOPs
    and bytes are the model's, the time would be a guess at the GPU)."""

    model_flops: float  # per step, all GPUs: flops_per_token * tokens_per_step
    hardware_flops: float  # plus the forward of checkpointed blocks run again in backward
    compute_s: Optional[float]  # per step, at opts.mfu of the peak on the hardware FLOPs
    allgather_bytes: float  # per GPU per step, received
    reduce_scatter_bytes: float
    allreduce_bytes: float  # hybrid: the shard's all-reduce across nodes
    comm_s: float
    exposed_comm_s: float  # not overlapped with compute
    step_s: Optional[float]
    tokens_per_s_per_gpu: Optional[float]
    mfu: Optional[float]  # predicted model FLOPs utilisation, communication included
    formulas: Dict[str, str] = field(default_factory=dict, compare=False, repr=False)  # by field: how it was computed

    @property
    def comm_bytes(self) -> float:
        return self.allgather_bytes + self.reduce_scatter_bytes + self.allreduce_bytes


def _collective_s(size: float, ranks: int, nodes: int, opts: Assumptions) -> float:
    """Time of an all-gather or reduce-scatter of ``size`` bytes (the full tensor) over ``ranks``
    ranks on ``nodes`` nodes: each GPU moves size*(n-1)/n over NVLink, and each node moves
    size*(m-1)/m over its network links (a ring enters each node once); the slower one bounds it."""
    if ranks <= 1:
        return 0.0
    intra = size * (ranks - 1) / ranks / (opts.intra_gbps * GB)
    inter = size * (nodes - 1) / nodes / (opts.inter_gbps * GB) if nodes > 1 else 0.0
    return max(intra, inter)


def _formulas(plan: Plan, opts: Assumptions, kept: int, gathers: int, cb: int, n: int,
              allreduce: bool) -> Dict[str, str]:
    """How each figure of :class:`Timing` was worked out, in words: the tables of ``launcher plan``."""
    ga = plan.grad_accum
    return {
        "model_flops": f"({FLOPS_PER_TOKEN}) x tokens",
        "hardware_flops": f"+ forward of {kept} checkpointed blocks again",
        "compute_s": f"hardware FLOPs / {plan.world_size} GPUs / ({opts.mfu:g} x peak)",
        "allgather_bytes": f"{ga} x {gathers} x {cb} B x P x (n-1)/n, n = {n}",
        "reduce_scatter_bytes": f"{ga} x 4 B x P x (n-1)/n",
        "allreduce_bytes": (f"hybrid: {ga} x 2 x 4 B x P/n x (m-1)/m across {plan.nodes} nodes" if allreduce
                            else "none (no replicas across nodes)"),
        "comm_s": f"NVLink {opts.intra_gbps:g} GB/s/GPU, network {opts.inter_gbps:g} GB/s/node",
        "exposed_comm_s": "first all-gather and last reduction of each micro-batch",
        "step_s": "exposed + max(compute, rest of comm)",
        "tokens_per_s_per_gpu": "tokens / GPUs / step time",
        "mfu": "model FLOPs / GPUs / step time / peak",
    }


def timing(cfg: RunConfig, plan: Plan, hw: TargetGpu, opts: Assumptions) -> Timing:
    model, sharding = cfg.model, cfg.parallel.sharding
    tokens = plan.tokens_per_step
    model_flops = float(flops_per_token(model)) * tokens
    # A block's forward per token: 2 FLOPs per weight plus 4*s*d for QK^T and AV (a third of 6N + 12LdT).
    _, block = param_shapes(model)
    block_forward = 2 * sum(map(_numel, block)) + 4 * model.seq_len * model.d_model
    kept = checkpointed_blocks(model.n_layers, cfg.parallel.activation_checkpointing)
    recompute = kept * block_forward * tokens
    hardware_flops = model_flops + recompute

    cb = dtype_bytes(precision_of(cfg))
    root, _ = param_shapes(model)
    root_numel = sum(map(_numel, root))
    block_numel = sum(map(_numel, block))
    total_numel = root_numel + model.n_layers * block_numel
    n = shard_group(plan, sharding)
    nodes_in_group = 1 if sharding == "hybrid" else plan.nodes
    gathers = 1 if sharding == "grad_op" else 2  # per micro-batch: forward, and again in backward
    # Per step: grad_accum micro-batches, each gathering every unit `gathers` times in the compute dtype
    # and reduce-scattering every gradient in fp32 (reduce_dtype) into the shards (launcher/train/loop.py).
    ag_size = plan.grad_accum * gathers * cb * total_numel
    rs_size = plan.grad_accum * 4.0 * total_numel
    frac = (n - 1) / n
    allgather_bytes, reduce_scatter_bytes = ag_size * frac, rs_size * frac
    ag_s = _collective_s(ag_size, n, nodes_in_group, opts)
    rs_s = _collective_s(rs_size, n, nodes_in_group, opts)
    allreduce_bytes, ar_s = 0.0, 0.0
    if sharding == "hybrid" and plan.nodes > 1:  # HSDP all-reduces each micro-batch's reduced shard too
        m = plan.nodes
        allreduce_bytes = 2 * rs_size / n * (m - 1) / m  # ring all-reduce of this GPU's shard across nodes
        ar_s = 2 * rs_size * (m - 1) / m / (opts.inter_gbps * GB)  # the node's GPUs share its links
    comm_s = ag_s + rs_s + ar_s
    # Not overlapped, in every micro-batch: its first all-gather (root and first block), and the last
    # unit's (the root's) gradient reduction, which follows the last of that micro-batch's backward
    # compute. Every other unit's reduction overlaps the backward of the units after it.
    first = (root_numel + block_numel) / total_numel / gathers  # of all the all-gather time
    last = root_numel / total_numel  # of all the reduce-scatter and all-reduce time
    exposed = min(comm_s, first * ag_s + last * (rs_s + ar_s))
    compute_s = step_s = per_gpu = mfu = None
    if hw.peak_flops:
        compute_s = hardware_flops / plan.world_size / (opts.mfu * hw.peak_flops)
        step_s = exposed + max(compute_s, comm_s - exposed)
        per_gpu, mfu = tokens / plan.world_size / step_s, model_flops / plan.world_size / step_s / hw.peak_flops
    return Timing(model_flops=model_flops, hardware_flops=hardware_flops, compute_s=compute_s,
                  allgather_bytes=allgather_bytes, reduce_scatter_bytes=reduce_scatter_bytes,
                  allreduce_bytes=allreduce_bytes, comm_s=comm_s, exposed_comm_s=exposed, step_s=step_s,
                  tokens_per_s_per_gpu=per_gpu, mfu=mfu,
                  formulas=_formulas(plan, opts, kept, gathers, cb, n, bool(allreduce_bytes)))
