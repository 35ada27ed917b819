"""How fast ``launcher runs`` answers over many runs, as whole processes.

Creates 10,000 recorded runs (fake records with metrics, in a temporary root, pointing at the local
cluster, whose Slurm does not know their job ids) and times ``runs --limit 50`` and ``runs --all --json``
against a bare ``python -c "import tabulate"``. Goal: under 3x for ``runs --limit 50``.

Two cases: "cold", where Slurm must be asked about every listed job (sacct alone costs ~0.09 s here),
and "finished", the usual history, where each run's final Slurm state was kept in its directory by an
earlier listing (launcher/status/job_state.py) and Slurm is not asked again.

The launcher's own code writes the run directories (launcher.core.run_index.create_run_dir and save_record,
launcher.core.rundir's writers), so they are what a launch leaves. The timed processes run with their
bytecode cached, as an installed launcher does (a warm-up run writes it); ``--no-bytecode`` keeps
PYTHONDONTWRITEBYTECODE as the environment sets it, where every launcher process compiles its modules from
source while the floor's packages have theirs. ``--quick``: a few hundred runs, 2 repeats (seconds; for the
tests, tests/cluster/test_bench_launcher_quick.py).

    python scripts/bench_status.py [--runs 10000] [--repeats 5] [--quick] [--no-bytecode]
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.core.rundir import METRICS, RECORD, append_jsonl, write_json_atomic  # noqa: E402
from launcher.slurm.client import slurm_conf_for  # noqa: E402
from launcher.core.run_index import RunRecord, create_run_dir, save_record  # noqa: E402
from launcher.status.job_state import SETTLED_FILE, JobState  # noqa: E402


def make_runs(root: Path, count: int, settled: bool) -> None:
    """``count`` submitted runs with metrics; ``settled``: each with the final state an earlier listing kept."""
    now = time.time()
    for i in range(count):
        run_dir = create_run_dir(root, f"gpt-tiny-8g-{i:05x}", explicit=True)
        submitted = now - (count - i) * 60
        job_id = str(10_000_000 + i)
        save_record(RunRecord(name=run_dir.name, run_dir=str(run_dir), model="gpt_tiny", gpus=8, nodes=1,
                              gpus_per_node=8, steps=100, cluster="local", submitted_at=submitted,
                              job_id=job_id, slurm_conf=slurm_conf_for("local", None)))
        os.utime(run_dir / RECORD, (submitted, submitted))
        append_jsonl(run_dir / METRICS, {"step": 50, "loss": 3.2, "tokens_per_s": 1e5})
        if settled:  # as launcher/status/job_state.py keeps it
            answer = JobState("COMPLETED", source="sacct", elapsed="00:12:00").answer()
            write_json_atomic(run_dir / SETTLED_FILE, {"job_id": job_id, **answer})


def child_env(root: Path, bytecode: bool) -> dict:
    """The timed processes' environment: runs under ``root``; bytecode cached unless ``bytecode`` is False."""
    env = {**os.environ, "LAUNCHER_RUN_ROOT": str(root), "PYTHONPATH": str(REPO)}
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env, cwd=REPO)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="300 runs, 2 repeats: seconds, for the tests")
    parser.add_argument("--no-bytecode", action="store_true",
                        help="leave PYTHONDONTWRITEBYTECODE as set (launcher modules compiled in every process)")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.repeats = min(args.runs, 300), min(args.repeats, 2)
    bytecode = not args.no_bytecode
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}; launcher bytecode "
          f"{'cached' if bytecode or not os.environ.get('PYTHONDONTWRITEBYTECODE') else 'not written (compiled each run)'}")
    baseline = [sys.executable, "-c", "import tabulate"]
    for case in ("cold", "finished"):
        with tempfile.TemporaryDirectory(prefix="bench-status-") as tmp:
            root = Path(tmp)
            make_runs(root, args.runs, settled=case == "finished")
            env = child_env(root, bytecode)
            timed([sys.executable, "-m", "launcher", "runs", "--limit", "1"], env)  # writes the bytecode
            for label, extra in (("runs --limit 50", ["--limit", "50"]), ("runs --all --json", ["--all", "--json"])):
                base_times, times = [], []
                for _ in range(args.repeats):
                    base_times.append(timed(baseline, env))
                    times.append(timed([sys.executable, "-m", "launcher", "runs", *extra], env))
                base, seconds = statistics.median(base_times), statistics.median(times)
                print(f"{case:<9} {label:<18} over {args.runs} runs {seconds:7.3f} s   import tabulate {base:6.3f} s"
                      f"   ratio {seconds / base:5.2f}x", flush=True)
    print(f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
