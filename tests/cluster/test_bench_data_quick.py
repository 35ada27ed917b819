"""The streamed-data benchmark still runs, end to end, in its quick mode: it starts moto's server and the suite's
proxy, prepares its datasets with the launcher's code, trains through ``python -m launcher.train`` from a local
dataset and from the bucket, and prints its three figures. Nothing here is about speed (a shared 2-core machine
measures its neighbours); only that the figures are there, and that no shard was downloaded twice by a node."""
from __future__ import annotations

import os
import re
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
    out = subprocess.run([sys.executable, "scripts/bench_data.py", "--quick"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=BOUND_S)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert re.search(rf"^\(1\) streamed/local step time: {NUMBER} s / {NUMBER} s; local/streamed = {NUMBER} ",
                     text, re.M), text
    gets = re.search(rf"^\(2\) GETs per node / shards read: ({NUMBER}) / ({NUMBER}) = {NUMBER} ", text, re.M)
    assert gets, text
    assert int(gets[1]) > 0 and gets[1] == gets[2], text  # every shard a node read, downloaded by it once
    assert re.search(rf"^\(3\) first step: small {NUMBER} s, large {NUMBER} s, ratio {NUMBER} \(dataset "
                     rf"{NUMBER}x", text, re.M), text
