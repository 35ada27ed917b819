"""What each GPU model offers: memory and dense peak FLOP/s per precision. The one table of GPU facts.

The planner (launcher/forecast/) sizes runs against it, and training (launcher/train/metrics.py) quotes MFU
against the same peaks, so a GPU the planner predicts an MFU for is one training measures it on.

The MFU convention, planned and measured alike: model FLOPs per token from
``launcher.core.plan.flops_per_token`` (6N + 12*L*d*T, N the non-embedding parameters, as llm-foundry,
Megatron and torchtitan count; docs/performance.md) over the dense peak of this table in the precision
the run computes in (``launcher.core.config.compute_precision``: bf16 on a GPU unless fp32 is asked for).
No MFU without a known peak (a CPU, a GPU the table lacks).
Names are matched loosely: Slurm's gres type (``h100``), ``cluster.gpu_type`` (``a100-80gb``) and
``torch.cuda.get_device_name()`` (``NVIDIA H100 80GB HBM3``) all find their row; the longest key
contained in the name wins (``h100nvl`` before ``h100``), and a memory size written in the name
(``a100-80gb``) wins over the table's.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Optional

GIB = 2**30  # a GPU's nominal "80 GB" is read as 80 GiB (docs/planning.md)


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: memory in GiB and dense (no sparsity) peak FLOP/s by compute precision."""

    memory_gib: float
    bf16_flops: Optional[float]  # tensor cores, dense; None where the GPU has no bf16
    fp32_flops: Optional[float]  # without TF32, as an fp32 run computes

    def peak(self, precision: str) -> Optional[float]:
        return self.bf16_flops if precision == "bf16" else self.fp32_flops


GPUS: Dict[str, GpuSpec] = {
    "b200": GpuSpec(180, 2250e12, 80e12),
    "b100": GpuSpec(180, 1750e12, 60e12),
    "h200": GpuSpec(141, 989e12, 67e12),
    "gh200": GpuSpec(96, 989e12, 67e12),
    "h100nvl": GpuSpec(94, 835e12, 60e12),
    "h100": GpuSpec(80, 989e12, 67e12),
    "h800": GpuSpec(80, 989e12, 67e12),
    "a100": GpuSpec(40, 312e12, 19.5e12),
    "a800": GpuSpec(80, 312e12, 19.5e12),
    "l40s": GpuSpec(48, 362e12, 91.6e12),
    "l40": GpuSpec(48, 181e12, 90.5e12),
    "a40": GpuSpec(48, 149.7e12, 37.4e12),
    "a6000": GpuSpec(48, 154.8e12, 38.7e12),
    "a10": GpuSpec(24, 125e12, 31.2e12),
    "l4": GpuSpec(24, 121e12, 30.3e12),
    "v100": GpuSpec(32, None, 15.7e12),
    "t4": GpuSpec(16, None, 8.1e12),
}

# The stand-in where the GPU is not known (the local cluster's virtual GPUs).
DEFAULT_GPU = "h100"


def _key(name: str) -> Optional[str]:
    flat = re.sub(r"[^a-z0-9]", "", name.lower())
    hits = [key for key in GPUS if key in flat]
    return max(hits, key=len) if hits else None


def gpu_spec(name: str) -> Optional[GpuSpec]:
    """The row for a GPU name, or None for a GPU the table does not know."""
    key = _key(name)
    return GPUS[key] if key else None


def memory_gib(name: str) -> Optional[float]:
    """GiB of a GPU named ``name``: a size written in it (``a100-80gb``), else the table's."""
    sized = re.search(r"(\d{2,3})g(b|ib)?(?![a-z0-9])", name.lower().replace("_", "-"))
    if sized and int(sized.group(1)) >= 8:
        return float(sized.group(1))
    spec = gpu_spec(name)
    return spec.memory_gib if spec else None


def peak_flops(name: str, precision: str = "bf16") -> Optional[float]:
    """Dense peak FLOP/s of the GPU named ``name`` computing in ``precision`` (bf16 or fp32)."""
    spec = gpu_spec(name)
    return spec.peak(precision) if spec else None
