"""The GPU a run is planned for (memory, peak FLOP/s, and where each figure came from), and the
stated assumptions of the estimate. The GPU facts themselves live in launcher/core/gpus.py."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from launcher.core import gpus
from launcher.core.config import LOCAL_CLUSTER, ClusterConfig, RunConfig, compute_precision
from launcher.errors import LaunchError
from launcher.slurm import client as slurm

GIB = 2**30
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


@dataclass(frozen=True)
class TargetGpu:
    """The GPU a run is planned for, and where each figure came from."""

    gpu_type: str  # as named by the source, or the stand-in
    memory_gib: float
    memory_source: str
    enforce: bool  # the launch refuses a run that does not fit (memory known, or the local cluster's stand-in)
    peak_flops: float  # dense peak in the run's compute precision
    peak_source: str


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
    default. The local cluster's virtual GPUs have no memory; they are planned as the stand-in GPU
    (core/gpus.py DEFAULT_GPU), and the launch check applies to them too (so a model that fits no
    such GPU is refused)."""
    local = cluster.name == LOCAL_CLUSTER
    gpu_type, type_source = cluster.gpu_type, "cluster.gpu_type"
    if gpu_type is None and query_slurm and not local:
        gpu_type, type_source = gres_gpu_type(cluster), "sinfo gres"
    stand_in, name = gpus.GPUS[gpus.DEFAULT_GPU], gpus.DEFAULT_GPU.upper()
    typed_memory = gpus.memory_gib(gpu_type) if gpu_type else None
    if cluster.gpu_memory_gb:
        memory, memory_source, enforce = float(cluster.gpu_memory_gb), "cluster.gpu_memory_gb", True
    elif typed_memory:
        memory, memory_source, enforce = typed_memory, f"{type_source} {gpu_type}", True
    elif local:
        memory, memory_source, enforce = (stand_in.memory_gib,
                                          f"default: local cluster's virtual GPUs as {name} "
                                          f"{stand_in.memory_gib:g} GiB", True)
    else:
        memory, enforce = stand_in.memory_gib, False
        memory_source = "assumed (GPU memory unknown: set cluster.gpu_memory_gb)"
    peak = gpus.peak_flops(gpu_type, precision) if gpu_type else None
    if peak:
        peak_source = f"{type_source} {gpu_type}, {precision}"
    else:
        peak = stand_in.peak(precision)
        peak_source = (f"default: local cluster's virtual GPUs as {name}, {precision}" if local
                       else f"assumed {name} {precision} (GPU type unknown: set cluster.gpu_type)")
    return TargetGpu(gpu_type=gpu_type or (f"{gpus.DEFAULT_GPU} (stand-in)" if local else "unknown"), memory_gib=memory,
                    memory_source=memory_source, enforce=enforce, peak_flops=peak, peak_source=peak_source)
