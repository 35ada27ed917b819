"""What a training run costs the shared services in steady state: the controller's RPCs and the
shared file system's operations in its run directory, while it trains and nothing changes state.

On the cluster ``$SLURM_CONF`` names, one run per node count side by side (2 ranks a node, paced steps of a tiny
model, no checkpoint in the window), then for a window of ``--window`` seconds, with nothing else asking Slurm:

- slurmctld's RPCs by type (``sdiag``, reset at the window's start): per running job per minute (the goal: 1 or
  fewer, docs/performance.md "what one run costs");
- each run directory's operations (inotify, every folder of it): creates, renames, unlinks and listings (the
  metadata server's work), and writes, per minute, per node and per rank: they must grow with nodes, not ranks.

    python scripts/bench_footprint.py                 # 1, 2 and 4 nodes: a cluster of 7 nodes or more
                                                      # (bash slurm/up.sh --nodes 7 --gpus 2), a 180 s window
    python scripts/bench_footprint.py --quick         # 1 and 2 nodes (3 nodes or more), a 35 s window
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Dict

from inotify_simple import INotify, flags

REPO = Path(__file__).resolve().parents[1]
RANKS_PER_NODE = 2
WATCHED = flags.CREATE | flags.MOVED_TO | flags.DELETE | flags.OPEN | flags.MODIFY
KINDS = ("creates", "renames", "unlinks", "listings", "writes")
# What slurmctld receives whether or not a job runs: each node's slurmd answering the controller's health check.
CLUSTER_OWN = ("MESSAGE_NODE_REGISTRATION_STATUS",)


def launcher(root: Path, *args: str, env: Dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LAUNCHER_RUN_ROOT": str(root), **(env or {})}
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def sdiag_counts() -> Counter:
    """slurmctld's RPCs received since its last reset, by message type."""
    out = subprocess.run(["sdiag"], capture_output=True, text=True, check=True, timeout=60).stdout
    part = out.split("Remote Procedure Call statistics by message type", 1)[1].split("Remote Procedure Call", 1)[0]
    rows = re.findall(r"^\s*(\w+)\s+\(\s*\d+\)\s+count:(\d+)", part, re.M)
    return Counter({name: int(count) for name, count in rows})


class Watch:
    """inotify on a run directory and every folder in it (a folder created later is watched from then on)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir, self.inotify, self.folders, self.counts = run_dir, INotify(), {}, Counter()
        self.written = Counter()  # writes by the run directory's entry they fall in (heartbeats, logs, ...)
        for folder in [run_dir, *(p for p in run_dir.rglob("*") if p.is_dir())]:
            self._add(folder)

    def _add(self, folder: Path) -> None:
        try:
            self.folders[self.inotify.add_watch(folder, WATCHED)] = folder
        except OSError:
            pass  # gone already

    def drain(self, timeout_ms: int) -> None:
        for event in self.inotify.read(timeout=timeout_ms):
            is_dir = event.mask & flags.ISDIR
            if event.mask & flags.CREATE:
                self.counts["creates"] += 1
                if is_dir and event.wd in self.folders:
                    self._add(self.folders[event.wd] / event.name)
            elif event.mask & flags.MOVED_TO:
                self.counts["renames"] += 1
            elif event.mask & flags.DELETE:
                self.counts["unlinks"] += 1
            elif event.mask & flags.OPEN and is_dir and not event.name:
                self.counts["listings"] += 1
            elif event.mask & flags.MODIFY and event.wd in self.folders:
                self.counts["writes"] += 1
                self.written[(self.folders[event.wd] / event.name).relative_to(self.run_dir).parts[0]] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 and 2 nodes, a 35 s window")
    parser.add_argument("--window", type=float, default=None, help="seconds measured (default 180; 35 quick)")
    args = parser.parse_args()
    counts = [1, 2] if args.quick else [1, 2, 4]
    window = args.window or (35.0 if args.quick else 180.0)
    root = Path(tempfile.mkdtemp(prefix="bench-footprint-"))
    names = {n: f"footprint-{n}n" for n in counts}
    for n, name in names.items():
        res = launcher(root, "model=gpt_tiny", f"gpus={RANKS_PER_NODE * n}", f"layout.nodes={n}", "train.steps=100000",
                       "train.checkpoint_every=100000", "train.eval_every=0", f"name={name}",
                       env={"LAUNCHER_FAULT": "pace@0.25"})
        if res.returncode:
            print(res.stderr, file=sys.stderr)
            return 1
    try:
        deadline = time.time() + 600
        while not all((root / name / "metrics.jsonl").exists() for name in names.values()):
            if time.time() > deadline:
                print("the runs did not start training within 600 s", file=sys.stderr)
                return 1
            time.sleep(1)
        time.sleep(5)  # every rank's watchdog beating
        watches = {n: Watch(root / name) for n, name in names.items()}
        subprocess.run(["sdiag", "--reset"], check=True, capture_output=True, timeout=60)
        start = time.monotonic()
        while time.monotonic() - start < window:
            for watch in watches.values():
                watch.drain(timeout_ms=200)
        minutes = (time.monotonic() - start) / 60
        rpcs = sdiag_counts()
        rpcs.pop("REQUEST_STATS_INFO", None)  # this benchmark's own sdiag
        nodes_own = {kind: rpcs.pop(kind) for kind in CLUSTER_OWN if kind in rpcs}
        jobs = len(counts)
        print(f"controller: {sum(rpcs.values())} RPCs in {60 * minutes:.0f} s with {jobs} running jobs: "
              f"{sum(rpcs.values()) / jobs / minutes:.2f} per job per minute (goal: 1 or fewer)")
        for kind, count in rpcs.most_common():
            print(f"  {kind} {count}")
        print("  and the cluster's own, there without any job: "
              + (", ".join(f"{kind} {count}" for kind, count in nodes_own.items()) or "none"))
        print(f"file system, each run directory, per minute (steady state; {RANKS_PER_NODE} ranks a node):")
        for n, watch in watches.items():
            per = {kind: watch.counts[kind] / minutes for kind in KINDS}
            meta = sum(per[kind] for kind in KINDS[:4])
            print(f"  {n} node(s) x {RANKS_PER_NODE} ranks: " + ", ".join(f"{kind} {per[kind]:.1f}" for kind in KINDS)
                  + f"; metadata {meta:.1f} ({meta / n:.1f} per node, {meta / (n * RANKS_PER_NODE):.1f} per rank);"
                  f" writes {per['writes'] / n:.1f} per node, {per['writes'] / (n * RANKS_PER_NODE):.1f} per rank ("
                  + ", ".join(f"{entry} {count / minutes:.1f}" for entry, count in watch.written.most_common()) + ")")
        return 0
    finally:
        for name in names.values():
            launcher(root, "stop", name)


if __name__ == "__main__":
    raise SystemExit(main())
