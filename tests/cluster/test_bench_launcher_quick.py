"""The launcher's benchmarks run in their quick modes and print their figures (scripts/bench_status.py,
scripts/bench_launch.py, scripts/bench_sweep.py, scripts/bench_bringup.py, scripts/bench_rendezvous.py). Nothing about
speed is asserted: a shared machine's timings are no test's business; that each benchmark still runs and says what it
measured is, and so are the counts it reports (operations found where they were made, every client registered)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.helpers import REPO

# The cluster tier, with or without a cluster: each times whole launcher processes, over hundreds of runs
# (docs/development.md).
pytestmark = pytest.mark.slurm

RATIO = re.compile(r"ratio +\d+\.\d\dx")


def bench(script: str, env: dict, tmp: Path, timeout: float = 240) -> list[str]:
    """Run ``scripts/SCRIPT --quick`` as a process, as a user would; its output lines (it must succeed). Its
    temporary run roots go under ``tmp``, which pytest clears, not into /tmp."""
    result = subprocess.run([sys.executable, str(REPO / "scripts" / script), "--quick"], cwd=REPO,
                            env={**env, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp)}, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


def figures(lines: list[str]) -> list[str]:
    return [line for line in lines if RATIO.search(line)]


def test_bench_status_quick_prints_its_four_figures(tmp_path):
    lines = figures(bench("bench_status.py", dict(os.environ), tmp_path))
    assert [line.split()[0] for line in lines] == ["cold", "cold", "finished", "finished"], lines
    assert all("import tabulate" in line and "over 300 runs" in line for line in lines), lines


def test_bench_launch_quick_without_a_cluster_times_the_dry_run_and_says_it_skipped_the_submission(tmp_path):
    env = {**os.environ, "SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}
    lines = bench("bench_launch.py", env, tmp_path)
    assert [line.split()[1] for line in figures(lines)] == ["dry_run=json"], lines
    assert any(line.startswith("launcher (real submission)") and "skipped" in line for line in lines), lines


def test_bench_launch_quick_on_a_cluster_times_both(slurm, tmp_path):
    lines = figures(bench("bench_launch.py", slurm.env, tmp_path))
    assert [line.split("  ")[0] for line in lines] == ["launcher dry_run=json", "launcher (real submission)"], lines
    assert all("import hydra, submitit" in line for line in lines), lines


def test_bench_sweep_quick_without_a_cluster_says_it_skipped(tmp_path):
    lines = bench("bench_sweep.py", {**os.environ, "SLURM_CONF": str(tmp_path / "no-such-slurm.conf")}, tmp_path)
    assert figures(lines) == [] and any(line.startswith("12-point grid submission") and "skipped" in line
                                        for line in lines), lines


def test_bench_sweep_quick_on_a_cluster_times_a_grid_both_ways(slurm, tmp_path):
    (line,) = figures(bench("bench_sweep.py", slurm.env, tmp_path))
    assert "(12 sbatch, 12 watchers)" in line and "(1 sbatch, 1 watcher)" in line, line


def table(lines: list[str], title: str) -> dict[str, dict[str, int]]:
    """The rows under the line that starts with ``title`` (a header of column names, then indented rows), by row
    and column."""
    start = next(index for index, line in enumerate(lines) if line.startswith(title))
    columns = lines[start + 1].split()
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("  "):
            break
        label, *values = line.split()
        rows[label] = dict(zip(columns, (int(value.replace(",", "")) for value in values)))
    return rows


def test_bench_bringup_quick_counts_a_ranks_metadata_operations_by_kind_and_by_where(slurm, tmp_path):
    lines = bench("bench_bringup.py", slurm.env, tmp_path)
    rank, node = table(lines, "per rank"), table(lines, "per node")
    assert {"stat", "open", "getdents64", "readlink", "access", "all", "fstat"} <= set(rank), lines
    every = rank["all"]
    assert all(every[where] > 0 for where in ("torch", "env", "stdlib", "run-code", "run-dir")), every
    parts = sum(every[where] for where in ("torch", "env", "run-code", "run-dir"))
    assert abs(every["shared"] - parts) <= 2, every  # each rounded from a median of two ranks
    assert rank["open"]["torch"] > 0 and rank["open"]["run-code"] > 0, rank["open"]
    assert node["all"]["shared"] >= every["shared"], (node, every)  # a node's two ranks
    assert any(line.startswith("the job's opens (its 2 ranks): under torch") for line in lines), lines
    assert [line.split()[0] for line in lines if line.strip().startswith(("1,024", "16,384"))] == ["1,024", "16,384"]


def test_bench_rendezvous_quick_registers_every_client_with_either_server(tmp_path):
    lines = bench("bench_rendezvous.py", dict(os.environ), tmp_path)
    rows = [line.split() for line in lines if line.startswith(("libuv ", "legacy "))]
    assert [(row[0], row[1], row[-1]) for row in rows] == [("libuv", "64", "64"), ("legacy", "64", "64")], lines
