"""On the local cluster every layout that fits its GPUs trains, and every layout it cannot run is refused
before sbatch: one line naming the value, exit 2, no run directory."""
from __future__ import annotations

import json

import pytest
from support.helpers import events as read_events

pytestmark = pytest.mark.slurm


@pytest.mark.parametrize("args", [["gpus=8"], ["gpus=4", "layout.nodes=1"]], ids=["8-on-1-node", "4-on-1-node"])
def test_single_node_layouts_of_many_tasks_train_to_completion(slurm, tmp_path, args):
    res = slurm.launcher("model=gpt_tiny", "train.steps=3", *args, root=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    (record,) = [json.loads(p.read_text()) for p in tmp_path.glob("*/run.json")]
    assert record["nodes"] == 1
    assert slurm.wait(record["job_id"], timeout=300) == "COMPLETED"
    events = [e["event"] for e in read_events(tmp_path / record["name"])]
    assert "finished" in events


@pytest.mark.parametrize("args, message", [
    (["cluster.gpus_per_node=16", "gpus=16", "layout.nodes=1"], "needs 16 GPUs per node; partition 'gpu' nodes have 8"),
    (["gpus=24"], "gpus=24 needs 3 nodes x 8 GPUs, but partition 'gpu' has 2 nodes"),
    (["gpus=8", "cluster.cpus_per_gpu=2"], "as 1 node x 8 tasks x 2 CPUs needs 16 CPUs per node; partition 'gpu' "
                                           "nodes have 8 CPUs; lower cluster.cpus_per_gpu (at most 1)"),
    (["gpus=8", "cluster.mem_per_gpu=1G"], "needs 8192 MB per node (cluster.mem_per_gpu=1G); partition 'gpu' "
                                           "nodes have 4096 MB"),
    (["cluster=slurm", "cluster.partition=gpu"], "needs 64 CPUs per node"),
])
def test_layouts_the_cluster_cannot_run_are_refused_before_sbatch(slurm, tmp_path, args, message):
    root = tmp_path / "runs"
    res = slurm.launcher("model=gpt_tiny", *args, root=root)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], \
        res.stderr
    assert "sbatch" not in lines[0]
    assert not root.exists() or not any(root.iterdir())


def test_an_sbatch_refusal_is_one_line_with_the_request_and_the_offer(slurm, tmp_path):
    root = tmp_path / "runs"
    res = slurm.launcher("model=gpt_tiny", "gpus=1", "cluster.mem=999999", root=root)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stderr
    assert lines[0].startswith("error: Slurm refused gpus=1 as 1 node x 1 task x 1 CPU on partition 'gpu' "
                               f"({len(slurm.nodes)} nodes x {slurm.gpus_per_node} GPUs"), lines
    assert "Requested node configuration is not available; ask for fewer CPUs" in lines[0]
    assert not root.exists() or not any(root.iterdir())
