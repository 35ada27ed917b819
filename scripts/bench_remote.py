"""What a remote cluster (a cluster file with ``ssh:``, docs/remote.md) costs, as whole processes.

Goals: with a warm master, ``launcher runs`` over the local cluster and a remote one answers in under
1 s and within 1.5x of ``runs`` over the local runs alone; a launch to the remote cluster, its code already
shipped, costs at most 1 s more than a local launch; a cluster that does not answer costs at most its connect
timeout. Each pair is timed alternately (both see the same load) and medians compared. Launches are held
(``+cluster.sbatch_flags.hold=true``) and cancelled at the end.

It uses the clusters your config layers define: ``--cluster NAME`` names the remote one (its file has ``ssh:``);
the local one is ``local`` (slurm/up.sh). ``--quick``: 2 repeats, for tests/cluster/test_remote.py.

    python scripts/bench_remote.py --cluster mysite [--repeats 7] [--quick]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, List

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
LOCAL_ROOT = tempfile.mkdtemp(prefix="bench-remote-")
HELD = ("model=gpt_tiny", "gpus=1", "train.steps=1", "+cluster.sbatch_flags.hold=true")


def launcher(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, capture_output=True, text=True,
                          env={**ENV, "LAUNCHER_RUN_ROOT": LOCAL_ROOT, **(env or {})}, timeout=300)


def timed(*args: str, env: dict | None = None) -> float:
    start = time.perf_counter()
    res = launcher(*args, env=env)
    took = time.perf_counter() - start
    if res.returncode != 0:
        raise SystemExit(f"launcher {' '.join(args)} failed: {res.stderr.strip()[-500:]}")
    return took


def alternate(first: Callable[[], float], second: Callable[[], float], repeats: int) -> tuple:
    a, b = [], []
    for _ in range(repeats):
        a.append(first())
        b.append(second())
    return statistics.median(a), statistics.median(b)


def unreachable_cluster(site: Path, timeout_s: int) -> dict:
    """A config layer in ``site`` with one more remote cluster, at an address that never answers."""
    layers = [p for p in os.environ.get("LAUNCHER_SITE_CONFIG", "").split(os.pathsep) if p]
    (site / "cluster").mkdir()
    for layer in layers:  # the user's own remote cluster stays defined beside it
        for path in Path(layer, "cluster").glob("*.yaml"):
            (site / "cluster" / path.name).write_text(path.read_text())
    (site / "cluster" / "silent.yaml").write_text(f"name: silent\nssh: ssh://10.255.255.1:22\n"
                                                  f"ssh_timeout_s: {timeout_s}\n")
    return {"LAUNCHER_SITE_CONFIG": str(site)}


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cluster", required=True, help="the remote cluster to measure (its file names ssh:)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    site = Path(tempfile.mkdtemp(prefix="bench-remote-site-"))
    try:
        return measure(args.cluster, 2 if args.quick else args.repeats, site)
    finally:  # the local runs and the config layer go with the benchmark
        shutil.rmtree(LOCAL_ROOT, ignore_errors=True)
        shutil.rmtree(site, ignore_errors=True)


def measure(cluster: str, repeats: int, site: Path) -> int:
    launcher("runs", "--cluster", cluster)  # the master opened and the code shipped: warm from here on
    both, local = alternate(lambda: timed("runs"), lambda: timed("runs", "--root", LOCAL_ROOT), repeats)
    print(f"runs over local and {cluster}: {both:.3f} s, local alone {local:.3f} s; "
          f"ratio {both / local:.2f}x (goal 1.5x, and under 1 s)")

    names: List[str] = []

    def launch(target: str) -> Callable[[], float]:
        def one() -> float:
            name = f"bench-{target}-{len(names)}"
            names.append(name)
            return timed(f"cluster={target}", *HELD, f"name={name}")
        return one

    try:
        far, near = alternate(launch(cluster), launch("local"), repeats)
        print(f"launch to {cluster}: {far:.3f} s, local {near:.3f} s; ratio {far / near:.2f}x, "
              f"{far - near:+.3f} s (goal at most +1 s)")
    finally:
        if names:
            launcher("delete", "--yes", *names)

    env = unreachable_cluster(site, timeout_s=2)
    silent = statistics.median(timed("runs", env=env) for _ in range(repeats))
    print(f"runs with a cluster that never answers (ssh_timeout_s=2): {silent:.3f} s, the rest {both:.3f} s; "
          f"ratio {silent / both:.2f}x (goal: at most the timeout more)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
