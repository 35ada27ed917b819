"""`python -m launcher` on the real local cluster: multi-node tasks, records, refusals."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.helpers import job_id_of


def test_multirun_submits_one_job_per_point_and_returns_at_once(slurm, tmp_path):
    res = slurm.launcher("-m", "gpus=1,2", "model=gpt_tiny", "train.steps=500", root=tmp_path)
    assert res.returncode == 0, res.stderr
    records = [json.loads(p.read_text()) for p in tmp_path.glob("*/run.json")]
    assert sorted(r["gpus"] for r in records) == [1, 2]
    assert len({r["sweep"] for r in records}) == 1 and records[0]["sweep"].startswith("sweep-")
    job_ids = [r["job_id"] for r in records]
    queued = slurm.run("squeue", "-h", "-o", "%i", "-j", ",".join(job_ids)).stdout.split()
    assert sorted(queued) == sorted(job_ids), "the launcher must return while its jobs are still queued or running"
    for line in (records[0]["name"], records[1]["name"], records[0]["sweep"]):
        assert line in res.stdout
    slurm.run("scancel", *job_ids)


@pytest.mark.parametrize(
    "args, env, message",
    [
        (["gpus=24"], {}, "gpus=24 needs 3 nodes x 8 GPUs, but partition 'gpu' has 2 nodes x 8 GPUs (at most 16 GPUs)"),
        (["cluster.partition=big"], {}, "the cluster has no partition 'big' (partitions: gpu)"),
        (["model=gpt_tiny"], {"SLURM_CONF": "/nonexistent/slurm.conf"}, "Slurm is not reachable"),
        (["run_root=/proc/launcher-runs"], {}, "run root /proc/launcher-runs cannot be created"),
    ],
)
def test_refused_launches_submit_and_record_nothing(slurm, tmp_path, args, env, message):
    root = tmp_path / "runs"
    res = slurm.launcher(*args, root=root, env=env)
    assert res.returncode == 2
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], res.stderr
    dry = slurm.launcher(*args, "dry_run=true", root=root, env=env)  # the same check, the same words
    if "SLURM_CONF" in env:  # no cluster to ask is no refusal: the dry run says what it could not check
        assert dry.returncode == 0 and "not checked: the partition's limits on cluster local" in dry.stderr, dry.stderr
    else:
        assert dry.returncode == 2 and "#SBATCH" in dry.stdout, dry.stderr
        assert f"a launch would be refused: {lines[0].removeprefix('error: ')}" in dry.stderr.splitlines()
    assert not root.exists() or not any(root.iterdir())
    # No job writes its output under this root (other sessions' jobs may come and go meanwhile).
    assert str(root) not in slurm.run("squeue", "-h", "-O", "JobID:12,StdOut:500").stdout


def test_shell_metacharacters_in_values_never_run(slurm, tmp_path):
    marker = tmp_path / "pwned"
    data = Path(f"{tmp_path}/data/$(touch {marker})`touch {marker}`;touch {marker}")
    data.parent.mkdir(parents=True)
    data.write_bytes(bytes(4096))  # a real token file (the launch checks data.path) with a dangerous name
    res = slurm.launcher(f"data.path='{data}'",
                         "model=gpt_tiny", "gpus=1", "train.steps=1", "name=meta", root=tmp_path)
    assert res.returncode == 0, res.stderr
    slurm.wait(job_id_of(res.stdout))
    assert not marker.exists()
    assert "touch" not in (tmp_path / "meta" / "sbatch.sh").read_text()
