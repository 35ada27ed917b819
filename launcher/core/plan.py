"""What a run will do, in numbers: layout, batch arithmetic, size and FLOPs.

Composition lays a config out as a Plan (launcher/compose/layout.py) before anything is submitted; the
launcher writes it as the run's ``plan.json`` (keys in docs/design-contract.md) and prints it for
``dry_run``, and the training tasks read it back. The parameter and FLOPs formulas must match
launcher/train/model.py exactly.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Tuple

from launcher.core.config import ModelConfig
from launcher.core.damage import DamagedRun, read_json_object
from launcher.core.rundir import PLAN


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
        """The plan of a plan.json object; a missing or an unknown key is a ValueError naming it."""
        names = [f.name for f in dataclasses.fields(cls)]
        missing = [name for name in names if name not in data]
        if missing:
            raise ValueError(f"plan.json lacks {', '.join(missing)}")
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"plan.json has keys no plan has: {', '.join(unknown)}")
        return cls(**{name: data[name] for name in names})


def read_plan(run_dir: str | Path) -> Plan:
    """The plan a run was launched with, from its directory's plan.json; DamagedRun saying how it is damaged."""
    data = read_json_object(Path(run_dir), PLAN)
    try:
        return Plan.from_dict(data)
    except ValueError as err:
        raise DamagedRun(Path(run_dir), PLAN, str(err).removeprefix(f"{PLAN} ")) from None


def param_shapes(model: ModelConfig) -> Tuple[List[Tuple[int, ...]], List[Tuple[int, ...]]]:
    """(root, one block) parameter shapes of launcher/train/model.py's GPT. The root FSDP unit holds the
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
    measured, counts these (launcher/core/gpus.py)."""
    non_embedding, _ = parameter_counts(model)
    return 6 * non_embedding + 12 * model.n_layers * model.d_model * model.seq_len


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def largest_divisor(n: int, at_most: int) -> int:
    """The largest divisor of ``n`` not above ``at_most`` (at least 1): the micro-batch rule. A rank's
    share of the batch is split into equal micro-batches, so ``auto`` starts at the largest that divides
    it, and the out-of-memory fallback halves to the largest that still does (halved_micro_batch)."""
    return max(d for d in divisors(n) if d <= max(1, at_most))


def halved_micro_batch(per_rank: int, micro_batch: int) -> int:
    """The micro-batch after an out-of-memory at ``micro_batch``: the largest at most half of it that
    divides the rank's share. Training steps down so (launcher/train/loop.py); the planner's ``auto`` follows it."""
    return largest_divisor(per_rank, micro_batch // 2)
