"""How long the launcher takes to answer, as whole processes.

The launcher should cost little more than importing its two big dependencies:
``python -m launcher dry_run=json`` is timed against a bare
``python -c "import hydra, submitit"`` (goal: at most 1.5x). If it regresses,
profile with ``python -X importtime -m launcher dry_run=json`` and make the
offending import lazy.

Each benchmark is a function that times one run and returns seconds; the
baseline is run alternately with it, so both see the same machine load, and
medians are compared. A real submission goes to the local cluster (start it
with slurm/up.sh first); its runs go to a temporary root and its jobs are
cancelled at the end.

    python scripts/bench_launch.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, Sequence

REPO = Path(__file__).resolve().parents[1]


def time_process(command: Sequence[str]) -> float:
    """Wall time of ``command`` run once as a fresh process from the repo root."""
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - start


def baseline() -> float:
    return time_process([sys.executable, "-c", "import hydra, submitit"])


def dry_run_json() -> float:
    return time_process([sys.executable, "-m", "launcher", "dry_run=json"])


SUBMIT_ROOT = tempfile.mkdtemp(prefix="bench-launch-")


def real_submission() -> float:
    os.environ["LAUNCHER_RUN_ROOT"] = SUBMIT_ROOT
    # Held, so the submitted jobs do not start and load the machine during the measurement.
    return time_process([sys.executable, "-m", "launcher", "gpus=1", "train.steps=1", "+cluster.sbatch_flags.hold=true"])


def cancel_submitted() -> None:
    job_ids = [json.loads(p.read_text())["job_id"] for p in Path(SUBMIT_ROOT).glob("*/run.json")]
    if job_ids:
        subprocess.run(["scancel", *job_ids], check=False)


BENCHMARKS: Dict[str, Callable[[], float]] = {
    "launcher dry_run=json": dry_run_json,
    "launcher (real submission)": real_submission,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    for label, bench in BENCHMARKS.items():
        base_times, times = [], []
        for _ in range(args.repeats):
            base_times.append(baseline())
            times.append(bench())
        base, seconds = statistics.median(base_times), statistics.median(times)
        print(f"{label:<28} {seconds:7.3f} s   import hydra, submitit {base:7.3f} s   ratio {seconds / base:5.2f}x")
    cancel_submitted()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
