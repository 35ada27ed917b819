"""The GPU a run is planned for (memory, peak FLOP/s, and where each figure came from), and the
stated assumptions of the estimate. The GPU facts themselves live in launcher/core/gpus.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from launcher.core import gpus
from launcher.core.gpus import GIB  # the forecast's modules take it from here
from launcher.core.config import LOCAL_CLUSTER, ClusterConfig, RunConfig, compute_precision
from launcher.errors import LaunchError
from launcher.slurm import client as slurm

GB = 1e9  # bandwidths are in GB/s (10^9 bytes), as vendors and nccl-tests quote them


@dataclass(frozen=True)
class Assumptions:
    """The knobs of the estimate (``launcher plan --mfu ... --intra-gbps ... --inter-gbps ...``)."""

    mfu: float = 0.45  # fraction of the dense peak sustained on the FLOPs actually executed
    intra_gbps: float = 300.0  # effective NVLink bandwidth per GPU inside a node (GB/s)
    inter_gbps: float = 50.0  # effective network bandwidth per node between nodes (GB/s)
    margin: float = 0.10  # allocator fragmentation, as a fraction of the computed need
    overhead_gib: float = 1.0  # CUDA context, NCCL and cuBLAS workspaces, per GPU

    def check(self) -> None:
        if not 0 < self.mfu <= 1:
            raise LaunchError(f"--mfu must be in (0, 1], got {self.mfu}")
        for name in ("intra_gbps", "inter_gbps"):
            if getattr(self, name) <= 0:
                raise LaunchError(f"--{name.replace('_', '-')} must be positive, got {getattr(self, name)}")
        if self.margin < 0 or self.overhead_gib < 0:
            raise LaunchError("--margin and --overhead-gib must not be negative")


# How a plan on a GPU of unknown type gets its time figures: the one line ``launcher plan`` prints there.
NAME_THE_GPU = "set cluster.gpu_type=TYPE, or run launcher clusters add NAME --gpu-type TYPE"


@dataclass(frozen=True)
class TargetGpu:
    """The GPU a run is planned for, and where each figure came from. Its memory is always sized (from a stated
    assumption where unknown); its speed only where its peak is known, so no step time, tokens/s or MFU is
    forecast for a GPU whose type is not known."""

    gpu_type: str  # as named by the source, the stand-in's label, or "unknown"
    memory_gib: float
    memory_source: str
    enforce: bool  # the launch refuses a run that does not fit (memory known, or the local cluster's stand-in)
    peak_flops: Optional[float]  # dense peak in the run's compute precision; None: no time figures
    peak_source: str  # where the peak came from, or why there is none and how to name the GPU
    stand_in: bool = False  # virtual GPUs (CPU processes) planned as core/gpus.py DEFAULT_GPU

    @property
    def unforecast(self) -> Optional[str]:
        """The one line a plan shows where it forecasts no speed: why, and how to name the GPU; None elsewhere."""
        return None if self.peak_flops else f"no step time, tokens/s or MFU: {self.peak_source}"


def precision_of(cfg: RunConfig) -> str:
    """The precision ``cfg`` computes in on a GPU."""
    return compute_precision(cfg.parallel.precision, cuda=True)


def dtype_bytes(precision: str) -> int:
    """Bytes per element of the compute dtype."""
    return 2 if precision == "bf16" else 4


def gres_gpu_type(cluster: ClusterConfig) -> Optional[str]:
    """The GPU type in the gres of the cluster's partition (``gpu:h100:8`` -> ``h100``); None if the
    gres names no type or Slurm does not answer. The partitions are asked once per process (a launch
    reuses them)."""
    try:
        return slurm.for_cluster(cluster).partition(cluster.partition).gpu_type
    except slurm.SlurmError:
        return None


def hardware_for(cluster: ClusterConfig, precision: str = "bf16", query_slurm: bool = False) -> TargetGpu:
    """The GPU of ``cluster``: memory from ``cluster.gpu_memory_gb``, else from the GPU type
    (``cluster.gpu_type``, else the partition's gres type when ``query_slurm``), else a stated
    assumption; its peak from the GPU type, else none (and no time figures). Virtual GPUs (the local
    cluster's) have neither; they are planned as the stand-in GPU (core/gpus.py DEFAULT_GPU), labelled
    so, and the launch check applies to them too (so a model that fits no such GPU is refused)."""
    stand_in = cluster.gpu_type is None and (cluster.name == LOCAL_CLUSTER or cluster.virtual_gpus)
    gpu_type, type_source = cluster.gpu_type, "cluster.gpu_type"
    if gpu_type is None and query_slurm and not stand_in:
        gpu_type, type_source = gres_gpu_type(cluster), "sinfo gres"
    spec, name = gpus.GPUS[gpus.DEFAULT_GPU], f"{gpus.DEFAULT_GPU.upper()} stand-in"
    as_stand_in = f"default for cluster {cluster.name}'s virtual GPUs"
    typed_memory = gpus.memory_gib(gpu_type) if gpu_type else None
    if cluster.gpu_memory_gb:
        memory, memory_source, enforce = float(cluster.gpu_memory_gb), "cluster.gpu_memory_gb", True
    elif typed_memory:
        memory, memory_source, enforce = typed_memory, f"{type_source} {gpu_type}", True
    elif stand_in:
        memory, memory_source, enforce = spec.memory_gib, as_stand_in, True
    else:
        memory, enforce = spec.memory_gib, False
        memory_source = "assumed (GPU memory unknown: set cluster.gpu_memory_gb)"
    if stand_in:
        peak, peak_source = spec.peak(precision), f"{as_stand_in}, {precision}"
    elif gpu_type is None:
        peak, peak_source = None, f"GPU type unknown: {NAME_THE_GPU}"
    else:
        peak = gpus.peak_flops(gpu_type, precision)
        peak_source = (f"{type_source} {gpu_type}, {precision}" if peak else
                       f"no {precision} peak known for GPU type {gpu_type}")
    return TargetGpu(gpu_type=name if stand_in else gpu_type or "unknown", memory_gib=memory,
                     memory_source=memory_source, enforce=enforce, peak_flops=peak, peak_source=peak_source,
                     stand_in=stand_in)
