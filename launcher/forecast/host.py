"""The local cluster's real memory: its "GPUs" are CPU processes, and every node of it runs on this
machine, so a run's ranks all share this machine's RAM (docs/planning.md, "The local cluster's memory").

Each rank holds what the GPU memory model (forecast/memory.py) counts for it, computed in the precision
training runs in on CPU (fp32 unless bf16 is asked for: launcher.core.config.compute_precision): its shard of
the training state, the gathered units, the gradient buffers and the activations, plus the margin; and, in place
of the CUDA context, the Python + torch runtime of the process (RANK_RUNTIME_GIB).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from launcher.core.config import RunConfig, compute_precision
from launcher.core.plan import Plan, divisors
from launcher.errors import LaunchError
from launcher.forecast.advice import preset_nodes
from launcher.forecast.target import GIB, Assumptions, TargetGpu
from launcher.forecast.memory import Memory, memory
from launcher.compose.layout import plan_of

# The memory of one rank's process beyond its tensors: Python, torch, gloo, the data and logging. Measured
# as the peak resident set (ru_maxrss, metrics' peak_mem_gb) of a rank training a model of ~0.1 M
# parameters with torch 2.13 on CPU: 0.342-0.345 GB on 1, 2 and 4 ranks (importing torch and launcher/train/
# alone: 0.277 GB). Shared library pages are counted in every rank, so the sum overstates a little.
RANK_RUNTIME_GIB = 0.35

MEMINFO = Path("/proc/meminfo")


def machine_memory(meminfo: Path = MEMINFO) -> Optional[int]:
    """This machine's RAM in bytes: MemTotal, not MemAvailable. Like a GPU's memory size, it is the
    capacity the run is sized against; what is free now says little about the time the job starts
    (other runs may have ended or begun), and would make the same launch pass or fail by the moment.
    None where there is no /proc/meminfo (no check then)."""
    try:
        for line in meminfo.read_text().splitlines():
            key, _, value = line.partition(":")
            if key == "MemTotal":
                return int(value.split()[0]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass(frozen=True)
class HostMemory:
    """The memory a run's ranks need together on this machine, against what it has."""

    model: str
    ranks: int
    rank: Memory  # one rank's need (rank 0's, the largest shard), margin and runtime included
    capacity: int  # bytes of RAM
    precision: str  # what the ranks compute in on CPU

    @property
    def total(self) -> int:
        return self.ranks * self.rank.total

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity

    def need(self) -> str:
        r = self.rank
        return (f"{self.model} on {self.ranks} local rank{'s' if self.ranks > 1 else ''} needs "
                f"{self.total / GIB:.1f} GiB of this machine's memory ({self.ranks} x {r.total / GIB:.2f} GiB: "
                f"states {r.states / GIB:.2f}, activations {r.activations / GIB:.2f}, runtime {RANK_RUNTIME_GIB:g} "
                f"per rank, in {self.precision})")

    def summary(self) -> str:
        return f"{self.need()} but it has {self.capacity / GIB:.1f} GiB (MemTotal)"


def host_memory(cfg: RunConfig, plan: Plan, capacity: int, micro_batch: Optional[int] = None) -> HostMemory:
    """What ``cfg`` laid out as ``plan`` (optionally at another micro-batch) needs of the machine's
    ``capacity`` bytes."""
    on_cpu = compute_precision(cfg.parallel.precision, cuda=False)
    as_run = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, precision=on_cpu))
    cpu = TargetGpu(gpu_type="cpu", memory_gib=capacity / GIB, memory_source="MemTotal", enforce=True,
                   peak_flops=None, peak_source="")
    rank = memory(as_run, plan, cpu, Assumptions(overhead_gib=RANK_RUNTIME_GIB), micro_batch)
    return HostMemory(model=plan.model, ranks=plan.world_size, rank=rank, capacity=capacity, precision=on_cpu)


def to_fit(cfg: RunConfig, plan: Plan, capacity: int) -> str:
    """What to change, as the refusal and ``launcher plan`` say it."""
    return "; or ".join(host_fixes(cfg, plan, capacity)) or "a smaller model"


def host_fixes(cfg: RunConfig, plan: Plan, capacity: int) -> List[str]:
    """Changes that make the run fit the machine: the largest micro-batch that does, and the most ranks
    below the run's that do (fewer ranks hold fewer copies of the runtime, gathered units and
    activations; the sharded state stays the same)."""
    fixes = []
    micro = [m for m in divisors(plan.per_rank_batch) if host_memory(cfg, plan, capacity, m).fits]
    if micro and max(micro) != plan.micro_batch:
        need = host_memory(cfg, plan, capacity, max(micro)).total
        fixes.append(f"train.micro_batch={max(micro)} ({need / GIB:.1f} GiB)")
    for count in range(plan.gpus - 1, 0, -1):
        trial = dataclasses.replace(cfg, layout=dataclasses.replace(cfg.layout, gpus=count, nodes=preset_nodes(count)))
        try:
            trial_plan = plan_of(trial)
        except LaunchError:
            continue
        found = host_memory(trial, trial_plan, capacity)
        if found.fits:
            fixes.append(f"gpus={count} ({found.total / GIB:.1f} GiB)")
            break
    return fixes
