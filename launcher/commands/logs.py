"""``launcher logs RUN``: a rank's output (rank 0 by default, and the end of each rank the attempt blamed for its
failure: at 1,024 ranks, the few logs worth reading), each attempt's part marked where it begins
(launcher/status/tails.py ``with_attempts``), optionally followed until the job ends."""
from __future__ import annotations

import argparse
import sys
import time
from collections import deque
from pathlib import Path
from typing import Dict, List, Tuple

from launcher.views.lookup import lookup, roots_of
from launcher.errors import LaunchError
from launcher.core.attempt_log import AttemptLog
from launcher.core.plan import read_plan
from launcher.core.rundir import read_events
from launcher.core.run_index import RunRecord
from launcher.slurm.client import Slurm, SlurmError
from launcher.status.job_state import JobState, job_states
from launcher.status.tails import rank_log, with_attempts
from launcher.views.width import to_stderr, wrap


def log_file(rec: RunRecord, rank: int, err: bool) -> Path:
    """Rank ``rank``'s log (launcher/status/tails.py ``rank_log``)."""
    return rank_log(Path(rec.run_dir), rec.job_id, rank, err)


def ranks_on_node(rec: RunRecord, node: str) -> List[int]:
    """Ranks placed on ``node``: Slurm places tasks in blocks, ``tasks_per_node`` per node in order."""
    plan = read_plan(rec.run_dir)
    nodelist = job_states([rec])[rec.name].nodes
    if not nodelist:
        raise LaunchError(f"{rec.name} has no nodes yet (job {rec.job_id} has not started)")
    try:
        hosts = Slurm(rec.slurm_conf).hostnames(nodelist)
    except SlurmError as err:
        raise LaunchError(str(err)) from None
    if node not in hosts:
        raise LaunchError(f"{rec.name} did not run on node '{node}'; its nodes: {', '.join(hosts)}")
    per = plan.tasks_per_node
    first = hosts.index(node) * per
    return list(range(first, first + per))


FAILED_RANK_LINES = 40  # of each failed rank shown beside rank 0, unless --tail says otherwise


def failed_ranks(run_dir: Path) -> List[int]:
    """The ranks the newest attempt blamed (launcher/core/attempt_log.py)."""
    return AttemptLog(read_events(run_dir)).blamed_ranks()


def tail_lines(path: Path, count: int) -> str:
    with open(path, errors="replace") as f:
        return "".join(deque(f, maxlen=count))


Offsets = Dict[Tuple[int, str], int]  # (rank, file) -> bytes already printed


def follow(rec: RunRecord, files: Dict[int, Path], offsets: Offsets, err: bool) -> None:
    """Print what the files gain until the job is no longer active, then what is left."""
    last_check, active, told = 0.0, True, ""
    while True:
        for rank in files:
            files[rank] = log_file(rec, rank, err)  # the rank log appears once the task starts logging
            path = files[rank]
            if not path.exists():
                continue
            with open(path, errors="replace") as f:
                if path.stat().st_size < offsets.get((rank, str(path)), 0):  # cut (launcher/train/task.py): anew
                    offsets[(rank, str(path))] = 0
                f.seek(offsets.get((rank, str(path)), 0))
                chunk = f.read()
                offsets[(rank, str(path))] = f.tell()
            if chunk:
                sys.stdout.write(with_attempts(chunk, Path(rec.run_dir)))
                sys.stdout.flush()
        if not active:
            return
        if time.time() - last_check > 2:
            state = job_states([rec])[rec.name]
            active, last_check = state.active, time.time()
            if state.state == "PENDING" and in_short(rec, state) != told:  # why it waits, each time that changes
                told = in_short(rec, state)
                to_stderr(f"({told})")
        time.sleep(0.5)


EARLY_ERROR_LINES = 20


def print_early_error(rec: RunRecord, rank: int, shown: Path, err: bool) -> None:
    """Where a rank ended before it began its own log (an import error, a Python it could not run), its output is
    submitit's, whose stdout says only that the job "triggered an exception": the end of its stderr says what."""
    stderr = log_file(rec, rank, err=True)
    if err or shown.parent.name != "submitit" or not stderr.exists() or not stderr.stat().st_size:
        return  # stderr shown already, or the rank's own log (it began training: its log says the rest)
    print(wrap(f"==> the end of rank {rank}'s stderr ({stderr}) <=="))
    sys.stdout.write(tail_lines(stderr, EARLY_ERROR_LINES))


def in_short(rec: RunRecord, state: JobState) -> str:
    """``job 42 is PENDING: waiting for 16 GPUs ...``: the job's state, and why where Slurm or the run says."""
    return f"job {rec.job_id} is {state.state}" + (f": {state.reason}" if state.reason else "")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--rank", type=int, default=None,
                       help="this global rank's output (default: rank 0, and the end of each rank the last attempt "
                            "blamed)")
    where.add_argument("--node", help="the output of every rank on this node")
    parser.add_argument("--follow", "-f", action="store_true", help="keep printing until the job ends")
    parser.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines")
    parser.add_argument("--err", action="store_true", help="stderr (tracebacks) instead of the log")


def main(args: argparse.Namespace) -> int:
    rec = lookup(roots_of(args), args.name)
    if args.rank is not None and not 0 <= args.rank < rec.gpus:  # one rank per GPU
        raise LaunchError(f"--rank {args.rank}: {rec.name} has ranks 0..{rec.gpus - 1}")
    chosen = args.node or args.rank is not None
    failed = [] if chosen else [rank for rank in failed_ranks(Path(rec.run_dir)) if rank != 0 and rank < rec.gpus]
    ranks = ranks_on_node(rec, args.node) if args.node else [args.rank or 0, *failed]
    files = {rank: log_file(rec, rank, args.err) for rank in ranks}
    offsets: Offsets = {}
    for rank, path in files.items():
        if len(files) > 1:
            print(f"==> rank {rank}{' (failed)' if rank in failed else ''} <==")
        if not path.exists():
            to_stderr(f"(no output from rank {rank} yet; {in_short(rec, job_states([rec])[rec.name])})")
            continue
        count = args.tail if args.tail is not None else FAILED_RANK_LINES if rank in failed else None
        text = tail_lines(path, count) if count is not None else path.read_text(errors="replace")
        sys.stdout.write(with_attempts(text, Path(rec.run_dir)))
        offsets[(rank, str(path))] = path.stat().st_size
        if not args.follow:
            print_early_error(rec, rank, path, args.err)
    if args.follow:
        try:
            follow(rec, files, offsets, args.err)
        except KeyboardInterrupt:
            pass
    return 0
