"""Will a run fit on its GPUs, how fast will it go, how well will it scale: a pre-flight estimate.

Pure arithmetic on a composed RunConfig and its Plan (no torch, no GPU): GPU memory per rank
(sharded training state, gathered FSDP units, activations, a margin), FLOPs and a predicted step
time at a stated efficiency, FSDP communication volume and its time at stated bandwidths, and,
for a run that does not fit, the changes that would make it fit. ``launcher plan`` prints it, and
the launch refuses a run that cannot fit (see :func:`check_launch`). Every formula and its source
is in docs/planning.md; the memory model follows what train/parallel.py and train/loop.py do with
FSDP2, and tests/test_planner.py checks the training-state part byte for byte against a real run.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from launcher.config import ClusterConfig, ModelConfig, RunConfig
from launcher.errors import LaunchError
from launcher.plan import Plan, flops_per_token

GIB = 2**30
GB = 1e9  # bandwidths are in GB/s (10^9 bytes), as vendors and nccl-tests quote them

# GPU memory in GiB by (a part of) the GPU type as Slurm's gres or cluster.gpu_type names it; the
# longest matching key wins. A size in the name itself ("a100-80gb", "h100_80g") wins over the table.
GPU_MEMORY_GIB: Dict[str, float] = {
    "h200": 141, "gh200": 96, "h100nvl": 94, "h100": 80, "h800": 80, "b200": 180, "b100": 180,
    "a100": 40, "a800": 80, "l40s": 48, "l40": 48, "a40": 48, "a6000": 48, "a10": 24, "l4": 24,
    "v100": 32, "t4": 16,
}  # fmt: skip
# Dense bf16 peak FLOP/s (no sparsity) by the same names; MFU is quoted against these.
PEAK_BF16_FLOPS: Dict[str, float] = {
    "h200": 989e12, "gh200": 989e12, "h100": 989e12, "h800": 989e12, "b200": 2250e12, "a100": 312e12,
    "a800": 312e12, "l40s": 362e12,
}  # fmt: skip
DEFAULT_GPU = "h100"  # the stand-in where the GPU is not known (the local cluster's virtual GPUs)
DEFAULT_GPU_MEMORY_GIB = 80.0

CHECKPOINT_LEVELS = ("none", "selective", "full")
SHARDINGS = ("full", "hybrid", "grad_op")
MAX_GPUS = 4096  # how far the suggestions look for a GPU count that fits


@dataclass(frozen=True)
class Assumptions:
    """The knobs of the estimate (``launcher plan --mfu ... --intra-gbps ... --inter-gbps ...``)."""

    mfu: float = 0.45  # fraction of the dense bf16 peak sustained on the FLOPs actually executed
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
class Hardware:
    """The GPU a run is planned for, and where each figure came from."""

    gpu_type: str  # as named by the source, or the stand-in
    memory_gib: float
    memory_source: str
    enforce: bool  # the launch refuses a run that does not fit (memory known, or the local cluster's stand-in)
    peak_flops: float
    peak_source: str


# ----------------------------------------------------------------------------------------------
# The GPU: memory and peak FLOP/s


def _normalise(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _lookup(name: str, table: Dict[str, float]) -> Optional[float]:
    key = _normalise(name)
    hits = [k for k in table if k in key]
    return table[max(hits, key=len)] if hits else None


def memory_for_type(name: str) -> Optional[float]:
    """GiB of a GPU type name: a size written in it (``a100-80gb``), else the table."""
    sized = re.search(r"(\d{2,3})g(b|ib)?(?![a-z0-9])", name.lower().replace("_", "-"))
    if sized and int(sized.group(1)) >= 8:
        return float(sized.group(1))
    return _lookup(name, GPU_MEMORY_GIB)


_GRES_CACHE: Dict[Tuple[str, Optional[str], Optional[str]], Optional[str]] = {}


def gres_gpu_type(cluster: ClusterConfig) -> Optional[str]:
    """The GPU type in the gres of the cluster's partition (``gpu:h100:8`` -> ``h100``), via sinfo;
    None if the gres names no type or Slurm does not answer within a few seconds."""
    key = (cluster.name, cluster.partition, cluster.slurm_conf)
    if key not in _GRES_CACHE:
        from launcher import slurm

        found = None
        try:
            slurm.use_cluster(cluster.name, cluster.slurm_conf)
            args = ["sinfo", "-h", "-o", "%P|%G"] + (["-p", cluster.partition] if cluster.partition else [])
            for line in slurm.run(args, timeout=5).splitlines():
                name, _, gres = line.partition("|")
                if cluster.partition is None and not name.endswith("*"):
                    continue  # the default partition
                for item in gres.split(","):
                    parts = item.split("(")[0].split(":")
                    if parts[0] == "gpu" and len(parts) == 3:
                        found = parts[1]
                        break
                if found:
                    break
        except (slurm.SlurmError, ValueError, OSError):
            found = None
        _GRES_CACHE[key] = found
    return _GRES_CACHE[key]


def hardware_for(cluster: ClusterConfig, query_slurm: bool = False) -> Hardware:
    """The GPU of ``cluster``: memory from ``cluster.gpu_memory_gb``, else from the GPU type
    (``cluster.gpu_type``, else the partition's gres type when ``query_slurm``), else a stated
    default. The local cluster's virtual GPUs have no memory; they are planned as an H100 80 GiB,
    and the launch check applies to them too (so a model that fits no 80 GiB GPU is refused)."""
    local = cluster.name == "local"
    gpu_type, type_source = cluster.gpu_type, "cluster.gpu_type"
    if gpu_type is None and query_slurm and not local:
        gpu_type, type_source = gres_gpu_type(cluster), "sinfo gres"
    if cluster.gpu_memory_gb:
        memory, memory_source, enforce = float(cluster.gpu_memory_gb), "cluster.gpu_memory_gb", True
    elif gpu_type and memory_for_type(gpu_type):
        memory, memory_source, enforce = memory_for_type(gpu_type), f"{type_source} {gpu_type}", True  # type: ignore
    elif local:
        memory, memory_source, enforce = DEFAULT_GPU_MEMORY_GIB, "default: local cluster's virtual GPUs as H100 80 GiB", True
    else:
        memory, memory_source, enforce = DEFAULT_GPU_MEMORY_GIB, "assumed (GPU memory unknown: set cluster.gpu_memory_gb)", False
    peak = _lookup(gpu_type, PEAK_BF16_FLOPS) if gpu_type else None
    if peak:
        peak_source = f"{type_source} {gpu_type}"
    else:
        peak = PEAK_BF16_FLOPS[DEFAULT_GPU]
        peak_source = "assumed H100 (GPU type unknown: set cluster.gpu_type)"
        if local:
            peak_source = "default: local cluster's virtual GPUs as H100"
    return Hardware(gpu_type=gpu_type or ("h100 (stand-in)" if local else "unknown"), memory_gib=memory,
                    memory_source=memory_source, enforce=enforce, peak_flops=peak, peak_source=peak_source)


# ----------------------------------------------------------------------------------------------
# The model's tensors and how FSDP2 shards them


def param_shapes(model: ModelConfig) -> Tuple[List[Tuple[int, ...]], List[Tuple[int, ...]]]:
    """(root, one block) parameter shapes of train/model.py's GPT. The root FSDP unit holds the
    tied token embedding, the learned positions and the final LayerNorm; each block is a unit."""
    d, r = model.d_model, model.mlp_ratio
    root = [(model.vocab_size, d), (model.seq_len, d), (d,)]
    block = [(d,), (3 * d, d), (d, d), (d,), (r * d, d), (d, r * d)]  # ln1, qkv, proj, ln2, fc, proj
    return root, block


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def shard_numel(shape: Sequence[int], shards: int, index: int = 0) -> int:
    """Elements of shard ``index`` of ``shards`` as FSDP2 cuts a tensor: ``torch.chunk`` on dim 0
    (chunks of ceil(rows/shards) rows, the last ones shorter or empty)."""
    rows = shape[0]
    chunk = -(-rows // shards)
    return max(0, min(chunk, rows - index * chunk)) * _numel(shape[1:])


def local_param_numel(model: ModelConfig, shards: int, index: int = 0) -> int:
    """Parameter elements on shard ``index`` (rank 0's shard is the largest)."""
    root, block = param_shapes(model)
    return sum(shard_numel(s, shards, index) for s in root) + model.n_layers * sum(
        shard_numel(s, shards, index) for s in block)


def shard_group(plan: Plan, sharding: str) -> int:
    """Ranks that one parameter is sharded over: the world, or one node's ranks for hybrid."""
    return plan.tasks_per_node if sharding == "hybrid" else plan.world_size


def precision_of(cfg: RunConfig) -> str:
    """The precision on a GPU: ``auto`` is bf16 there (train/parallel.py)."""
    return "fp32" if cfg.parallel.precision == "fp32" else "bf16"


def checkpointed_blocks(n_layers: int, level: str) -> int:
    """Blocks wrapped by checkpoint_wrapper: all (full), those with an even index (selective), none."""
    return {"none": 0, "selective": (n_layers + 1) // 2, "full": n_layers}[level]


# ----------------------------------------------------------------------------------------------
# Memory


def activation_components(model: ModelConfig, micro_batch: int, level: str, precision: str) -> Dict[str, int]:
    """Activation bytes of one micro-batch on one GPU, by part (docs/planning.md, "Activations").

    Korthikanti et al. 2022 count s*b*h*(34 + 5*a*s/h) bytes per layer in 16-bit. This model has
    no dropout (no masks: -2*s*b*h - a*s^2*b) and attention runs in SDPA (flash), which keeps a
    fp32 log-sum-exp (4*a*s*b) instead of the scores and softmax (-4*a*s^2*b), and whose output
    is the output projection's input (no copy). That leaves s*b*h*(8 + 2r) values per layer
    (32*s*b*h bytes at r = 4 in 16-bit: norm inputs and outputs 4, q k v 3, attention output 1,
    MLP hidden before and after GELU 2r), plus the log-sum-exp and 16*s*b bytes of LayerNorm
    statistics. A checkpointed block keeps only its input, and one block's activations are
    rebuilt at a time in backward. The loss keeps fp32 log-probabilities (4*s*b*V, Korthikanti
    §4.1) and, in its backward, their gradient and the input's (8*s*b*V more).
    """
    s, h, a, r, n_layers, vocab = (model.seq_len, model.d_model, model.n_heads, model.mlp_ratio, model.n_layers,
                                   model.vocab_size)
    act = 2 if precision == "bf16" else 4
    tokens = s * micro_batch
    layer = tokens * h * (8 + 2 * r) * act + 4 * a * tokens + 16 * tokens
    kept = checkpointed_blocks(n_layers, level)
    return {
        "layers": (n_layers - kept) * layer + kept * tokens * h * act,
        "recompute": layer if kept else 0,
        "final_norm": 2 * tokens * h * act + 8 * tokens,
        "loss_saved": 4 * tokens * vocab,
        "loss_transient": 8 * tokens * vocab,
    }


def activation_bytes(model: ModelConfig, micro_batch: int, level: str, precision: str) -> int:
    return sum(activation_components(model, micro_batch, level, precision).values())


@dataclass(frozen=True)
class Memory:
    """Bytes per GPU at the peak (the start of backward), by part; ``total`` includes the margin."""

    params: int  # fp32 parameter shards (FSDP2 keeps the original dtype; bf16 is cast for the all-gather)
    grads: int  # fp32 gradient shards
    optimizer: int  # AdamW exp_avg + exp_avg_sq (fp32 shards) + one fp32 step count per tensor
    gathered: int  # all-gathered units in the compute dtype (transient)
    grad_buffers: int  # unsharded gradients before their reduce-scatter (transient, within one micro-batch)
    activations: int
    margin: int
    total: int
    capacity: int

    @property
    def states(self) -> int:
        return self.params + self.grads + self.optimizer

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


def memory(cfg: RunConfig, plan: Plan, hw: Hardware, opts: Assumptions, micro_batch: Optional[int] = None) -> Memory:
    """Peak memory per GPU of ``cfg`` laid out as ``plan`` (optionally at another micro-batch).

    grad_accum does not enter: every micro-batch's gradients are reduce-scattered into the
    sharded fp32 gradients (train/loop.py), so nothing unsharded outlives a micro-batch."""
    model, sharding = cfg.model, cfg.parallel.sharding
    micro_batch = micro_batch or plan.micro_batch
    precision = precision_of(cfg)
    compute_bytes = 2 if precision == "bf16" else 4
    root, block = param_shapes(model)
    root_numel, block_numel = sum(map(_numel, root)), sum(map(_numel, block))
    total_numel = root_numel + model.n_layers * block_numel
    local = local_param_numel(model, shard_group(plan, sharding))
    tensors = len(root) + model.n_layers * len(block)
    if sharding == "grad_op":  # reshard_after_forward=False: every unit stays gathered until its backward
        gathered = compute_bytes * total_numel
    else:  # the root (embedding, used again by the head) for the whole pass, a block and the prefetched next
        gathered = compute_bytes * (root_numel + 2 * block_numel)
    # The root's gradient (tied embedding, produced first in backward by the head) lives through backward;
    # a block's unsharded gradient and its fp32 reduce-scatter input exist while it is reduced.
    grad_buffers = compute_bytes * root_numel + (compute_bytes + 4) * block_numel
    activations = activation_bytes(model, micro_batch, cfg.parallel.activation_checkpointing, precision)
    need = 4 * local + 4 * local + 8 * local + 4 * tensors + gathered + grad_buffers + activations
    margin = int(opts.margin * need + opts.overhead_gib * GIB)
    return Memory(params=4 * local, grads=4 * local, optimizer=8 * local + 4 * tensors, gathered=gathered,
                  grad_buffers=grad_buffers, activations=activations, margin=margin,
                  total=need + margin, capacity=int(hw.memory_gib * GIB))


def per_rank_batch(plan: Plan) -> int:
    return plan.micro_batch * plan.grad_accum


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def max_micro_batch(cfg: RunConfig, plan: Plan, hw: Hardware, opts: Assumptions) -> int:
    """The largest micro-batch dividing the per-GPU batch that fits; 0 if none does (memory grows
    with the micro-batch and not with grad_accum, so if micro-batch 1 does not fit, nothing does)."""
    fitting = [m for m in divisors(per_rank_batch(plan)) if memory(cfg, plan, hw, opts, m).fits]
    return max(fitting, default=0)


def micro_batch_limit(cfg: RunConfig, plan: Plan, hw: Hardware, opts: Assumptions) -> int:
    """The largest micro-batch memory allows, whatever the batch size (0: none)."""
    one = memory(cfg, plan, hw, opts, 1)
    per_sample = activation_bytes(cfg.model, 1, cfg.parallel.activation_checkpointing, precision_of(cfg))
    fixed = one.total - one.margin - per_sample
    usable = (one.capacity - opts.overhead_gib * GIB) / (1 + opts.margin)
    return max(0, int((usable - fixed) // per_sample))


# ----------------------------------------------------------------------------------------------
# FLOPs, time, communication


@dataclass(frozen=True)
class Timing:
    model_flops: float  # per step, all GPUs: flops_per_token * tokens_per_step
    hardware_flops: float  # plus the forward of checkpointed blocks run again in backward
    compute_s: float  # per step, at opts.mfu of the peak on the hardware FLOPs
    allgather_bytes: float  # per GPU per step, received
    reduce_scatter_bytes: float
    allreduce_bytes: float  # hybrid: the shard's all-reduce across nodes
    comm_s: float
    exposed_comm_s: float  # not overlapped with compute
    step_s: float
    tokens_per_s_per_gpu: float
    mfu: float  # predicted model FLOPs utilisation, communication included

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


def timing(cfg: RunConfig, plan: Plan, hw: Hardware, opts: Assumptions) -> Timing:
    model, sharding = cfg.model, cfg.parallel.sharding
    tokens = plan.tokens_per_step
    model_flops = float(flops_per_token(model)) * tokens
    # A block's forward per token: 2 FLOPs per weight plus 4*s*d for QK^T and AV (a third of 6N + 12LdT).
    _, block = param_shapes(model)
    block_forward = 2 * sum(map(_numel, block)) + 4 * model.seq_len * model.d_model
    recompute = checkpointed_blocks(model.n_layers, cfg.parallel.activation_checkpointing) * block_forward * tokens
    hardware_flops = model_flops + recompute
    compute_s = hardware_flops / plan.world_size / (opts.mfu * hw.peak_flops)

    compute_bytes = 2 if precision_of(cfg) == "bf16" else 4
    root, _ = param_shapes(model)
    root_numel = sum(map(_numel, root))
    block_numel = sum(map(_numel, block))
    total_numel = root_numel + model.n_layers * block_numel
    n = shard_group(plan, sharding)
    nodes_in_group = 1 if sharding == "hybrid" else plan.nodes
    gathers = 1 if sharding == "grad_op" else 2  # per micro-batch: forward, and again in backward
    # Per step: grad_accum micro-batches, each gathering every unit `gathers` times in the compute dtype
    # and reduce-scattering every gradient in fp32 (reduce_dtype) into the shards (train/loop.py).
    ag_size = plan.grad_accum * gathers * compute_bytes * total_numel
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
    step_s = exposed + max(compute_s, comm_s - exposed)
    per_gpu = tokens / plan.world_size / step_s
    return Timing(model_flops=model_flops, hardware_flops=hardware_flops, compute_s=compute_s,
                  allgather_bytes=allgather_bytes, reduce_scatter_bytes=reduce_scatter_bytes,
                  allreduce_bytes=allreduce_bytes, comm_s=comm_s, exposed_comm_s=exposed, step_s=step_s,
                  tokens_per_s_per_gpu=per_gpu, mfu=model_flops / plan.world_size / step_s / hw.peak_flops)


# ----------------------------------------------------------------------------------------------
# Suggestions


def _with(cfg: RunConfig, **changes: Any) -> RunConfig:
    """A copy of ``cfg`` with dotted keys changed (``parallel.sharding="full"``)."""
    sections: Dict[str, Dict[str, Any]] = {}
    for key, value in changes.items():
        section, name = key.split("__")
        sections.setdefault(section, {})[name] = value
    return dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s), **v) for s, v in sections.items()})


def _fits(cfg: RunConfig, hw: Hardware, opts: Assumptions) -> Optional[Tuple[Plan, Memory]]:
    try:
        plan = Plan.from_config(cfg)
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
    from omegaconf import OmegaConf

    from launcher.catalog import CONF_DIR

    path = CONF_DIR / "gpus" / f"{count}.yaml"
    return OmegaConf.select(OmegaConf.load(path), "layout.nodes") if path.is_file() else None


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


def suggestions(cfg: RunConfig, plan: Plan, hw: Hardware, opts: Assumptions) -> List[Suggestion]:
    """Concrete overrides that make a run fit, each checked with the same model: a micro-batch,
    activation checkpointing, full sharding, more GPUs, and if no single change is enough, the
    fewest GPUs at which a combination fits."""
    out: List[Suggestion] = []

    def gib(mem: Memory) -> float:
        return mem.total / GIB

    per_rank = per_rank_batch(plan)
    best = max_micro_batch(cfg, plan, hw, opts)
    if best and best != plan.micro_batch:
        mem = memory(cfg, plan, hw, opts, best)
        out.append(Suggestion([f"train.micro_batch={best}"], gib(mem), f"grad_accum {per_rank // best}"))
    level = cfg.parallel.activation_checkpointing
    for higher in CHECKPOINT_LEVELS[CHECKPOINT_LEVELS.index(level) + 1:]:
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


def _combined(cfg: RunConfig, plan: Plan, hw: Hardware, opts: Assumptions, counts: List[int]) -> List[Suggestion]:
    """The fewest GPUs at which full sharding, some checkpointing and some micro-batch fit, with the
    least checkpointing and the largest micro-batch there."""
    level = cfg.parallel.activation_checkpointing
    levels = CHECKPOINT_LEVELS[CHECKPOINT_LEVELS.index(level):]

    def variants(count: int):
        for ckpt in levels:
            for sharding in dict.fromkeys([cfg.parallel.sharding, "full"]):
                nodes = cfg.layout.nodes if count == plan.gpus else preset_nodes(count)
                trial = _with(cfg, layout__gpus=count, layout__nodes=nodes,
                              parallel__sharding=sharding, parallel__activation_checkpointing=ckpt)
                try:
                    trial_plan = Plan.from_config(trial)
                except LaunchError:
                    continue
                per_rank = per_rank_batch(trial_plan)
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


# ----------------------------------------------------------------------------------------------
# The whole estimate


@dataclass
class Estimate:
    """Everything ``launcher plan`` shows about one run (``--json`` is :meth:`to_dict`)."""

    cfg: RunConfig
    plan: Plan
    hardware: Hardware
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

    @property
    def fits(self) -> bool:
        """Fits as configured; with ``train.micro_batch=auto``, at a micro-batch its halving reaches."""
        if self.memory.fits or self.cfg.train.micro_batch != "auto":
            return self.memory.fits
        per_rank, micro = per_rank_batch(self.plan), self.plan.micro_batch
        while micro > 1:  # train/loop.py Batching.halve: the largest divisor at most half as large
            micro = max(m for m in range(1, micro // 2 + 1) if per_rank % m == 0)
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
                    "enforced_at_launch": hw.enforce, "peak_flops": hw.peak_flops, "peak_source": hw.peak_source},
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
        }


def estimate(cfg: RunConfig, plan: Plan, hw: Hardware, opts: Assumptions = Assumptions(),
             overrides: Sequence[str] = ()) -> Estimate:
    precision = precision_of(cfg)
    est = Estimate(
        cfg=cfg, plan=plan, hardware=hw, assumptions=opts, precision=precision,
        memory=memory(cfg, plan, hw, opts),
        activations_by_level={level: activation_bytes(cfg.model, plan.micro_batch, level, precision)
                              for level in CHECKPOINT_LEVELS},
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
    whose other overrides are the same (gpus=8,16,128 compares 8 -> 16 -> 128, presets' sharding included)."""
    groups: Dict[Tuple[str, ...], List[Estimate]] = {}
    for est in estimates:
        key = tuple(o for o in est.overrides if o.split("=", 1)[0].lstrip("+~") not in _SCALING_KEYS)
        groups.setdefault(key, []).append(est)
    for group in groups.values():
        base = min(group, key=lambda e: e.plan.gpus)
        for est in group:
            est.scaling_efficiency = est.timing.tokens_per_s_per_gpu / base.timing.tokens_per_s_per_gpu


# ----------------------------------------------------------------------------------------------
# The launch check


def refusal(est: Estimate, overrides: Sequence[str] = ()) -> str:
    """The one-line reason a launch is refused, with the changes that would fit."""
    fixes = "; or ".join(str(s) for s in est.suggestions) or f"no change found up to {MAX_GPUS} GPUs"
    command = " ".join(["launcher plan", *(o for o in overrides if o.split("=", 1)[0] not in ("dry_run", "force"))])
    return f"{est.summary()}; to fit: {fixes}; or add force=true to launch anyway (details: '{command}')"


def check_launch(runs: Sequence[Any], dry_run: bool) -> List[str]:
    """Refuse (LaunchError) before anything is submitted if a run cannot fit its GPUs' memory.

    Checked only where the memory is known (cluster.gpu_memory_gb, the GPU type, or the local
    cluster's documented stand-in). A run with ``force=true`` passes with a warning; in a dry run
    nothing is refused, and the warnings say what a launch would do. Returns the warnings (the
    caller prints them to stderr).
    """
    warnings, refused = [], []
    for run in runs:
        cfg = run.config
        hw = hardware_for(cfg.cluster, query_slurm=not dry_run)
        if not hw.enforce:
            continue
        est = estimate(cfg, run.plan, hw)
        if est.fits:
            continue
        label = f"[{' '.join(run.overrides)}] " if len(runs) > 1 else ""
        if cfg.force:
            warnings.append(f"{label}{est.summary()}; force=true: " + ("a launch would go ahead" if dry_run
                                                                       else "launching anyway"))
        elif dry_run:
            warnings.append(f"{label}{est.summary()}; a launch would be refused (force=true overrides)")
        else:
            refused.append(label + refusal(est, run.overrides))
    if refused:
        more = f" ({len(refused)} of {len(runs)} runs do not fit; nothing was submitted)" if len(runs) > 1 else ""
        raise LaunchError(refused[0] + more)
    return warnings
