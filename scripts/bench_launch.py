"""How long the launcher takes to answer, as whole processes.

The launcher should cost little more than importing its two big dependencies:
``python -m launcher dry_run=json`` and a real submission are timed against a
bare ``python -c "import hydra, submitit"`` (goals: at most 1.3x and 1.5x). If
one regresses, profile with ``python -X importtime -m launcher dry_run=json``
(an import to make lazy) and cProfile (work to avoid).

Each benchmark is a function that times one run and returns seconds; the
baseline is run alternately with it, so both see the same machine load, and
medians are compared. A real submission goes to the local cluster (start it
with slurm/up.sh first); its runs go to a temporary root and its jobs are
cancelled at the end.

The timed processes run with the launcher's bytecode cached, as an installed launcher has it (a warm-up
run writes it); ``--no-bytecode`` keeps PYTHONDONTWRITEBYTECODE as the environment sets it (then every
launcher process compiles its modules from source, while hydra's and submitit's have bytecode).
``--quick``: 2 repeats (seconds; for tests/cluster/test_bench_launcher_quick.py); the submission is timed only
when the cluster of $SLURM_CONF answers, else it is skipped with a line that says so.

    python scripts/bench_launch.py [--repeats 9] [--quick] [--no-bytecode]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence, Tuple

REPO = Path(__file__).resolve().parents[1]


ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def time_process(command: Sequence[str]) -> float:
    """Wall time of ``command`` run once as a fresh process from the repo root; its CPU time (user +
    system, which a loaded machine skews less) is added to CPU_TIMES."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True, stdout=subprocess.DEVNULL, env=ENV)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    CPU_TIMES.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return wall


CPU_TIMES: List[float] = []


def baseline() -> float:
    return time_process([sys.executable, "-c", "import hydra, submitit"])


def dry_run_json() -> float:
    return time_process([sys.executable, "-m", "launcher", "dry_run=json"])


SUBMIT_ROOT = tempfile.mkdtemp(prefix="bench-launch-")


def real_submission() -> float:
    ENV["LAUNCHER_RUN_ROOT"] = SUBMIT_ROOT
    # Held, so the submitted jobs do not start and load the machine during the measurement.
    return time_process([sys.executable, "-m", "launcher", "gpus=1", "train.steps=1", "+cluster.sbatch_flags.hold=true"])


def cancel_submitted() -> None:
    job_ids = [json.loads(p.read_text())["job_id"] for p in Path(SUBMIT_ROOT).glob("*/run.json")]
    if job_ids:
        subprocess.run(["scancel", *job_ids], check=False, env=ENV)


def cluster_answers() -> bool:
    """Whether the cluster of $SLURM_CONF (else Slurm's default) answers ``scontrol ping``."""
    try:
        out = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=5, env=ENV).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "UP" in out


# Each benchmark with its goal: at most this many times the baseline.
BENCHMARKS: Dict[str, Tuple[Callable[[], float], float]] = {
    "launcher dry_run=json": (dry_run_json, 1.3),
    "launcher (real submission)": (real_submission, 1.5),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--quick", action="store_true", help="2 repeats; the submission only if a cluster answers")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="leave PYTHONDONTWRITEBYTECODE as set (launcher modules compiled in every process)")
    args = parser.parse_args()
    if args.quick:
        args.repeats = min(args.repeats, 2)
    if not args.no_bytecode:
        ENV.pop("PYTHONDONTWRITEBYTECODE", None)
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; launcher bytecode "
          f"{'not written (compiled each run)' if ENV.get('PYTHONDONTWRITEBYTECODE') else 'cached'}", flush=True)
    benchmarks = dict(BENCHMARKS)
    if args.quick and not cluster_answers():
        del benchmarks["launcher (real submission)"]
        print(f"launcher (real submission)   skipped: no cluster answers at SLURM_CONF="
              f"{os.environ.get('SLURM_CONF', '(unset)')} (start one with slurm/up.sh)", flush=True)
    dry_run_json()  # writes the bytecode (and warms the page cache) before anything is timed
    for label, (bench, goal) in benchmarks.items():
        base_times, times, base_cpu, cpu = [], [], [], []
        for _ in range(args.repeats):
            base_times.append(baseline())
            base_cpu.append(CPU_TIMES[-1])
            times.append(bench())
            cpu.append(CPU_TIMES[-1])
        base, seconds = statistics.median(base_times), statistics.median(times)
        ratio = seconds / base
        print(f"{label:<28} {seconds:7.3f} s   import hydra, submitit {base:7.3f} s   ratio {ratio:5.2f}x "
              f"(goal {goal}x: {'met' if ratio <= goal else 'NOT met'})   CPU time ratio "
              f"{statistics.median(cpu) / statistics.median(base_cpu):5.2f}x", flush=True)
    cancel_submitted()
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
