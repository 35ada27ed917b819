#!/usr/bin/env python
"""How long do N ranks take to register with the rendezvous's store, and how does it grow with N? (this machine)

Every rank of a run joins the process group through one TCPStore, which rank 0's process serves
(launcher/train/dist.py: ``init_process_group`` with a ``tcp://`` init method); the launcher's bring-up then
goes through the same store (launcher/train/preflight.py, launcher/train/task.py). A swarm of N clients does here
what each rank of a GPU job does there, in order:

1. connects and counts itself in (``TCPStore(..., is_master=False)``: the store's count of workers);
2. reads NCCL's unique id, which rank 0 sets (ProcessGroupNCCL's ``broadcastUniqueNCCLID``);
3. says it joined (preflight's ``joined`` key) and learns its node's node-local folder (the node's first rank
   sets the key, the others read it: ``node_local``);
4. checks in and waits for every rank (preflight's ``check_in``, the launcher's own function: a key, a counter,
   one key waited for by all): the barrier.

The server is the store's real one in this process, ``libuv`` (torch's default since 2.4, what a ``tcp://``
rendezvous starts unless ``USE_LIBUV=0``) and the ``legacy`` one (``use_libuv=False``); the clients are threads
in ``--processes`` worker processes, all started first and then released together, so that connecting is part of
what is timed. The time is from their release to the last client through the barrier; each size's median of
``--repeats`` rounds. Growth is each size's time over the previous one's: linear growth is the clients' ratio (4x
here), worse than linear more. Peers' names come from a hosts file of the script's own where it can make one
(:func:`rerun_naming_loopback` says why).

    python scripts/bench_rendezvous.py [--sizes 16,64,256,1024] [--repeats 3] [--processes 2]
    python scripts/bench_rendezvous.py --quick   # 64 clients, one round (tests/cluster/test_bench_launcher_quick.py)

The clients, the server and the workers share this machine's cores, so a time here is an upper bound of what the
server alone costs; what the ranks' own network adds on a cluster (a round trip a request) is not in it.
"""
from __future__ import annotations

import argparse
import datetime
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
NAMED = "BENCH_RENDEZVOUS_NAMED"  # set in the run that names the loopback addresses itself
NAMES_FROM = {True: "a hosts file of its own", False: "this machine's resolver, whose lookups are in the times"}
LOOPBACK_NAMES = "127.0.0.1 localhost\n::1 localhost\n::ffff:127.0.0.1 localhost\n"


def rerun_naming_loopback() -> Optional[int]:
    """This script run again in a mount namespace of its own whose /etc/hosts names the loopback addresses; its
    exit status, or None where it runs there already or cannot (not root, no unshare, no mount namespaces).

    torch's sockets look up the name of each peer's address (c10d's ``formatSockAddr``: a ``getnameinfo`` per
    connection, in every client and, on the legacy server, in its one thread for every client it accepts). A
    machine whose hosts file does not name ``::ffff:127.0.0.1`` asks its DNS server, and one that drops part of a
    burst of queries (this project's machine does, from about 20 at once) adds the resolver's 5-s timeout for
    each: what would be timed is the resolver, not the store."""
    if os.environ.get(NAMED) or os.geteuid() != 0 or shutil.which("unshare") is None:
        return None
    with tempfile.TemporaryDirectory(prefix="rendezvous-hosts-") as folder:
        hosts = Path(folder) / "hosts"
        hosts.write_text(LOOPBACK_NAMES)
        bind = ["unshare", "--mount", "sh", "-c", 'mount --bind "$0" /etc/hosts && exec "$@"', str(hosts)]
        if subprocess.run([*bind, "true"], capture_output=True).returncode:
            return None
        return subprocess.run([*bind, sys.executable, *sys.argv], env={**os.environ, NAMED: "1"}).returncode


if __name__ == "__main__" and (status := rerun_naming_loopback()) is not None:  # before torch's import: once
    raise SystemExit(status)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from launcher.train.dist import DistEnv  # noqa: E402
from launcher.train.preflight import CHECKED, JOINED, check_in  # noqa: E402
from launcher.train.task import NODE_LOCAL_KEY  # noqa: E402

HOST = "127.0.0.1"
RANKS_A_NODE = 8
NCCL_ID = "0"  # ProcessGroupNCCL's first communicator's key: rank 0's 128-byte unique id
TIMEOUT = datetime.timedelta(seconds=300)
SERVERS = {"libuv": True, "legacy": False}
SIZES, QUICK_SIZES = "16,64,256,1024", "64"


def register(port: int, rank: int, world: int, run_dir: Path) -> float:
    """One rank's part of the rendezvous (the module's steps 1-4); when it was connected (time.time())."""
    store = dist.TCPStore(HOST, port, world, False, timeout=TIMEOUT)
    connected = time.time()
    node = f"node{rank // RANKS_A_NODE:05d}"
    if rank == 0:
        store.set(NCCL_ID, bytes(128))
    else:
        store.get(NCCL_ID)
    store.set(f"{JOINED}{rank}", node)
    if rank % RANKS_A_NODE == 0:
        store.set(NODE_LOCAL_KEY + node, f"/dev/shm/launcher-{os.getuid()}")
    else:
        store.get(NODE_LOCAL_KEY + node)
    env = DistEnv(rank=rank, local_rank=rank % RANKS_A_NODE, world_size=world, nodes=-(-world // RANKS_A_NODE),
                  node=node, device=torch.device("cpu"))
    check_in(store, env, run_dir, TIMEOUT.total_seconds())
    return connected


@dataclass
class Outcome:
    """A worker's clients: when each was connected and when it passed the barrier (time.time()), and the errors
    raised."""

    connected: List[float]
    through: List[float]
    errors: List[str]


def worker(conn) -> None:
    """A worker process: for each round it is sent (port, world, its ranks, run_dir), it starts a thread a rank,
    says ``ready``, releases them on ``go`` and sends back their Outcome; ``None`` ends it."""
    while (job := conn.recv()) is not None:
        port, world, ranks, run_dir = job
        release, outcome = threading.Event(), Outcome([], [], [])

        def rank_thread(rank: int) -> None:
            release.wait()
            try:
                outcome.connected.append(register(port, rank, world, run_dir))
                outcome.through.append(time.time())
            except Exception as err:  # noqa: BLE001: each client's failure is reported, none stops the others
                outcome.errors.append(f"rank {rank}: {err}")

        threads = [threading.Thread(target=rank_thread, args=(rank,), daemon=True) for rank in ranks]
        for thread in threads:
            thread.start()
        conn.send("ready")
        conn.recv()
        release.set()
        for thread in threads:
            thread.join()
        conn.send(outcome)


@dataclass
class Round:
    server: str
    clients: int
    connected_s: float  # from the release to the last client connected
    through_s: float  # from the release to the last client through the barrier
    registered: int  # the clients the store counted through the check-in
    errors: List[str]


def one_round(workers: list, server: str, world: int, run_dir: Path) -> Round:
    """``world`` clients, shared out over the workers, against a fresh server of kind ``server``."""
    store = dist.TCPStore(HOST, 0, world, True, timeout=TIMEOUT, wait_for_workers=False, use_libuv=SERVERS[server])
    for index, conn in enumerate(workers):
        conn.send((store.port, world, list(range(index, world, len(workers))), run_dir))
    for conn in workers:
        conn.recv()
    start = time.time()
    for conn in workers:
        conn.send("go")
    outcomes = [conn.recv() for conn in workers]
    connected = [when for outcome in outcomes for when in outcome.connected]
    through = [when for outcome in outcomes for when in outcome.through]
    registered = store.add(f"{CHECKED}count", 0)
    del store  # the server stops with its store
    return Round(server, world, max(connected, default=start) - start, max(through, default=start) - start,
                 registered, [error for outcome in outcomes for error in outcome.errors])


def start_workers(count: int) -> tuple:
    """``count`` worker processes, forked before any store's server thread exists; their connections."""
    context = multiprocessing.get_context("fork")
    pipes = [context.Pipe() for _ in range(count)]
    processes = [context.Process(target=worker, args=(child,), daemon=True) for _, child in pipes]
    for process in processes:
        process.start()
    return [parent for parent, _ in pipes], processes


def report(rounds: List[Round]) -> None:
    print(f"{'server':<8}{'clients':>8}{'connected':>12}{'through the barrier':>22}{'a client':>11}{'growth':>10}"
          f"{'registered':>12}")
    previous: dict = {}
    for each in rounds:
        before = previous.get(each.server)
        growth = f"x{each.through_s / before.through_s:.1f}" if before else "-"
        print(f"{each.server:<8}{each.clients:>8,}{each.connected_s:>10.3f} s{each.through_s:>20.3f} s"
              f"{each.through_s / each.clients * 1e3:>8.2f} ms{growth:>10}{each.registered:>12,}")
        previous[each.server] = each
    for server in SERVERS:
        mine = [each for each in rounds if each.server == server]
        if len(mine) > 1:
            first, last = mine[-2], mine[-1]
            ratio = last.through_s / first.through_s
            linear = last.clients / first.clients
            print(f"{server}: {first.clients:,} -> {last.clients:,} clients (x{linear:.0f}): time x{ratio:.1f}, "
                  f"{'worse than linear' if ratio > 1.25 * linear else 'linear or better'}")


def median_round(rounds: List[Round]) -> Round:
    """The round of median time (the first of the two middle ones for an even count)."""
    return sorted(rounds, key=lambda each: each.through_s)[(len(rounds) - 1) // 2]


def descriptors(need: int) -> None:
    """Raise this process's limit of open files (its workers inherit it) to ``need``, or say why it cannot be."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < need:
        if hard != resource.RLIM_INFINITY and hard < need:
            raise SystemExit(f"bench_rendezvous.py: the clients need {need:,} open files; this process may open "
                             f"{hard:,} (ulimit -Hn)")
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def parse_sizes(text: str) -> List[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        sizes = []
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"--sizes {text!r}: allowed positive client counts, e.g. {SIZES}")
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=parse_sizes, help=f"client counts (default {SIZES})")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, default=2, help="worker processes the clients are shared over")
    parser.add_argument("--quick", action="store_true", help=f"--sizes {QUICK_SIZES}, one round, one process")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.processes = 1, 1
    sizes = args.sizes or parse_sizes(QUICK_SIZES if args.quick else SIZES)
    descriptors(2 * max(sizes) + 64)  # a socket a client, twice over: the client's and the server's
    print(f"torch {torch.__version__}; {os.cpu_count()} CPUs; clients as threads in {args.processes} process(es); "
          f"median of {args.repeats}; peers' names from {NAMES_FROM[bool(os.environ.get(NAMED))]}")
    conns, processes = start_workers(args.processes)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="rendezvous-") as run_dir:
        for server in SERVERS:
            for size in sizes:
                rounds.append(median_round([one_round(conns, server, size, Path(run_dir))
                                            for _ in range(args.repeats)]))
    for conn in conns:
        conn.send(None)
    for process in processes:
        process.join()
    report(rounds)
    failed = [error for each in rounds for error in each.errors]
    for error in failed[:10]:
        print(f"error: {error}")
    return 1 if failed or any(each.registered != each.clients for each in rounds) else 0


if __name__ == "__main__":
    raise SystemExit(main())
