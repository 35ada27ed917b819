"""Everything ``launcher plan`` shows about one run, and scaling efficiency across a sweep.

Pure arithmetic on a composed RunConfig and its Plan (no torch, no GPU): memory per rank
(forecast/memory.py), FLOPs, step time and communication (forecast/timing.py) on the GPU of
forecast/target.py, and for a run that does not fit, the changes that would (forecast/advice.py).
Every formula and its source is in docs/planning.md.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from launcher.core.config import CHECKPOINTING, RunConfig
from launcher.core.plan import Plan, halved_micro_batch
from launcher.forecast.advice import Suggestion, suggestions
from launcher.forecast.learned import Correction
from launcher.forecast.target import GIB, Assumptions, TargetGpu, precision_of
from launcher.forecast.memory import Memory, activation_bytes, max_micro_batch, memory, micro_batch_limit, shard_group
from launcher.forecast.timing import Timing, timing


@dataclass
class Estimate:
    """Everything ``launcher plan`` shows about one run (``--json`` is :meth:`to_dict`)."""

    cfg: RunConfig
    plan: Plan
    hardware: TargetGpu
    assumptions: Assumptions
    precision: str
    memory: Memory
    activations_by_level: Dict[str, int]
    max_micro_batch: int
    micro_batch_limit: int
    timing: Timing
    suggestions: List[Suggestion] = field(default_factory=list)
    scaling_efficiency: Optional[float] = None  # vs the fewest-GPU run of a sweep with the same other settings
    overrides: List[str] = field(default_factory=list)
    correction: Optional[Correction] = None  # what the cluster's similar completed runs measured (forecast/learned.py)

    @property
    def fits(self) -> bool:
        """Fits as configured; with ``train.micro_batch=auto``, at a micro-batch its halving reaches."""
        if self.memory.fits or self.cfg.train.micro_batch != "auto":
            return self.memory.fits
        per_rank, micro = self.plan.per_rank_batch, self.plan.micro_batch
        while micro > 1:  # as training steps down on out-of-memory
            micro = halved_micro_batch(per_rank, micro)
            if memory(self.cfg, self.plan, self.hardware, self.assumptions, micro).fits:
                return True
        return False

    def summary(self) -> str:
        m = self.memory
        return (f"{self.plan.model} on {self.plan.gpus} GPUs ({self.cfg.parallel.sharding} sharding, "
                f"{self.cfg.parallel.activation_checkpointing} checkpointing, micro-batch {self.plan.micro_batch}) "
                f"needs {m.total / GIB:.1f} GiB per GPU (states {m.states / GIB:.1f}, "
                f"activations {m.activations / GIB:.1f}) but the GPU has {self.hardware.memory_gib:g} GiB "
                f"({self.hardware.memory_source})")

    def to_dict(self) -> Dict[str, Any]:
        m, t, hw = self.memory, self.timing, self.hardware
        return {
            "model": self.plan.model, "gpus": self.plan.gpus, "nodes": self.plan.nodes,
            "tasks_per_node": self.plan.tasks_per_node, "sharding": self.cfg.parallel.sharding,
            "shard_group": shard_group(self.plan, self.cfg.parallel.sharding),
            "activation_checkpointing": self.cfg.parallel.activation_checkpointing, "precision": self.precision,
            "micro_batch": self.plan.micro_batch, "grad_accum": self.plan.grad_accum,
            "global_batch": self.plan.global_batch, "tokens_per_step": self.plan.tokens_per_step,
            "params": self.plan.params, "overrides": self.overrides,
            "gpu": {"type": hw.gpu_type, "memory_gib": hw.memory_gib, "memory_source": hw.memory_source,
                    "enforced_at_launch": hw.enforce, "peak_flops": hw.peak_flops, "peak_source": hw.peak_source,
                    "stand_in": hw.stand_in},
            "memory_bytes": {"params": m.params, "grads": m.grads, "optimizer": m.optimizer, "gathered": m.gathered,
                             "grad_buffers": m.grad_buffers, "activations": m.activations, "margin": m.margin,
                             "total": m.total, "capacity": m.capacity},
            "activations_gib": {level: b / GIB for level, b in self.activations_by_level.items()},
            "mem_per_gpu_gib": m.total / GIB, "capacity_gib": hw.memory_gib, "fits": self.fits,
            "max_micro_batch": self.max_micro_batch, "micro_batch_limit": self.micro_batch_limit,
            "model_flops_per_step": t.model_flops, "hardware_flops_per_step": t.hardware_flops,
            "compute_time_s": t.compute_s, "step_time_s": t.step_s, "tokens_per_s_per_gpu": t.tokens_per_s_per_gpu,
            "predicted_mfu": t.mfu,
            "comm": {"allgather_bytes": t.allgather_bytes, "reduce_scatter_bytes": t.reduce_scatter_bytes,
                     "allreduce_bytes": t.allreduce_bytes, "bytes_per_gpu": t.comm_bytes, "time_s": t.comm_s,
                     "exposed_s": t.exposed_comm_s},
            "scaling_efficiency": self.scaling_efficiency,
            "suggestions": [{"overrides": s.overrides, "total_gib": s.total_gib, "note": s.note}
                            for s in self.suggestions],
            "assumptions": dataclasses.asdict(self.assumptions),
            "corrected": self.correction.to_dict(t.step_s, m.total / GIB) if self.correction else None,
        }


def estimate(cfg: RunConfig, plan: Plan, hw: TargetGpu, opts: Assumptions = Assumptions(),
             overrides: Sequence[str] = ()) -> Estimate:
    precision = precision_of(cfg)
    est = Estimate(
        cfg=cfg, plan=plan, hardware=hw, assumptions=opts, precision=precision,
        memory=memory(cfg, plan, hw, opts),
        activations_by_level={level: activation_bytes(cfg.model, plan.micro_batch, level, precision)
                              for level in CHECKPOINTING},
        max_micro_batch=max_micro_batch(cfg, plan, hw, opts),
        micro_batch_limit=micro_batch_limit(cfg, plan, hw, opts),
        timing=timing(cfg, plan, hw, opts), overrides=list(overrides),
    )
    if not est.fits:
        est.suggestions = suggestions(cfg, plan, hw, opts)
    return est


_SCALING_KEYS = ("gpus", "layout.gpus", "layout.nodes", "parallel.sharding")


def set_scaling(estimates: List[Estimate]) -> None:
    """Scaling efficiency of each run: its tokens/s/GPU over that of the fewest-GPU run among the runs
    whose other overrides are the same (gpus=8,16,128 compares 8 -> 16 -> 128, presets' sharding included);
    none for a run on a GPU whose speed is not forecast."""
    groups: Dict[Tuple[str, ...], List[Estimate]] = {}
    for est in (e for e in estimates if e.timing.tokens_per_s_per_gpu):
        key = tuple(o for o in est.overrides if o.split("=", 1)[0].lstrip("+~") not in _SCALING_KEYS)
        groups.setdefault(key, []).append(est)
    for group in groups.values():
        base = min(group, key=lambda e: e.plan.gpus)
        for est in group:
            est.scaling_efficiency = est.timing.tokens_per_s_per_gpu / base.timing.tokens_per_s_per_gpu


