"""Distributed bring-up from the environment, and a check that the group works.

Every rank is started by Slurm (through submitit) or by torchrun / a test; both
describe the process in environment variables, and this module turns them into a
process group and a :class:`DistEnv`. A job whose ranks cannot talk to each other
should fail in the first seconds with a message naming the node and port, not
hang in the first all-gather, hence :func:`check_allreduce`.
"""
from __future__ import annotations

import datetime
import logging
import os
import socket
import zlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from submitit.slurm.slurm import SlurmJobEnvironment

from launcher.train import host_sync

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0
PORT_BASE, PORT_COUNT = 20000, 12768  # rendezvous ports 20000-32767


@dataclass(frozen=True)
class DistEnv:
    """Where this process sits in the job."""

    rank: int
    local_rank: int
    world_size: int
    nodes: int
    node: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


@dataclass(frozen=True)
class _Launch:
    """What the launcher told this process, before any process group exists."""

    rank: int
    local_rank: int
    world_size: int
    nodes: int
    node: str
    master_host: str  # a host name or address, resolved at rendezvous
    master_port: int


def global_rank_from_environ() -> int:
    """This process's global rank, readable before bring-up (e.g. to name its log file)."""
    if _torchrun_vars_set():
        return int(os.environ["RANK"])
    return int(os.environ.get("SLURM_PROCID", 0))


def init_distributed(timeout_s: float = DEFAULT_TIMEOUT_S) -> DistEnv:
    """Join the job's process group (NCCL on CUDA, gloo on CPU) and pick this rank's device.

    Explicit torchrun-style variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
    MASTER_PORT) win over Slurm's, because ``torchrun`` inside an sbatch script
    inherits SLURM_PROCID=0 in every process it starts. Without either, the
    process is a world of one (rank 0 on a free local port).
    """
    launch = _launch_from_environ()
    threads = cpu_threads(launch.world_size // launch.nodes)
    if threads is not None:
        torch.set_num_threads(threads)
    if torch.cuda.is_available():
        # Slurm's GPU binding may leave each task a single visible GPU.
        device = torch.device("cuda", launch.local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device = torch.device("cpu")
        backend = "gloo"
    address = _resolve(launch.master_host)
    try:
        dist.init_process_group(backend, init_method=f"tcp://{address}:{launch.master_port}",
                                rank=launch.rank, world_size=launch.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    except Exception as e:
        raise RuntimeError(
            f"rank {launch.rank}/{launch.world_size} on {launch.node}: rendezvous with rank 0 at "
            f"{launch.master_host} ({address}) port {launch.master_port} failed after at most {timeout_s:.0f} s: {e}"
        ) from e
    return DistEnv(rank=launch.rank, local_rank=launch.local_rank, world_size=launch.world_size,
                   nodes=launch.nodes, node=launch.node, device=device)


def cpu_threads(ranks_on_node: int) -> int | None:
    """How many threads this rank's CPU operators may use: the CPUs Slurm gave the task, not the node's.

    torch's default is every core it can see, and without CPU binding (``TaskPlugin=task/none``, common)
    each rank sees the whole node: 8 ranks of 8 threads each on 8 cores, whose OpenMP threads spin
    between operators and starve each other (two ranks of two threads on two cores take 5x the CPU of
    one thread each). torchrun sets ``OMP_NUM_THREADS=1`` for the same reason. Slurm's
    ``SLURM_CPUS_PER_TASK`` (``cluster.cpus_per_gpu``) is the task's share; without it, the CPUs this
    process may run on, shared by the node's ranks unless binding already narrowed them. ``None`` when
    ``OMP_NUM_THREADS`` is set: the user or the site chose.
    """
    if "OMP_NUM_THREADS" in os.environ:
        return None
    visible = len(os.sched_getaffinity(0))
    if os.environ.get("SLURM_CPUS_PER_TASK", "").isdigit():
        return max(1, min(visible, int(os.environ["SLURM_CPUS_PER_TASK"])))
    bound = visible < (os.cpu_count() or visible)
    return visible if bound else max(1, visible // max(1, ranks_on_node))


def global_mean(value: torch.Tensor, env: DistEnv) -> float:
    """The mean of a scalar over all ranks (gloo has no AVG, hence SUM / world)."""
    total = value.detach().clone().reshape(1)
    dist.all_reduce(total)
    return host_sync.read(total)[0] / env.world_size


def check_allreduce(env: DistEnv) -> int:
    """All-reduce rank+1 over the world and insist on the known sum, world*(world+1)/2.

    Logs one line per rank (rank, local rank, node, device, result) so that a
    misbehaving node is named in the logs. Returns the sum.
    """
    value = torch.tensor([env.rank + 1], dtype=torch.int64, device=env.device)
    dist.all_reduce(value)
    got, expected = int(value.item()), env.world_size * (env.world_size + 1) // 2
    status = "ok" if got == expected else f"WRONG (expected {expected})"
    log.info("rank %d/%d local %d node %s device %s threads %d allreduce %d %s",
             env.rank, env.world_size, env.local_rank, env.node, env.device, torch.get_num_threads(), got, status)
    if got != expected:
        raise RuntimeError(f"all-reduce check failed on rank {env.rank} ({env.node}): got {got}, expected {expected}")
    return got


def _torchrun_vars_set() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def _launch_from_environ() -> _Launch:
    env = os.environ
    node = env.get("SLURMD_NODENAME") or socket.gethostname()
    if _torchrun_vars_set():
        world = int(env["WORLD_SIZE"])
        local_world = int(env.get("LOCAL_WORLD_SIZE", world))
        return _Launch(rank=int(env["RANK"]), local_rank=int(env.get("LOCAL_RANK", 0)), world_size=world,
                       nodes=max(1, world // local_world), node=node,
                       master_host=env.get("MASTER_ADDR", "127.0.0.1"),
                       master_port=int(env.get("MASTER_PORT", 29500)))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        job = SlurmJobEnvironment()  # submitit's reading of Slurm's variables; rank 0 runs on the first node
        port = int(env["MASTER_PORT"]) if "MASTER_PORT" in env else \
            _port_for_job(env.get("SLURM_CLUSTER_NAME", ""), int(job.job_id))
        return _Launch(rank=job.global_rank, local_rank=job.local_rank, world_size=job.num_tasks,
                       nodes=job.num_nodes, node=node, master_host=job.hostnames[0], master_port=port)
    return _Launch(rank=0, local_rank=0, world_size=1, nodes=1, node=node, master_host="127.0.0.1",
                   master_port=_free_port())


def _port_for_job(cluster: str, job_id: int) -> int:
    """A port that two jobs sharing a node are unlikely to both pick. Jobs of two clusters can share a host
    (the local clusters do) and have the same id, so the cluster's name counts too. The range stays below
    Linux's ephemeral ports (32768 and up), which gloo's own connections take from."""
    return PORT_BASE + (zlib.crc32(cluster.encode()) + job_id) % PORT_COUNT


def _resolve(host: str) -> str:
    try:
        return socket.gethostbyname(host)
    except OSError as e:
        raise RuntimeError(f"cannot resolve the rendezvous host {host!r} (rank 0's node): {e}") from e


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
