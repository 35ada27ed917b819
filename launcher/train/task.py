"""What every Slurm task runs: :func:`run` (called by ``launcher.job.entry.TrainTask``, or
``python -m launcher.train``).

When Slurm signals an approaching time limit or preemption, every rank saves the step just done, rank 0 asks
for a requeue (a ``requeued`` event) and the ranks end; the batch script's last step requeues the job on the host
(launcher/job/recovery.py), and the requeued job resumes from that checkpoint, having lost nothing. A user's stop,
and Slurm's SIGTERM where the save fits before its SIGKILL, end the ranks the same way, rank 0 recording
``stopped`` or ``terminated`` (launcher/train/interrupt.py).
"""
from __future__ import annotations

import functools
import logging
import logging.handlers
import os
import sys
import time
from pathlib import Path
from typing import Sequence

import torch.distributed as dist

from launcher.core import failures, nodelocal
from launcher.core.config import load_run_config
from launcher.core.heartbeats import Pulse, read_pulses
from launcher.core.plan import read_plan
from launcher.core.events import Finished, PathRefused, Stalled, Started
from launcher.core.metrics import PrunedRow
from launcher.core.rundir import SOURCE_ROOT, append_event
from launcher.train.dist import DistEnv, check_allreduce, global_rank_from_environ, init_distributed
from launcher.train.interrupt import Interrupt, Interrupted
from launcher.train.hf_export import Exports
from launcher.train.loop import train
from launcher.train.preflight import preflight, verify_data
from launcher.train.watchdog import Watchdog

log = logging.getLogger(__name__)
# The node's copy of the run's code this process imports the launcher from, where its job staged one
# (launcher/job/stage.py: zipimport's importer has its path); None where it imports the frozen copy itself.
STAGED = getattr(__spec__.loader, "archive", None)

def run(run_dir: str | Path, secrets: Sequence[str] = ()) -> None:
    """Bring up the process group, check it, train, and record the outcome in the run's files (events, metrics).
    A failure is recorded with the step it happened at (the watchdog's, once training began) and its kind
    (launcher/core/failures.py), ``secrets`` (the names of the variables holding the user's) masked."""
    run_dir = Path(run_dir)
    rank = global_rank_from_environ()
    watchdog: Watchdog | None = None
    try:
        setup_logging(run_dir, rank)
        cfg = load_run_config(run_dir / "config.yaml")
        plan = read_plan(run_dir)
        clock = Phases()
        env = init_distributed()
        check_allreduce(env)
        clock.ended("rendezvous")
        preflight(env, run_dir, plan, cfg.model, cfg.cluster.virtual_gpus, cfg.train.preflight_timeout_s)
        clock.ended("preflight")
        verify_data(env, cfg)
        clock.ended("data")
        if env.is_main:
            append_event(run_dir, Started(job_id=os.environ.get("SLURM_JOB_ID"), world_size=env.world_size,
                                          nodes=env.nodes, code=str(SOURCE_ROOT),  # the run's frozen copy
                                          bring_up=clock.seconds, staged=STAGED,
                                          python=sys.executable))
        first = env.rank - env.local_rank  # Slurm's block distribution: a node's ranks are consecutive
        local = node_local(env, run_dir)
        if cfg.parallel.compile:
            private_compile_cache(local)
        watchdog = Watchdog(run_dir, env.rank, env.node, cfg.train.stall_timeout_s,
                            on_stall=functools.partial(_record_stall, run_dir),
                            neighbours=range(first, first + env.world_size // env.nodes), local=local).start(0)
        exports = Exports(run_dir) if env.is_main else None
        try:
            final = train(cfg, plan, run_dir, env, watchdog, Interrupt(env, run_dir, cfg.cluster.signal_delay_s),
                          exports)
        except BaseException as err:
            if exports:
                exports.stop()  # the next attempt redoes what they leave
            if not isinstance(err, Interrupted):
                raise
            if env.is_main:  # before the ranks end: the batch script's last step reads it (and requeues the job)
                append_event(run_dir, err.event)
            return
        finally:
            watchdog.stop()
        if env.is_main:
            append_event(run_dir, Finished(step=final.step, loss=final.loss,
                                           pruned=True if isinstance(final, PrunedRow) else None))
            exports.wait()  # the job step would end them: after training, with the watchdog stopped
    except BaseException as err:
        log.exception("rank %d failed", rank)
        failures.record(run_dir, err, watchdog.pulse.step if watchdog else None, secrets)
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class Phases:
    """How long each phase of a rank's bring-up took, in seconds: ``imports`` from the process's start (as the
    kernel counts it) to now, then each phase from the end of the one before (docs/performance.md, bring-up
    against scale)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {"imports": round(time.time() - process_start(), 3)}
        self._since = time.perf_counter()

    def ended(self, phase: str) -> None:
        now = time.perf_counter()
        self.seconds[phase], self._since = round(now - self._since, 3), now


def process_start() -> float:
    """When this process started, from /proc (its start in clock ticks since boot, and the boot time); now where
    /proc does not say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()


NODE_LOCAL_KEY = "launcher/node_local/"  # the rendezvous store's key of a node's folder, by node name


def node_local(env: DistEnv, run_dir: Path) -> nodelocal.Folder:
    """This user's node-local folder (launcher/core/nodelocal.py), the same for every rank of the node: the node's
    first rank opens it, or makes a fresh one where another user's file, folder or symlink has its name (recorded
    once, ``path_refused``), and tells the node's other ranks which through the rendezvous store."""
    key = NODE_LOCAL_KEY + env.node
    store = dist.distributed_c10d._get_default_store()  # the rendezvous's, kept by rank 0's node
    if env.local_rank != 0:
        return nodelocal.Folder.open(Path(store.get(key).decode()), create=False)
    try:
        folder = nodelocal.base()
    except nodelocal.Taken as taken:
        folder = nodelocal.fresh()
        log.warning("%s; node-local state goes to %s instead", taken, folder.path)
        append_event(run_dir, PathRefused(job_id=os.environ.get("SLURM_JOB_ID"), node=env.node, rank=env.rank,
                                          path=str(taken.path), found=taken.found, owner=taken.owner,
                                          used=str(folder.path)))
    store.set(key, str(folder.path))
    return folder


COMPILE_CACHE = "compile-cache"


def private_compile_cache(local: nodelocal.Folder) -> None:
    """torch.compile's cache (inductor's) in this user's node-local folder, unless the user chose one
    (``TORCHINDUCTOR_CACHE_DIR``): its default, ``/tmp/torchinductor_<user>``, is found by name in a folder every
    user may write and never checked, so another user's folder there would hand the ranks code of theirs to load."""
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        local.folder(COMPILE_CACHE).close()
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(local.path / COMPILE_CACHE)


def _record_stall(run_dir: Path, cause: str, frozen: list[Pulse]) -> None:
    reached = max((p.step for p in read_pulses(run_dir)), default=None)  # where the waiting ranks are
    append_event(run_dir, Stalled(cause=cause, ranks=[p.rank for p in frozen], nodes=[p.node for p in frozen],
                                   step=reached, job_id=os.environ.get("SLURM_JOB_ID")))


LOG_MAX_BYTES = 64 * 2**20  # a rank's log is cut here (one older part kept: rank_<N>.log.1), 128 MiB at most


def setup_logging(run_dir: Path, rank: int) -> None:
    """Log to ``logs/rank_<N>.log`` and to stdout, each line stamped with the rank. The log is bounded in size
    (:data:`LOG_MAX_BYTES`, rotated once); only rank 0 logs every step, the others their start, their faults and
    their end (docs/performance.md: what a run writes at scale)."""
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    formatter = logging.Formatter(f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    own = logging.handlers.RotatingFileHandler(run_dir / "logs" / f"rank_{rank}.log", maxBytes=LOG_MAX_BYTES,
                                               backupCount=1)
    for handler in (own, logging.StreamHandler(sys.stdout)):
        handler.setFormatter(formatter)
        root.addHandler(handler)
    root.setLevel(logging.INFO)
