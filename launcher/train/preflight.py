"""Before training: each rank checks its node, and the ranks check their group, so a sick node is found in
seconds and left out of the next attempt instead of failing or slowing the run later.

- the device computes: a matmul of known integers against its exact answer (on CUDA, also free memory);
- the network carries: an all-reduce whose time gives each rank's bus bandwidth; a rank far slower than
  the median is flagged (recorded, not failed: a slow link still trains);
- the run directory takes a checkpoint: writable, with room for the next one (its size by
  launcher/core/checkpoints.py, the rule ``launcher plan`` warns with). A run directory that is full (no room, or
  ENOSPC/EDQUOT) is the file system's fault, not the node's: every rank raises :class:`DiskFull`, which
  launcher/job/recovery.py retries at most once, when there is room again, and never by leaving a node out.

Rank 0 records one ``preflight`` event summarising the bandwidths (the median, the slowest ranks and the flagged
ones, with their nodes: a record that stays small at 16,384 ranks, since every status command reads it) and
writes every rank's figure to ``preflight/<job>.json``. A rank whose node fails records a
``preflight_failed`` event naming the node and the check; every rank then raises :class:`NodeUnfit`,
and launcher/job/recovery.py retries the run on other nodes without that node.

Then the data (:func:`verify_data`): the checks the launch made (launcher/core/dataset.py), made again because
the files may have changed while the job waited or between attempts, the ranks sharing the checksums. A bad
file is the data's fault, not a node's: every rank raises the DatasetError that names it, which is not retried.
"""
from __future__ import annotations

import datetime
import logging
import os
import shutil
import statistics
import time
from pathlib import Path
from typing import Optional

import torch
import torch.distributed as dist

from launcher.core.checkpoints import checkpoint_bytes, human
from launcher.core.config import ModelConfig, RunConfig
from launcher.core.dataset import READ_METADATA, DatasetError, verify
from launcher.core.failures import DISK_FULL_ERRNOS
from launcher.core.plan import Plan
from launcher.core import events
from launcher.core.rundir import append_event, write_json_atomic
from launcher.core.store import Location, StoreError, is_remote
from launcher.train import faults
from launcher.train.data import token_file
from launcher.train.dist import DistEnv

log = logging.getLogger(__name__)

ALLREDUCE_MB = 4
SLOW = 3.0  # a rank this many times slower than the median is flagged
NAMED = 8  # the most ranks the event names (slowest, flagged): the rest are in the table
TABLES = "preflight"  # in the run directory: one table of every rank's bandwidth per job


class NodeUnfit(RuntimeError):
    """A node failed its preflight check; the attempt ends so that the run goes on without it."""

    fault = events.Fault.NODE_UNFIT


class DiskFull(RuntimeError):
    """The run directory has no room for a checkpoint: every rank raises it, naming the rank that found it."""

    fault = events.Fault.DISK_FULL
    whole_cause = True  # the message is the cause in the user's words
    short = "disk full"

    def __init__(self, problem: str, rank: int) -> None:
        super().__init__(problem)
        self.rank = rank


def device_problem(env: DistEnv, virtual_gpus: bool = True) -> Optional[str]:
    """What is wrong with this rank's device, or None. On a cluster of real GPUs (not ``virtual_gpus``), a
    rank on the CPU is one: its torch cannot see the node's GPUs (a CPU build, a driver it cannot use), and
    training on would run on gloo at a fraction of the speed."""
    if faults.failing_node() == env.node:
        return f"device check failed on purpose ({faults.VARIABLE})"
    if not virtual_gpus and env.device.type != "cuda":
        return (f"torch {torch.__version__} sees no CUDA device on {env.node} (built for CUDA "
                f"{torch.version.cuda or 'none'}, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}); "
                "this cluster's GPUs are real (cluster.virtual_gpus=false), so it does not train on the CPU")
    n = 64
    a = (torch.arange(n * n, dtype=torch.float64).reshape(n, n) % 7).to(env.device, torch.float32)
    got = (a @ a.T).cpu().double()
    want = (a.cpu().double() @ a.cpu().double().T)
    if not torch.equal(got, want):
        error = float((got - want).abs().max())
        return f"a {n}x{n} matmul of small integers on {env.device} is wrong (max error {error:g})"
    if env.device.type == "cuda":
        free, total = torch.cuda.mem_get_info(env.device)
        if free < 0.5 * total:
            return f"{env.device} has only {free / 2**30:.1f} of {total / 2**30:.1f} GiB free (another process?)"
    return None


def disk_problem(run_dir: Path, plan: Plan, model: ModelConfig) -> tuple[Optional[str], bool]:
    """Whether the run directory can take the next checkpoint: what is wrong (None: nothing), and whether that is a
    full disk (no room for a checkpoint, or a write refused for space or quota) rather than the node's."""
    probe = run_dir / f".preflight-{os.getpid()}"
    try:
        with open(probe, "wb") as f:
            f.write(b"ok")
            f.flush()
            os.fsync(f.fileno())
        probe.unlink()
    except OSError as err:
        probe.unlink(missing_ok=True)
        return f"the run directory {run_dir} cannot be written: {err.strerror or err}", \
            err.errno in DISK_FULL_ERRNOS
    need = checkpoint_bytes(model, plan.params, plan.world_size)
    free = shutil.disk_usage(run_dir).free
    if free < need:
        return f"the run directory {run_dir} has {human(free)} free; a checkpoint needs about {human(need)}", True
    return None, False


def bandwidth(env: DistEnv) -> float:
    """This rank's all-reduce bus bandwidth in GB/s (nccl-tests' convention: 2(n-1)/n x size / time)."""
    n = env.world_size
    if n == 1:
        return 0.0  # nothing to measure
    tensor = torch.ones(ALLREDUCE_MB * 2**20 // 4, device=env.device)
    dist.all_reduce(tensor)  # warm-up: connections, buffers
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
    start = time.perf_counter()
    for _ in range(3):
        dist.all_reduce(tensor)
    if env.device.type == "cuda":
        torch.cuda.synchronize(env.device)
    seconds = (time.perf_counter() - start) / 3
    return 2 * (n - 1) / n * tensor.numel() * 4 / seconds / 1e9


def preflight(env: DistEnv, run_dir: Path, plan: Plan, model: ModelConfig, virtual_gpus: bool = True,
              timeout_s: float = 300.0) -> None:
    """Every rank calls this before training; raises NodeUnfit on every rank if any node failed, or if some
    rank's own checks were not done within ``timeout_s`` (:func:`check_in`)."""
    store = dist.distributed_c10d._get_default_store()  # the rendezvous's, kept by rank 0's node
    store.set(f"{JOINED}{env.rank}", env.node)
    if faults.failing_node("stuck") == env.node:
        time.sleep(10 * 24 * 3600)  # a drill's hung device check: the others name this node (check_in)
    problem, full = device_problem(env, virtual_gpus), False
    if problem is None and env.local_rank == 0:
        problem, full = disk_problem(run_dir, plan, model)
    if problem:
        log.error("preflight failed on %s: %s", env.node, problem)
    if problem and not full:
        append_event(run_dir, events.PreflightFailed(rank=env.rank, node=env.node, problem=problem,
                                                     job_id=os.environ.get("SLURM_JOB_ID")))
    check_in(store, env, run_dir, timeout_s)
    found: list = [None] * env.world_size
    dist.all_gather_object(found, (problem, full))
    if any(problem and not full for problem, full in found):
        raise NodeUnfit(problem or "another node failed its preflight check")
    rank = next((rank for rank, (_, full) in enumerate(found) if full), None)
    if rank is not None:
        raise DiskFull(found[rank][0], rank)
    mine = bandwidth(env)
    everyone: list = [None] * env.world_size
    dist.all_gather_object(everyone, (env.node, mine))
    if env.is_main:
        report = summary(everyone, os.environ.get("SLURM_JOB_ID"), run_dir)
        append_event(run_dir, report)
        log.info("preflight ok: all-reduce bus bandwidth median %.3f GB/s%s", report.median_gbps,
                 f"; {report.slow_count} slow rank(s) on {', '.join(report.slow_nodes)}" if report.slow_count else "")


JOINED, CHECKED, ALL_CHECKED = "launcher/preflight/joined/", "launcher/preflight/checked/", "launcher/preflight/all"


def check_in(store: dist.Store, env: DistEnv, run_dir: Path, timeout_s: float) -> None:
    """Say this rank's own checks are done, and wait (at most ``timeout_s``) until every rank's are: a rank
    whose device check never returns (a hung GPU or driver) would otherwise hold every other rank in the first
    collective until the process group's timeout. Through the rendezvous's store, a key a rank and one waited
    for by all (the last rank in sets it). On time-out the lowest rank that did check in records a
    ``preflight_failed`` event for each node of the ranks that did not, and every rank raises NodeUnfit, so the
    retry leaves those nodes out."""
    store.set(f"{CHECKED}{env.rank}", env.node)
    if store.add(f"{CHECKED}count", 1) == env.world_size:
        store.set(ALL_CHECKED, "1")
    try:
        store.wait([ALL_CHECKED], datetime.timedelta(seconds=timeout_s))
        return
    except RuntimeError:  # DistStoreError: the ranks that did not check in are found below
        pass
    # The recorder is the lowest rank that checked in: a rank looks at those below it and stops at the first there.
    if not any(store.check([f"{CHECKED}{rank}"]) for rank in range(env.rank)):
        missing = [rank for rank in range(env.world_size) if not store.check([f"{CHECKED}{rank}"])]
        nodes: dict = {}
        for rank in missing:
            node = store.get(f"{JOINED}{rank}").decode() if store.check([f"{JOINED}{rank}"]) else "an unknown node"
            nodes.setdefault(node, []).append(rank)
        for node, ranks in nodes.items():
            problem = (f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} on {node} did not finish "
                       f"their preflight checks within {timeout_s:.0f} s (train.preflight_timeout_s): a device or "
                       "disk that does not answer")
            log.error("preflight failed: %s", problem)
            append_event(run_dir, events.PreflightFailed(rank=ranks[0], node=node, problem=problem,
                                                         job_id=os.environ.get("SLURM_JOB_ID")))
    raise NodeUnfit(f"a node's preflight checks did not finish within {timeout_s:.0f} s")


def summary(everyone: list, job_id: Optional[str], run_dir: Path) -> events.Preflight:
    """The ``preflight`` event of every rank's (node, GB/s), and the full table written beside it."""
    median = statistics.median(gbps for _, gbps in everyone)
    ranked = sorted(range(len(everyone)), key=lambda rank: everyone[rank][1])
    slow = [rank for rank in ranked if everyone[rank][1] * SLOW < median]
    table = Path(TABLES) / f"{job_id or 'job'}.json"
    try:
        (run_dir / TABLES).mkdir(exist_ok=True)
        write_json_atomic(run_dir / table, {"allreduce_mb": ALLREDUCE_MB, "median_gbps": round(median, 3),
                                            "ranks": [{"rank": rank, "node": node, "gbps": round(gbps, 3)}
                                                      for rank, (node, gbps) in enumerate(everyone)]})
    except OSError as err:  # the summary is what the launcher reads: the table is for a person to look into
        log.warning("preflight table not written: %s", err)
        table = None
    return events.Preflight(
        job_id=job_id, allreduce_mb=ALLREDUCE_MB, ranks=len(everyone), median_gbps=round(median, 3),
        slowest=[{"rank": rank, "node": everyone[rank][0], "gbps": round(everyone[rank][1], 3)}
                 for rank in ranked[:min(NAMED, len(everyone))]],
        slow_ranks=sorted(slow[:NAMED]), slow_count=len(slow), slow_nodes=sorted({everyone[r][0] for r in slow}),
        table=None if table is None else table.as_posix())


def verify_data(env: DistEnv, cfg: RunConfig) -> None:
    """Every rank calls this before training: rank ``r`` checks every shard's size and the checksums of every
    ``world_size``-th shard from ``r`` on; raises DatasetError on every rank, with the problem of the first
    rank that found one, so that the attempt ends at once with the file named. The default corpus is built
    here (by one rank) if this is its first use. A bucket's dataset is checked by rank 0 alone (its metadata read,
    its shards listed), which hands the metadata to the others: one read of the store per attempt, not per rank;
    the store's own failure (StoreError) is raised on every rank as such."""
    remote = is_remote(cfg.data.path)
    problem, found = None, None
    try:
        token_file(cfg.data)
        if not remote or env.rank == 0:
            found = verify(cfg.data, cfg.model.vocab_size, env.rank, env.world_size)
    except (DatasetError, StoreError) as err:
        problem = (str(err), getattr(err, "fault", None), isinstance(err, StoreError))
    problems: list = [None] * env.world_size
    dist.all_gather_object(problems, problem)
    first = next((p for p in problems if p), None)
    if first:
        raise StoreError(first[0], first[1]) if first[2] else DatasetError(first[0])
    if remote:
        shared = [found.meta if found else None]
        dist.broadcast_object_list(shared, src=0)
        READ_METADATA[Location.parse(str(cfg.data.path)).url()] = shared[0]
