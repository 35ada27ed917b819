"""What to change so a run fits: each suggestion checked with the same memory model
(docs/planning.md, "Suggestions")."""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from omegaconf import OmegaConf

from launcher.compose.catalog import option_path
from launcher.core.config import CHECKPOINTING, ClusterConfig, RunConfig
from launcher.core.plan import Plan, divisors
from launcher.errors import LaunchError
from launcher.forecast.target import GIB, Assumptions, TargetGpu
from launcher.forecast.memory import Memory, max_micro_batch, memory
from launcher.compose.layout import plan_of

MAX_GPUS = 4096  # how far the suggestions look for a GPU count that fits


def _with(cfg: RunConfig, **changes: Any) -> RunConfig:
    """A copy of ``cfg`` with dotted keys changed (``parallel.sharding="full"``)."""
    sections: Dict[str, Dict[str, Any]] = {}
    for key, value in changes.items():
        section, name = key.split("__")
        sections.setdefault(section, {})[name] = value
    return dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s), **v) for s, v in sections.items()})


def _fits(cfg: RunConfig, hw: TargetGpu, opts: Assumptions) -> Optional[Tuple[Plan, Memory]]:
    try:
        plan = plan_of(cfg)
    except LaunchError:
        return None
    mem = memory(cfg, plan, hw, opts)
    return (plan, mem) if mem.fits else None


def gpu_counts(cluster: ClusterConfig, above: int) -> List[int]:
    """GPU counts the launcher can lay out without layout.nodes, above ``above``: powers of two up
    to a node, then whole nodes."""
    per_node = cluster.gpus_per_node
    small = [c for c in (1, 2, 4, 8, 16, 32, 64) if c < per_node] + [per_node]
    return [c for c in small + [per_node * k for k in range(2, MAX_GPUS // per_node + 1)] if c > above]


@functools.lru_cache(maxsize=None)
def preset_nodes(count: int) -> Optional[int]:
    """layout.nodes as ``gpus=count`` sets it: the preset's (conf/gpus/<count>.yaml), else derived (None)."""
    path = option_path("gpus", str(count))
    return OmegaConf.select(OmegaConf.load(path), "layout.nodes") if path is not None else None


def _smallest_fitting(counts: List[int], fits) -> Optional[int]:
    """The smallest count that fits, by bisection (memory per GPU falls as GPUs are added)."""
    if not counts or not fits(counts[-1]):
        return None
    lo, hi = 0, len(counts) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(counts[mid]):
            hi = mid
        else:
            lo = mid + 1
    return counts[lo]


@dataclass(frozen=True)
class Suggestion:
    overrides: List[str]
    total_gib: float
    note: str = ""

    def __str__(self) -> str:
        return " ".join(self.overrides) + f" ({self.total_gib:.1f} GiB{', ' + self.note if self.note else ''})"


def suggestions(cfg: RunConfig, plan: Plan, hw: TargetGpu, opts: Assumptions) -> List[Suggestion]:
    """Concrete overrides that make a run fit, each checked with the same model: a micro-batch,
    activation checkpointing, full sharding, more GPUs, and if no single change is enough, the
    fewest GPUs at which a combination fits."""
    out: List[Suggestion] = []

    def gib(mem: Memory) -> float:
        return mem.total / GIB

    per_rank = plan.per_rank_batch
    best = max_micro_batch(cfg, plan, hw, opts)
    if best and best != plan.micro_batch:
        mem = memory(cfg, plan, hw, opts, best)
        out.append(Suggestion([f"train.micro_batch={best}"], gib(mem), f"grad_accum {per_rank // best}"))
    level = cfg.parallel.activation_checkpointing
    for higher in CHECKPOINTING[CHECKPOINTING.index(level) + 1:]:
        hit = _fits(_with(cfg, parallel__activation_checkpointing=higher), hw, opts)
        if hit:
            out.append(Suggestion([f"parallel.activation_checkpointing={higher}"], gib(hit[1])))
            break
    if cfg.parallel.sharding != "full":
        hit = _fits(_with(cfg, parallel__sharding="full"), hw, opts)
        if hit:
            out.append(Suggestion(["parallel.sharding=full"], gib(hit[1])))
    if cfg.parallel.precision == "fp32":
        hit = _fits(_with(cfg, parallel__precision="bf16"), hw, opts)
        if hit:
            out.append(Suggestion(["parallel.precision=bf16"], gib(hit[1])))
    counts = gpu_counts(cfg.cluster, plan.gpus)

    def at(count: int, **changes: Any) -> Optional[Tuple[Plan, Memory]]:
        return _fits(_with(cfg, layout__gpus=count, layout__nodes=preset_nodes(count), **changes), hw, opts)

    found = _smallest_fitting(counts, lambda c: at(c) is not None)
    hit = at(found) if found else None
    if hit:
        out.append(Suggestion([f"gpus={found}", f"parallel.sharding={cfg.parallel.sharding}"], gib(hit[1])))
    if not out:
        out.extend(_combined(cfg, plan, hw, opts, [plan.gpus] + counts))
    return out


def _combined(cfg: RunConfig, plan: Plan, hw: TargetGpu, opts: Assumptions, counts: List[int]) -> List[Suggestion]:
    """The fewest GPUs at which full sharding, some checkpointing and some micro-batch fit, with the
    least checkpointing and the largest micro-batch there."""
    level = cfg.parallel.activation_checkpointing
    levels = CHECKPOINTING[CHECKPOINTING.index(level):]

    def variants(count: int):
        for ckpt in levels:
            for sharding in dict.fromkeys([cfg.parallel.sharding, "full"]):
                nodes = cfg.layout.nodes if count == plan.gpus else preset_nodes(count)
                trial = _with(cfg, layout__gpus=count, layout__nodes=nodes,
                              parallel__sharding=sharding, parallel__activation_checkpointing=ckpt)
                try:
                    trial_plan = plan_of(trial)
                except LaunchError:
                    continue
                per_rank = trial_plan.per_rank_batch
                for micro in sorted(divisors(per_rank), reverse=True):
                    mem = memory(trial, trial_plan, hw, opts, micro)
                    if mem.fits:
                        yield trial, micro, mem

    found = _smallest_fitting(counts, lambda c: next(variants(c), None) is not None)
    if found is None:
        return []
    trial, micro, mem = next(variants(found))
    changes = []
    if found != plan.gpus:
        changes.append(f"gpus={found}")
    if trial.parallel.sharding != cfg.parallel.sharding or found != plan.gpus:
        changes.append(f"parallel.sharding={trial.parallel.sharding}")
    if trial.parallel.activation_checkpointing != level:
        changes.append(f"parallel.activation_checkpointing={trial.parallel.activation_checkpointing}")
    if micro != plan.micro_batch:
        changes.append(f"train.micro_batch={micro}")
    return [Suggestion(changes, mem.total / GIB, "together")]
