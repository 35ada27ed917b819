"""The typed shape of a run's configuration.

Hydra composes YAML from ``conf/`` on top of these dataclasses, so a misspelled
key or a value of the wrong type is an error at composition time instead of a
silently ignored setting. The resolved config is written to the run directory
as ``config.yaml``; the training task (``launcher/train/``) reads it back into the same
dataclasses with :func:`load_run_config`. This module must stay free of torch.
"""
from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import MISSING, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launcher.core.damage import DamagedRun, read_yaml_mapping
from launcher.core.rundir import DEFAULT_ROOT

# The choices of the parallelism settings: validated at composition (launcher/compose/validate.py), searched by
# the planner's suggestions (ordered from least to most memory saved), applied by launcher/train/parallel.py.
SHARDINGS = ("full", "hybrid", "grad_op")
CHECKPOINTING = ("none", "selective", "full")
PRECISIONS = ("auto", "bf16", "fp32")
# Where a run's curves go besides metrics.jsonl (launcher/train/tracking.py), and the package each tracker needs.
TRACKER_PACKAGES = {"none": None, "tensorboard": "tensorboard", "wandb": "wandb"}
WANDB_MODES = ("offline", "online")
# What a search samples with (launcher/search/): none is a single run or a grid sweep; and which way it steers.
SEARCH_BACKENDS = ("none", "optuna")
DIRECTIONS = ("minimize", "maximize")
PRUNERS = ("none", "median")


def tracker_missing(backend: str) -> Optional[str]:
    """Why ``tracking.backend`` cannot work in this Python (its package is not installed), or None. The
    launcher refuses such a launch with this line; a task that meets it anyway fails with it."""
    package = TRACKER_PACKAGES.get(backend)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return (f"tracking={backend} needs the {package} package, which this Python ({sys.executable}) lacks: "
            "pip install 'slurm-gpt-launcher[tracking]' (or choose tracking=none)")


def compute_precision(precision: str, cuda: bool) -> str:
    """The dtype a run computes in: ``bf16`` (parameters gathered in bf16, gradients reduced in fp32) when asked
    for, and by default (``auto``) on CUDA; ``fp32`` otherwise, so ``auto`` on CPU, where bf16 matmuls are slow,
    stays fp32 while ``bf16`` on CPU trains the GPU's mixed-precision path (tests/cluster/training). Training
    applies it (launcher/train/parallel.py); the planner sizes GPUs (cuda) and the local cluster's CPU ranks with it."""
    return "bf16" if precision == "bf16" or (cuda and precision == "auto") else "fp32"


def checkpointed(level: str, block: int) -> bool:
    """Whether block ``block`` (0-based) is wrapped for activation checkpointing at ``level``: every block
    (full), those with an even index (selective), none. Training wraps them (launcher/train/parallel.py); the
    planner counts them."""
    return level == "full" or (level == "selective" and block % 2 == 0)


@dataclass
class ModelConfig:
    """A decoder-only GPT's shape (MPT shapes for the public sizes)."""

    name: str = MISSING
    d_model: int = MISSING
    n_heads: int = MISSING
    n_layers: int = MISSING
    seq_len: int = 2048
    vocab_size: int = 50304
    mlp_ratio: int = 4


@dataclass
class LayoutConfig:
    """How many GPUs (tasks) and how they are spread over nodes.

    ``nodes`` is normally derived as ``gpus / cluster.gpus_per_node``; the small
    presets set it to spread a few GPUs over several nodes.
    """

    gpus: int = 8
    nodes: Optional[int] = None


@dataclass
class ParallelConfig:
    """How parallelism is applied to the plain model (launcher/train/parallel.py).

    sharding: ``full`` (params, grads, optimizer sharded over the world),
    ``hybrid`` (sharded inside a node, replicated across nodes) or ``grad_op``
    (params kept gathered after forward; grads and optimizer state sharded).
    activation_checkpointing: ``none``, ``selective`` (every other block) or ``full``.
    precision: ``auto`` (bf16 params + fp32 reduce on CUDA, fp32 on CPU), ``bf16`` (on CPU too) or ``fp32``.
    """

    sharding: str = "full"
    activation_checkpointing: str = "none"
    compile: bool = False
    precision: str = "auto"


@dataclass
class TrainConfig:
    """The optimisation loop. ``global_batch`` is in sequences per optimizer step;
    when null it is ``batch_per_gpu * gpus`` (weak scaling across GPU counts)."""

    steps: int = 100
    global_batch: Optional[int] = None
    batch_per_gpu: int = 2
    micro_batch: Any = 2  # an int, or "auto" (halve on CUDA OOM)
    lr: float = 3.0e-4
    min_lr_ratio: float = 0.1
    warmup_steps: int = 10
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    seed: int = 1234
    log_every: int = 10
    eval_every: int = 50
    eval_batches: int = 2  # global batches of val windows spread over the val split (train/data.py eval_windows;
    # the first ones of a streamed dataset's)
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    # Every export_every steps (a multiple of checkpoint_every; 0: never), and at the end with export_final, the
    # checkpoint just saved is also written as a Hugging Face model in RUN/hf/step_N, by a process of its own on
    # the main rank's node while training goes on (launcher/train/hf_export.py).
    export_every: int = 0
    export_final: bool = False
    # A step (or a save/eval phase) that has not ended after this long is a hang: the attempt ends with the
    # frozen ranks named (launcher/train/watchdog.py). Null: derived from the measured step time, at least 300 s.
    stall_timeout_s: Optional[float] = None
    # Every rank's own preflight checks (device, disk) must be done within this; a node whose ranks are not is
    # named and left out of the retry (launcher/train/preflight.py).
    preflight_timeout_s: float = 300.0


@dataclass
class StoreConfig:
    """An S3-compatible object store (launcher/core/store.py): null values are botocore's own resolution on the
    login node at launch (``AWS_ENDPOINT_URL``, ``AWS_REGION``, the profile), which the launch writes here.
    ``retry_s``: how long a request is tried again before the attempt fails; ``stall_s``: a transfer that
    brings less than 1 MiB in this long is cut and tried again."""

    endpoint_url: Optional[str] = None
    region: Optional[str] = None
    addressing_style: Optional[str] = None  # auto, path or virtual
    retry_s: float = 300.0
    stall_s: float = 30.0


@dataclass
class DataConfig:
    """Token data. With ``path`` null, a byte-level corpus built from the Python
    standard library's sources is made on first use and cached in ``cache_dir``.

    ``path`` may be ``s3://BUCKET/PREFIX`` (docs/data.md): its shards are streamed into a cache on each node
    (``stream_cache_dir``, default a private folder in the node's temporary directory; at most
    ``stream_cache_gb``), read ``read_ahead`` steps ahead, in an order that visits ``stream_window`` shards at a
    time."""

    path: Optional[str] = None
    dtype: str = "uint16"
    val_fraction: float = 0.05
    cache_dir: str = "~/.cache/slurm-gpt-launcher"
    store: StoreConfig = field(default_factory=StoreConfig)
    stream_cache_dir: Optional[str] = None
    stream_cache_gb: float = 20.0
    stream_window: int = 4
    read_ahead: int = 4
    stream_connections: int = 8  # downloads at once per node


@dataclass
class TrackingConfig:
    """Curves in an experiment tracker, written by rank 0 beside metrics.jsonl (conf/tracking/*.yaml).

    backend: ``none``, ``tensorboard`` (event files in the run directory) or ``wandb``. W&B runs under
    the run's name as its id, so a requeued or retried job continues the same W&B run; ``mode`` is
    ``offline`` (files in the run directory, ``wandb sync`` later) unless the nodes reach W&B. Its API
    key is never config: ``launcher secrets create env WANDB_API_KEY``.
    """

    backend: str = "none"
    project: str = "slurm-gpt-launcher"
    entity: Optional[str] = None
    mode: str = "offline"


@dataclass
class SearchConfig:
    """A search over the values of a run's settings (conf/search/*.yaml; launcher/search/): with ``backend``
    optuna, ``launcher -m search=optuna 'train.lr=interval(1e-4, 3e-3)'`` runs ``trials`` runs, ``parallel`` at a
    time, each told the last ``metric`` of its own metrics.jsonl, toward its lowest (``direction`` minimize).
    More than ``max_failures`` failed trials (null: a quarter of ``trials``) end the search. With ``pruner``
    median, a trial whose ``metric`` at an evaluation is worse than the median of the ended trials' at that step
    stops there, PRUNED; the first ``startup_trials`` never are. ``enqueue``: points of the space tried first, in
    order (a baseline), each a mapping of parameters to values; parameters left out are drawn."""

    backend: str = "none"
    trials: int = 24
    parallel: int = 4
    metric: str = "eval_loss"
    direction: str = "minimize"
    max_failures: Optional[int] = None
    pruner: str = "none"
    startup_trials: int = 4
    enqueue: List[Dict[str, Any]] = field(default_factory=list)

    def failures_allowed(self) -> int:
        return self.trials // 4 if self.max_failures is None else self.max_failures


# The project's own Slurm cluster (slurm/, conf/cluster/local.yaml): every one of its nodes runs on this
# machine, and its "GPUs" are CPU processes.
LOCAL_CLUSTER = "local"


@dataclass
class ContainerConfig:
    """The image every task runs in (pyxis/enroot: ``srun --container-image``), and what it sees of the host."""

    image: Optional[str] = None  # a registry image (nvcr.io#nvidia/pytorch:24.05-py3) or a pre-imported .sqsh file
    name: Optional[str] = None  # pyxis --container-name: the job's attempts on a node reuse one container
    python: str = "python"  # the interpreter inside the image, with torch and this package's dependencies
    mounts: List[str] = field(default_factory=list)  # SRC[:DST[:FLAGS]]; the run root, data and secrets always
    workdir: Optional[str] = None  # the tasks' working directory inside; default: the run directory


@dataclass
class ClusterConfig:
    """Where and how the job is submitted (see conf/cluster/*.yaml)."""

    name: str = LOCAL_CLUSTER
    partition: Optional[str] = None
    account: Optional[str] = None
    qos: Optional[str] = None
    constraint: Optional[str] = None
    gpus_per_node: int = 8
    # The local cluster's GPUs are gres entries with CPU processes for ranks; a real cluster's are GPUs, and a
    # rank whose torch sees none fails preflight (launcher/train/preflight.py) instead of training on the CPU.
    virtual_gpus: bool = False
    # The GPUs' type: asked of Slurm (--gpus-per-node=TYPE:N, unless gres is set) and what a plan sizes and times a
    # run on (launcher/forecast/target.py); without it a plan forecasts no step time, tokens/s or MFU.
    gpu_type: Optional[str] = None
    gpu_memory_gb: Optional[float] = None
    cpus_per_gpu: Optional[int] = 1  # null: no --cpus-per-task (lets --overcommit pack tasks)
    mem_per_gpu: Optional[str] = None
    mem: Optional[str] = None  # --mem per node (0: all of it, with exclusive nodes); written instead of mem_per_gpu
    # The GPUs as a gres (gpu, or gpu:h100) with the count per node appended, for sites that ask for
    # --gres rather than --gpus-per-node.
    gres: Optional[str] = None
    time_limit_min: int = 60
    exclusive: bool = False
    overcommit: bool = False
    signal_delay_s: int = 120
    max_requeues: int = 3
    # Failed or stalled attempts retried from the newest good checkpoint (docs/recovery.md).
    max_retries: int = 3
    sbatch_flags: Dict[str, Any] = field(default_factory=dict)
    setup: List[str] = field(default_factory=list)
    # Variables exported to every task (NCCL_SOCKET_IFNAME, NCCL_IB_HCA, ...), over the launcher's defaults
    # (launcher/slurm/batch.py TASK_ENV); null drops a default.
    env: Dict[str, Any] = field(default_factory=dict)
    wckey: Optional[str] = None  # #SBATCH --wckey, written only when set
    # The job's squeue comment shows its progress (launcher/job/comment.py): one RPC per job a minute at most.
    progress_comment: bool = True
    srun_args: List[str] = field(default_factory=list)  # more srun options, e.g. --mpi=pmix
    # The interpreter on the cluster's hosts that runs the batch script's steps, and the tasks when there is
    # no container; null: the one that submits.
    python: Optional[str] = None
    container: ContainerConfig = field(default_factory=ContainerConfig)
    # The run's code compiled into one archive that one step per node copies to node-local storage, the ranks
    # importing it from there rather than each walking the frozen copy on the shared file system
    # (launcher/job/stage.py); never inside a container (the ranks' /dev/shm and /tmp are the container's). null:
    # where the GPUs are real, not on a cluster of virtual ones (the local cluster, whose nodes share one machine).
    stage_code: Optional[bool] = None
    # The tasks' environment (cluster.python's prefix) packed once per version and unpacked by one task per node into
    # node-local storage, every rank running its interpreter from there (launcher/job/stage_env.py); refused with a
    # container image, which is node-local already.
    stage_env: bool = False
    # The site's own object store, for data.path=s3://... (a run's data.store wins over it).
    store: StoreConfig = field(default_factory=StoreConfig)
    container_image: Optional[str] = None  # replaced by container.image; refused when set (compose/validate.py)
    slurm_conf: Optional[str] = None
    # Where this cluster's runs live (its shared scratch); a run_root= override and $LAUNCHER_RUN_ROOT win.
    run_root: Optional[str] = None
    # A cluster reached over SSH (launcher/remote/): an ~/.ssh/config alias, user@host or ssh://user@host:port.
    # Everything else in the file then means the same on the cluster's side.
    ssh: Optional[str] = None
    ssh_timeout_s: float = 5.0  # how long connecting may take before the cluster counts as unreachable
    # The clusters ``cluster=auto`` chose this one among (launcher/service/auto.py), each asked when the run would
    # start there; empty where the cluster was named. ``cluster=auto cluster.candidates=[a,b]`` names them.
    candidates: List[str] = field(default_factory=list)


@dataclass
class SweepConfig:
    """How a grid sweep (``-m``) is submitted: its runs of one resource shape go as one Slurm job array
    (launcher/submit/submitter.py)."""

    parallel: Optional[int] = None  # the most elements of one array running at once (sbatch --array=...%N); null: all


@dataclass
class RunConfig:
    """The root of every composed run."""

    model: ModelConfig = field(default_factory=ModelConfig)
    layout: LayoutConfig = field(default_factory=LayoutConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    data: DataConfig = field(default_factory=DataConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    sweep: SweepConfig = field(default_factory=SweepConfig)
    search: SearchConfig = field(default_factory=SearchConfig)
    name: Optional[str] = None
    run_root: str = f"${{oc.env:LAUNCHER_RUN_ROOT,'{DEFAULT_ROOT}'}}"
    # The run's files are its owner's alone unless this names a group to share them with (read-only):
    # launcher/core/privacy.py.
    share_group: Optional[str] = None
    dry_run: Any = False  # false, true or "json"
    force: bool = False


# The sections every config.yaml the launcher has written holds, whatever its version.
WRITTEN_SECTIONS = ("model", "layout", "parallel", "train", "data", "cluster")


def load_run_config(path: str | Path) -> RunConfig:
    """Read a resolved ``config.yaml`` back into typed dataclasses; DamagedRun when it is missing, is not a
    YAML mapping, or no longer fits the schema (a key lost, a value of the wrong type)."""
    path = Path(path)
    lacking = [key for key in WRITTEN_SECTIONS if key not in read_yaml_mapping(path.parent, path.name)]
    if lacking:  # a config cut short can still be valid YAML, whose lost sections the defaults would fill
        raise DamagedRun(path.parent, path.name, f"lacks {', '.join(lacking)} (cut short?)")
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RunConfig), OmegaConf.load(path))
        return OmegaConf.to_object(merged)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise DamagedRun(path.parent, path.name, f"does not fit the config schema ({first})") from None
