#!/usr/bin/env python3
"""How fast the web console's runs page answers with many runs: RUNS finished runs planted in a run root (each with
its record, its settled Slurm state, events and metrics, as a real run leaves them), then the console's first page
(the page itself, its script, and the API's first 50 rows) asked in-process, cold and warm, against its budget of
1 s (docs/console.md). Prints one line per figure and the ratio to the budget.

    .venv/bin/python scripts/bench_console.py            # 10,000 runs
    .venv/bin/python scripts/bench_console.py --quick    # 300 runs: the suite's check that it runs
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
BUDGET_S = 1.0


def plant(root: Path, count: int, cluster_conf: str = "/nonexistent/slurm.conf") -> list[str]:
    """``count`` finished runs in ``root``, newest last, with the index a launch appends to; their names."""
    root.mkdir(parents=True, exist_ok=True)
    names, index = [], []
    start = time.time() - count * 60
    for i in range(count):
        name = f"gpt-tiny-{2 ** (i % 4)}g-{i:05x}"
        run = root / name
        run.mkdir()
        submitted = start + 60 * i
        job = str(1000 + i)
        record = {"argv": ["model=gpt_tiny"], "cluster": "local", "gpus": 2 ** (i % 4), "gpus_per_node": 2 ** (i % 4),
                  "job_id": job, "model": "gpt_tiny", "name": name, "nodes": 1, "run_dir": str(run),
                  "slurm_conf": cluster_conf, "steps": 100, "submitted_at": submitted,
                  "sweep": f"sweep{i // 100:03d}"}
        (run / "run.json").write_text(json.dumps(record))
        (run / "slurm_state.json").write_text(json.dumps({"elapsed": "00:01:00", "end": "", "exit_code": "0:0",
                                                          "job_id": job, "nodes": "node1", "reason": "",
                                                          "source": "sacct", "start": "", "state": "COMPLETED"}))
        events = [{"event": "submitted", "job_id": job, "time": submitted},
                  {"attempt": 1, "event": "attempt", "job_id": job, "log_offset": 0, "nodes": "node1", "restart": 0,
                   "time": submitted + 1},
                  {"code": str(run / "code"), "event": "started", "job_id": job, "nodes": 1, "time": submitted + 2,
                   "world_size": 2},
                  {"event": "finished", "loss": 3.0, "pruned": None, "step": 100, "time": submitted + 43},
                  {"attempt": 1, "event": "attempt_ended", "job_id": job, "outcome": "COMPLETED", "time": submitted + 50}]
        (run / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        # 100 steps of 0.4 s from 2 s after the submission: 40 of its 50 s trained steps it kept
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 5 - s / 50, "tokens_per_s": 1e4,
                                                               "step_time": 0.4, "time": submitted + 2 + 0.4 * s})
                                                   + "\n" for s in range(10, 101, 10)))
        names.append(name)
        index.append(f"{submitted} {name}\n")
    (root / ".index").write_text("".join(index))
    return names


def first_page(root: Path) -> tuple[float, int]:
    """Seconds for the page, its script and the API's first page, in a fresh console; the rows it sent."""
    from starlette.testclient import TestClient

    from launcher.console.app import Console, application

    web = TestClient(application(Console([root], None, "bench", ["testserver"])))
    began = time.perf_counter()
    web.get("/?token=bench")
    web.get("/static/console.js")
    rows = web.get("/api/runs").json()["rows"]
    return time.perf_counter() - began, len(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="300 runs")
    parser.add_argument("--runs", type=int, default=10_000)
    args = parser.parse_args()
    count = 300 if args.quick else args.runs
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "runs"
        plant(root, count)
        cold, rows = first_page(root)
        warm, _ = first_page(root)
    print(f"console first page with {count:,} runs: {cold:.3f} s cold, {warm:.3f} s warm, {rows} rows; "
          f"budget {BUDGET_S:.1f} s: {cold / BUDGET_S:.2f}x of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
