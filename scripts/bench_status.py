"""How fast ``launcher runs`` answers over many runs, as whole processes.

Creates 10,000 recorded runs (fake records with metrics, in a temporary root, pointing at the local
cluster, whose Slurm does not know their job ids) and times ``runs --limit 50`` and ``runs --all --json``
against a bare ``python -c "import tabulate"``. Goal: under 3x for ``runs --limit 50``.

Two cases: "cold", where Slurm must be asked about every listed job (sacct alone costs ~0.09 s here),
and "finished", the usual history, where each run's final Slurm state was kept in its directory by an
earlier listing (launcher/status/job_state.py) and Slurm is not asked again.

    python scripts/bench_status.py [--runs 10000] [--repeats 5]
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from launcher.status.index import RunRecord, save_record
from launcher.slurm.client import slurm_conf_for  # noqa: E402
from launcher.status.job_state import SETTLED_FILE  # noqa: E402


def make_runs(root: Path, count: int, settled: bool) -> None:
    now = time.time()
    for i in range(count):
        run_dir = root / f"gpt-tiny-8g-{i:05x}"
        run_dir.mkdir()
        submitted = now - (count - i) * 60
        save_record(RunRecord(name=run_dir.name, run_dir=str(run_dir), model="gpt_tiny", gpus=8, nodes=1,
                              gpus_per_node=8, steps=100, cluster="local", submitted_at=submitted,
                              job_id=str(10_000_000 + i), slurm_conf=slurm_conf_for("local", None)))
        os.utime(run_dir / "run.json", (submitted, submitted))
        (run_dir / "metrics.jsonl").write_text(json.dumps({"step": 50, "loss": 3.2, "tokens_per_s": 1e5}) + "\n")
        if settled:
            (run_dir / SETTLED_FILE).write_text(json.dumps({"job_id": str(10_000_000 + i), "state": "COMPLETED",
                                                            "source": "sacct", "elapsed": "00:12:00"}))


def timed(command: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL, env=env, cwd=REPO)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    baseline = [sys.executable, "-c", "import tabulate"]
    for case in ("cold", "finished"):
        with tempfile.TemporaryDirectory(prefix="bench-status-") as tmp:
            root = Path(tmp)
            make_runs(root, args.runs, settled=case == "finished")
            env = {**os.environ, "LAUNCHER_RUN_ROOT": str(root)}
            for label, extra in (("runs --limit 50", ["--limit", "50"]), ("runs --all --json", ["--all", "--json"])):
                base_times, times = [], []
                for _ in range(args.repeats):
                    base_times.append(timed(baseline, env))
                    times.append(timed([sys.executable, "-m", "launcher", "runs", *extra], env))
                base, seconds = statistics.median(base_times), statistics.median(times)
                print(f"{case:<9} {label:<18} over {args.runs} runs {seconds:7.3f} s   import tabulate {base:6.3f} s"
                      f"   ratio {seconds / base:5.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
