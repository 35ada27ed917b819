"""A composed config laid out as a run: nodes, tasks per node and batch arithmetic (the run's Plan).

Computed before anything is submitted, so impossible layouts and batch sizes fail on the command line
instead of minutes later in a queued job. The Plan itself, which the training tasks read back from
``plan.json``, is launcher/core/plan.py's.
"""
from __future__ import annotations

import dataclasses
from typing import Tuple

from launcher.compose.catalog import model_micro_batch
from launcher.core.config import LayoutConfig, RunConfig
from launcher.core.plan import Plan, flops_per_token, largest_divisor, parameter_counts
from launcher.errors import LaunchError


def plan_of(cfg: RunConfig) -> Plan:
    """The plan of a validated config; LaunchError if it cannot be laid out."""
    gpus = cfg.layout.gpus
    nodes, tasks_per_node = layout(gpus, cfg.layout.nodes, cfg.cluster.gpus_per_node, cfg.cluster.name)
    global_batch = cfg.train.global_batch
    if global_batch is None:  # weak scaling: a fixed batch per GPU
        global_batch = cfg.train.batch_per_gpu * gpus
    micro_batch, auto = _micro_batch(cfg, global_batch, gpus)
    if global_batch % (gpus * micro_batch):
        raise LaunchError(
            f"global batch {global_batch} is not divisible by world_size x micro_batch = {gpus} x {micro_batch}; "
            "change train.global_batch, train.batch_per_gpu or train.micro_batch"
        )
    non_embedding, params = parameter_counts(cfg.model)
    return Plan(
        model=cfg.model.name,
        gpus=gpus,
        nodes=nodes,
        tasks_per_node=tasks_per_node,
        micro_batch=micro_batch,
        micro_batch_auto=auto,
        grad_accum=global_batch // (gpus * micro_batch),
        global_batch=global_batch,
        tokens_per_step=global_batch * cfg.model.seq_len,
        seq_len=cfg.model.seq_len,
        params=params,
        non_embedding_params=non_embedding,
        flops_per_token=flops_per_token(cfg.model),
        sharding=cfg.parallel.sharding,
    )


def single_node_plan(cfg: RunConfig, ranks: int) -> Plan:
    """The plan of ``cfg`` on ``ranks`` ranks of one machine, as the launcher would make it: for run
    directories made without the launcher (the train tests, scripts/bench_train.py, scripts/gpu_check.sh)."""
    return plan_of(dataclasses.replace(
        cfg, layout=LayoutConfig(gpus=ranks, nodes=1), cluster=dataclasses.replace(cfg.cluster, gpus_per_node=ranks)))


def layout(gpus: int, nodes: int | None, gpus_per_node: int, cluster: str) -> Tuple[int, int]:
    """(nodes, tasks per node) for ``gpus`` tasks, one per GPU.

    Without an explicit node count, a run fits on one node or fills whole nodes.
    """
    if nodes is None:
        if gpus <= gpus_per_node:
            return 1, gpus
        if gpus % gpus_per_node:
            multiples = ", ".join(str(gpus_per_node * k) for k in (2, 3, 4))
            raise LaunchError(
                f"gpus={gpus} cannot be laid out on cluster {cluster} ({gpus_per_node} GPUs per node); "
                f"use at most {gpus_per_node} or a multiple of {gpus_per_node} ({multiples}, ...)"
            )
        return gpus // gpus_per_node, gpus_per_node
    if gpus % nodes:
        raise LaunchError(f"gpus={gpus} cannot be split evenly over layout.nodes={nodes}")
    if gpus // nodes > gpus_per_node:
        raise LaunchError(
            f"gpus={gpus} over layout.nodes={nodes} needs {gpus // nodes} GPUs per node; "
            f"cluster {cluster} has {gpus_per_node}"
        )
    return nodes, gpus // nodes


def _micro_batch(cfg: RunConfig, global_batch: int, world_size: int) -> Tuple[int, bool]:
    """(micro-batch, auto). ``auto`` starts from the model size's default and
    takes the largest divisor of the per-rank batch not above it; training
    halves it on CUDA out-of-memory."""
    if cfg.train.micro_batch != "auto":
        return cfg.train.micro_batch, False
    per_rank = max(1, global_batch // world_size)
    return largest_divisor(per_rank, model_micro_batch(cfg.model.name) or per_rank), True
