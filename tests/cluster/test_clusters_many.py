"""Two local clusters at once: both listed, a run on each, runs/describe/logs/stop on both, one of them down.

The second cluster (slurm/site/cluster/local2.yaml, a site layer; found through $LAUNCHER_LOCAL2_CONF) is
started here on the first cluster's port + 100 (helpers.cluster_port: 16910 beside the default cluster;
README's local2 uses 16850), so the suite runs beside whichever cluster $SLURM_CONF names.
"""
from __future__ import annotations

import json
import re
import time

import pytest

from support.helpers import REPO, cluster_port, run_down, run_name, run_up, runs_json, wait_status
from support.helpers import launch as submit

# One worker makes its second cluster on a fixed port (a module-scoped fixture) for all the tests here.
pytestmark = pytest.mark.xdist_group("clusters_many")


@pytest.fixture(scope="module")
def local2(slurm, tmp_path_factory):
    """The environment that makes ``cluster=local2`` the fixture's second cluster."""
    port = cluster_port("local2")
    state = tmp_path_factory.mktemp("local2")
    up = run_up("--dir", str(state), "--name", f"two{port}", "--port", str(port), "--nodes", "1", "--gpus", "2",
                "--no-accounting")
    assert up.returncode == 0, up.stderr
    yield {"LAUNCHER_LOCAL2_CONF": str(state / "etc" / "slurm.conf"), "STATE_DIR": str(state),
           "LAUNCHER_SITE_CONFIG": str(REPO / "slurm" / "site")}  # where local2.yaml lives
    down(state)


def down(state) -> None:
    run_down(state)


def run_cmd(slurm, root, env, *args, timeout=60):
    res = slurm.launcher(*args, root=root, env=env, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res.stdout


def clusters(slurm, root, env) -> dict:
    return {c["cluster"]: c for c in json.loads(run_cmd(slurm, root, env, "clusters", "--json"))}


def launch(slurm, root, env, cluster, *args):
    """Launch a 1-GPU gpt_tiny run on ``cluster``; return its name."""
    job = submit(slurm, root, f"cluster={cluster}", "model=gpt_tiny", "gpus=1", *args, env=env, timeout=120)
    return run_name(root, job, cluster)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


def test_clusters_lists_both(slurm, root, local2):
    listed = clusters(slurm, root, local2)
    assert listed["local"]["reachable"] and listed["local2"]["reachable"]
    assert [p["gpus_total"] for p in listed["local2"]["partitions"]] == [2]
    assert sum(p["gpus_total"] for p in listed["local"]["partitions"]) == len(slurm.nodes) * slurm.gpus_per_node
    table = run_cmd(slurm, root, local2, "clusters")
    assert re.search(r"^local2 +gpu\* +gpu +2 ", table, re.M), table


def test_a_run_on_each_cluster_is_listed_described_logged_and_stopped(slurm, root, local2):
    done = {cluster: launch(slurm, root, local2, cluster, "train.steps=3") for cluster in ("local", "local2")}
    held = {cluster: launch(slurm, root, local2, cluster, "train.steps=100000", "+cluster.sbatch_flags.hold=true")
            for cluster in ("local", "local2")}
    for cluster, name in done.items():
        assert wait_status(slurm, root, name, {"COMPLETED", "FAILED"}, timeout=180)["status"] == "COMPLETED"
    rows = runs_json(slurm, root)
    assert {rows[name]["cluster"] for name in done.values()} == {"local", "local2"}
    table = run_cmd(slurm, root, {}, "runs")
    assert re.search(rf"^{done['local2']} +\d+ +local2 ", table, re.M), table
    for cluster, name in done.items():
        assert f"Run {name}: Slurm job" in run_cmd(slurm, root, {}, "describe", name)
        assert f"on cluster {cluster}" in run_cmd(slurm, root, {}, "describe", name)
        assert "step" in run_cmd(slurm, root, {}, "logs", name)
    for cluster, name in held.items():
        assert rows[name]["status"] == "PENDING"
        assert f"Stopped {name}" in run_cmd(slurm, root, {}, "stop", name)
        assert wait_status(slurm, root, name, {"CANCELLED"}, timeout=30)["status"] == "CANCELLED"


def test_with_the_second_cluster_down_clusters_and_runs_still_answer(slurm, root, local2):
    held = {cluster: launch(slurm, root, local2, cluster, "train.steps=100000", "+cluster.sbatch_flags.hold=true")
            for cluster in ("local", "local2")}
    down(local2["STATE_DIR"])
    start = time.time()
    listed = clusters(slurm, root, local2)
    print(f"clusters with local2 down: {time.time() - start:.2f} s")
    assert listed["local"]["reachable"] and not listed["local2"]["reachable"]
    assert "Slurm is not reachable" in listed["local2"]["error"]

    start = time.time()
    rows = runs_json(slurm, root)
    print(f"runs --json with local2 down: {time.time() - start:.2f} s")
    assert set(rows) == {json.loads(p.read_text())["name"] for p in root.glob("*/run.json")}
    assert rows[held["local"]]["status"] == "PENDING"
    lost = rows[held["local2"]]
    assert (lost["cluster"], lost["status"]) == ("local2", "UNKNOWN") and "could not be reached" in lost["reason"], lost
    assert f"Stopped {held['local']}" in run_cmd(slurm, root, {}, "stop", held["local"])
