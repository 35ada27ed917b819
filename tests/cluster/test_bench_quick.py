"""The benchmark and the GPU check still run, end to end, in their quick CPU modes: each composes its run
directories with the launcher's code, trains through ``python -m launcher.train`` and prints its figures. Nothing
here is about speed (a shared 2-core machine measures its neighbours); only that the figures are there."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from support.helpers import REPO as ROOT

# The cluster tier, with or without a cluster: each trains through ``python -m launcher.train`` for tens of
# seconds (docs/development.md).
pytestmark = pytest.mark.slurm

NUMBER = r"[0-9][0-9,]*(?:\.[0-9]+)?"
# Only a bound on a hung benchmark: a quick mode takes about 30 s on an idle 2-core machine and over 180 s on a
# slower one whose cores the rest of the suite keeps busy (seen in a fresh-clone run).
BOUND_S = 600


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def test_bench_train_quick_prints_its_ratios():
    out = subprocess.run([sys.executable, "scripts/bench_train.py", "--quick"], cwd=ROOT, env=env(),
                         capture_output=True, text=True, timeout=BOUND_S)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert re.search(r"composed \(1 rank\): gpt_tiny d_model=64 n_layers=2 .*global_batch=2 micro_batch=2", text), text
    assert re.search(r"composed \(2 ranks\): gpt_tiny d_model=64 n_layers=2 .*global_batch=4 micro_batch=2", text), text
    assert re.search(rf"\(a\) overhead: ours {NUMBER} tok/s / plain {NUMBER} tok/s = {NUMBER}", text), text
    assert re.search(rf"\(b\) scaling: 2 ranks {NUMBER} tok/s/rank / 1 rank {NUMBER} tok/s/rank = {NUMBER}", text), text
    assert re.search(rf"machine ceiling: .* = {NUMBER}", text), text


def test_gpu_check_quick_prints_its_table_on_cpu(tmp_path):
    performance = (ROOT / "docs" / "performance.md").read_text()
    out = subprocess.run(["bash", "scripts/gpu_check.sh", "--quick"], cwd=ROOT, capture_output=True, text=True,
                         env={**env(), "PYTHON": sys.executable, "WORK": str(tmp_path), "STEPS": "6"}, timeout=BOUND_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert re.search(rf"^\| gpt_tiny \| false \| {NUMBER} \| n/a \| {NUMBER} \|", out.stdout, re.M), out.stdout
    assert "not appended" in out.stdout
    assert (ROOT / "docs" / "performance.md").read_text() == performance  # quick figures are not GPU figures
    run_dir = tmp_path / "gpt_tiny_compile_false"
    assert {"config.yaml", "plan.json", "run.yaml"} <= {p.name for p in run_dir.iterdir()}  # as a launch writes


def test_bench_export_quick_prints_its_memory_ratios():
    out = subprocess.run([sys.executable, "scripts/bench_export.py", "--quick"], cwd=ROOT, env=env(),
                         capture_output=True, text=True, timeout=BOUND_S)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = re.findall(rf"^export gpt_small \({NUMBER} MB fp32, (\d+) file\(s\), .*--max-shard-size (\d+)MB\): "
                       rf"peak {NUMBER} MB, .* = {NUMBER}$", out.stdout, re.M)
    assert [shard for _, shard in lines] == ["2000", "500"], out.stdout
