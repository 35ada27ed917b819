"""How long a 12-point grid sweep takes to submit: one sbatch per run against one job array per resource shape
(launcher/submit/submitter.py arrays).

The grid (``train.lr`` x ``train.steps``, 12 runs of one shape) is composed once; each repeat submits it both ways
through the same ``launch`` in this process, alternately, so both see the same machine load, and medians are
compared. "One sbatch each" is the launch with every run a batch of its own (``submit.arrays`` grouping each run
alone). The jobs are held (``+cluster.sbatch_flags.hold=true``), so none starts and loads the machine; their runs
go to a temporary root and their jobs are cancelled at the end. It needs a cluster (the local one: slurm/up.sh);
``--quick``: one repeat, and a line saying it skipped when no cluster answers
(tests/cluster/test_bench_launcher_quick.py).

    python scripts/bench_sweep.py [--repeats 5] [--quick]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

GRID = ["train.lr=1e-4,2e-4,5e-4,1e-3,2e-3,5e-3", "train.steps=1,2", "gpus=1", "+cluster.sbatch_flags.hold=true"]


def cluster_answers() -> bool:
    """Whether the cluster of $SLURM_CONF (else Slurm's default) answers ``scontrol ping``."""
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "UP" in out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="one repeat; skipped when no cluster answers")
    args = parser.parse_args()
    if args.quick:
        args.repeats = 1
    if not cluster_answers():
        print(f"12-point grid submission   skipped: no cluster answers at SLURM_CONF="
              f"{os.environ.get('SLURM_CONF', '(unset)')} (start one with slurm/up.sh)")
        return 0 if args.quick else 1
    os.environ["LAUNCHER_RUN_ROOT"] = tempfile.mkdtemp(prefix="bench-sweep-")
    from launcher.compose.composer import compose_runs
    from launcher.slurm.client import Slurm
    from launcher.submit import submitter as submit

    runs = compose_runs(GRID, multirun=True)
    sbatches: List[str] = []
    watchers: List[str] = []  # the job beside each plain job, or each array, that judges it should its batch step die
    sbatch = Slurm.sbatch

    def counted(self, script, flags=()):
        job_id = sbatch(self, script, flags)
        (watchers if Path(script).name.startswith("watch_") else sbatches).append(job_id)
        return job_id

    Slurm.sbatch = counted  # type: ignore
    arrays = submit.arrays

    def one_each(runs, roots, sweep_id):
        return [[index] for index in range(len(runs))]

    def timed(grouping: Callable) -> tuple:
        submit.arrays = grouping
        before, watched = len(sbatches), len(watchers)
        start = time.perf_counter()
        submit.launch(runs, sweep=True)
        return time.perf_counter() - start, len(sbatches) - before, len(watchers) - watched

    timed(one_each), timed(arrays)  # imports, sinfo's answer and the page cache, before anything is timed
    each, arrayed = [], []
    for _ in range(args.repeats):
        each.append(timed(one_each))
        arrayed.append(timed(arrays))
    subprocess.run(["scancel", *dict.fromkeys(job_id.split("_")[0] for job_id in sbatches + watchers)], check=False)
    before, after = statistics.median(t for t, *_ in each), statistics.median(t for t, *_ in arrayed)
    jobs = lambda sbatched, watching: f"({sbatched} sbatch, {watching} watcher{'' if watching == 1 else 's'})"  # noqa: E731
    print(f"12-point grid submission   one sbatch each {before:7.3f} s {jobs(*each[0][1:])}"
          f"   as job arrays {after:7.3f} s {jobs(*arrayed[0][1:])}   ratio "
          f"{before / after:5.2f}x faster   "
          f"({args.repeats} repeats, medians; {len(runs)} runs each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
