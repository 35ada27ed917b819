"""The scale drill: a 4-node x 8-GPU local cluster runs gpus=32 (gpt_tiny, hybrid sharding) to completion.

    .venv/bin/python scripts/drill_scale.py [--nodes 4] [--gpus 8] [--steps 30]

Starts its own cluster (port 17400, directory .slurm-drill; the default cluster is left alone), launches the
run, and reports the time from submission to every rank training, rank 0's bring-up by phase (imports,
rendezvous, preflight, data checks, model build, checkpoint load, first step: the ``started`` and ``ready``
events), the preflight's all-reduce bandwidth of every rank, and the run's outcome; then stops the cluster.
Not part of the default test run: 32 ranks on a 2-core machine take a few minutes.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cluster_env(args: argparse.Namespace, directory: Path) -> dict:
    return {**os.environ, "SLURM_LOCAL_DIR": str(directory), "SLURM_LOCAL_NAME": "drill",
            "SLURM_LOCAL_PORT": str(args.port), "SLURM_LOCAL_NODES": str(args.nodes),
            "SLURM_LOCAL_GPUS": str(args.gpus), "SLURM_LOCAL_ACCOUNTING": "0",
            "SLURM_CONF": str(directory / "etc" / "slurm.conf")}


def events(run_dir: Path) -> list:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--gpus", type=int, default=8, help="GPUs per node")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--port", type=int, default=17400)
    args = parser.parse_args()
    directory = REPO / ".slurm-drill"
    env = cluster_env(args, directory)
    root = directory / "runs"
    world = args.nodes * args.gpus
    subprocess.run(["bash", str(REPO / "slurm" / "up.sh")], env=env, check=True)
    try:
        start = time.time()
        name = f"drill-{args.nodes}x{args.gpus}-{int(start)}"  # a drill of each shape, each time, its own run
        launch = subprocess.run([sys.executable, "-m", "launcher", f"gpus={world}", f"layout.nodes={args.nodes}",
                                 "model=gpt_tiny", "parallel.sharding=hybrid", f"train.steps={args.steps}",
                                 "train.log_every=5", f"name={name}", f"run_root={root}"],
                                env=env, cwd=REPO, capture_output=True, text=True)
        if launch.returncode:
            print(launch.stderr, file=sys.stderr)
            return 1
        run_dir = root / name
        while not (run_dir / "metrics.jsonl").exists() and time.time() - start < 900:
            time.sleep(0.5)
        training = time.time() - start
        while not any(e["event"] in ("attempt_ended",) for e in events(run_dir)) and time.time() - start < 1800:
            time.sleep(1)
        done = time.time() - start
        started = next((e for e in events(run_dir) if e["event"] == "started"), {})
        ready = next((e for e in events(run_dir) if e["event"] == "ready"), {})
        began = started.get("bring_up", {})
        phases = {**{key: began.get(key) for key in ("imports", "rendezvous", "preflight", "data")},
                  **{key[:-2]: ready.get(key) for key in ("build_s", "load_s", "first_step_s")}}
        print(f"bring-up of rank 0 ({world} ranks): "
              + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items() if isinstance(v, (int, float))))
        report = next((e for e in events(run_dir) if e["event"] == "preflight"), {})
        ended = [e for e in events(run_dir) if e["event"] == "attempt_ended"]
        print(f"\n{world} ranks on {args.nodes} nodes x {args.gpus}: submit -> every rank training {training:.0f} s; "
              f"submit -> attempt ended {done:.0f} s; outcome {ended[-1]['outcome'] if ended else 'unknown'}")
        table = json.loads((run_dir / report["table"]).read_text())["ranks"] if report.get("table") else []
        gbps = [row["gbps"] for row in table]
        print(f"preflight all-reduce of {report.get('allreduce_mb')} MB, bus bandwidth per rank (GB/s): "
              f"median {report.get('median_gbps')}, slowest {min(gbps, default=None)}, "
              f"fastest {max(gbps, default=None)}, flagged slow {report.get('slow_count')} "
              f"on {report.get('slow_nodes')}")
        for row in table:
            print(f"  rank {row['rank']:>3}  {row['node']}  {row['gbps']:.3f}")
        return 0 if ended and ended[-1]["outcome"] == "COMPLETED" else 1
    finally:
        subprocess.run(["bash", str(REPO / "slurm" / "down.sh")], env=env)


if __name__ == "__main__":
    raise SystemExit(main())
