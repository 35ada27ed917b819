"""The streamed-data benchmark still runs, end to end, in its quick mode: it starts moto's server and the suite's
proxy, prepares its datasets with the launcher's code, trains through ``python -m launcher.train`` from a local
dataset and from the bucket, and prints its three figures. Nothing here is about speed (a shared 2-core machine
measures its neighbours); only that the figures are there, and that no shard was downloaded twice by a node."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from support.helpers import REPO as ROOT

# The cluster tier, with or without a cluster: it trains through ``python -m launcher.train`` four times.
pytestmark = pytest.mark.slurm

NUMBER = r"[0-9][0-9,]*(?:\.[0-9]+)?"
# Only a bound on a hung benchmark: the quick mode takes about 25 s on an idle 2-core machine.
BOUND_S = 600


def test_bench_data_quick_prints_its_ratios():
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    # a session of its own: a hung benchmark is ended with what it started (moto's server, the ranks)
    bench = subprocess.Popen([sys.executable, "scripts/bench_data.py", "--quick"], cwd=ROOT, env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        text, err = bench.communicate(timeout=BOUND_S)
    except subprocess.TimeoutExpired:
        os.killpg(bench.pid, signal.SIGKILL)
        text, err = bench.communicate()
        pytest.fail(f"scripts/bench_data.py --quick still running after {BOUND_S} s:\n{text[-3000:]}{err[-3000:]}")
    assert bench.returncode == 0, text[-3000:] + err[-3000:]
    assert re.search(rf"^\(1\) streamed/local step time: {NUMBER} s / {NUMBER} s; local/streamed = {NUMBER} ",
                     text, re.M), text
    gets = re.search(rf"^\(2\) GETs per node / shards read: ({NUMBER}) / ({NUMBER}) = {NUMBER} ", text, re.M)
    assert gets, text
    assert gets[1] == gets[2] and gets[1] != "0", text  # every shard a node read, downloaded by it once
    assert re.search(rf"^\(3\) first step: small {NUMBER} s, large {NUMBER} s, ratio {NUMBER} \(dataset "
                     rf"{NUMBER}x", text, re.M), text
