"""What a run will do, in numbers: layout, batch arithmetic, size and FLOPs.

Computed from a RunConfig before anything is submitted, so impossible layouts
and batch sizes fail on the command line instead of minutes later in a queued
job. The launcher writes it as the run's ``plan.json`` (keys in
docs/design-contract.md) and prints it for ``dry_run``. The parameter and FLOPs
formulas must match train/model.py exactly.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

from launcher.catalog import model_micro_batch
from launcher.core.config import LayoutConfig, ModelConfig, RunConfig
from launcher.core.damage import DamagedRun, read_json_object
from launcher.core.rundir import PLAN
from launcher.errors import LaunchError


@dataclass(frozen=True)
class Plan:
    model: str
    gpus: int
    nodes: int
    tasks_per_node: int
    micro_batch: int  # the starting micro-batch when micro_batch_auto
    micro_batch_auto: bool
    grad_accum: int
    global_batch: int  # sequences per optimizer step
    tokens_per_step: int
    seq_len: int
    params: int
    non_embedding_params: int
    flops_per_token: int
    sharding: str

    @classmethod
    def from_config(cls, cfg: RunConfig) -> "Plan":
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
        return cls(
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

    @property
    def world_size(self) -> int:
        """Ranks of the job: one per GPU."""
        return self.gpus

    @property
    def per_rank_batch(self) -> int:
        """Sequences each rank takes per optimizer step, in grad_accum micro-batches."""
        return self.micro_batch * self.grad_accum

    @property
    def gpus_per_node(self) -> int:
        """GPUs requested per node: one per task."""
        return self.tasks_per_node

    def to_dict(self) -> Dict[str, Any]:
        """The plan.json object."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Plan":
        """The plan of a plan.json object. Keys it no longer has (``world_size`` and ``gpus_per_node``
        of older runs) are ignored; a missing key is a ValueError naming it."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise ValueError(f"plan.json lacks {', '.join(missing)}")
        return cls(**{name: data[name] for name in names})


def read_plan(run_dir: str | Path) -> Plan:
    """The plan a run was launched with, from its directory's plan.json; DamagedRun saying how it is damaged."""
    data = read_json_object(Path(run_dir), PLAN)
    try:
        return Plan.from_dict(data)
    except ValueError as err:
        raise DamagedRun(Path(run_dir), PLAN, str(err).removeprefix(f"{PLAN} ")) from None


def single_node_plan(cfg: RunConfig, ranks: int) -> Plan:
    """The plan of ``cfg`` on ``ranks`` ranks of one machine, as the launcher would make it: for run
    directories made without the launcher (the train tests, scripts/bench_train.py, scripts/gpu_check.sh)."""
    return Plan.from_config(dataclasses.replace(
        cfg, layout=LayoutConfig(gpus=ranks, nodes=1), cluster=dataclasses.replace(cfg.cluster, gpus_per_node=ranks)))


def param_shapes(model: ModelConfig) -> Tuple[List[Tuple[int, ...]], List[Tuple[int, ...]]]:
    """(root, one block) parameter shapes of train/model.py's GPT. The root FSDP unit holds the
    tied token embedding, the learned positions and the final LayerNorm; each block is a unit."""
    d, r = model.d_model, model.mlp_ratio
    root = [(model.vocab_size, d), (model.seq_len, d), (d,)]
    block = [(d,), (3 * d, d), (d, d), (d,), (r * d, d), (d, r * d)]  # ln1, qkv, proj, ln2, fc, proj
    return root, block


def parameter_counts(model: ModelConfig) -> Tuple[int, int]:
    """(non-embedding, total) parameters: bias-free Linear and LayerNorm, tied
    embedding, learned positions (docs/design-contract.md)."""
    d, r = model.d_model, model.mlp_ratio
    non_embedding = model.n_layers * ((4 + 2 * r) * d * d + 2 * d) + d
    return non_embedding, non_embedding + model.vocab_size * d + model.seq_len * d


FLOPS_PER_TOKEN = "6N + 12*L*d*T"  # the formula of flops_per_token, as printed


def flops_per_token(model: ModelConfig) -> int:
    """Training FLOPs per token, FLOPS_PER_TOKEN: 6N + 12*L*H*Q*T with H*Q = d_model. MFU, planned and
    measured, counts these (launcher/core/hardware.py)."""
    non_embedding, _ = parameter_counts(model)
    return 6 * non_embedding + 12 * model.n_layers * model.d_model * model.seq_len


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


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` not above ``at_most`` (at least 1): the micro-batch rule. A rank's
    share of the batch is split into equal micro-batches, so ``auto`` starts at the largest that divides
    it, and the out-of-memory fallback halves to the largest that still does (halved_micro_batch)."""
    return max(d for d in divisors(n) if d <= max(1, at_most))


def halved_micro_batch(per_rank: int, micro_batch: int) -> int:
    """The micro-batch after an out-of-memory at ``micro_batch``: the largest at most half of it that
    divides the rank's share. Training steps down so (train/loop.py); the planner's ``auto`` follows it."""
    return largest_divisor(per_rank, micro_batch // 2)
