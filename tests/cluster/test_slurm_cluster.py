"""The local Slurm cluster (slurm/up.sh) behaves like a real multi-node GPU cluster."""
from __future__ import annotations

import os
import socket
import subprocess

import pytest

from support.helpers import DOWN, cluster_port, run_up


def test_two_node_job_runs_one_task_per_node_with_8_gpus(own_cluster, tmp_path):
    out = tmp_path / "out.txt"
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        "srun bash -c 'echo task=$SLURM_PROCID node=$SLURMD_NODENAME gpus=$SLURM_GPUS_ON_NODE'\n"
    )
    res = own_cluster.run("sbatch", "--parsable", "-N", "2", "--ntasks-per-node=1",
                    f"--gpus-per-node={own_cluster.gpus_per_node}", "-o", str(out), str(script))
    job_id = res.stdout.strip().split(";")[0]
    assert own_cluster.wait(job_id) == "COMPLETED"
    lines = sorted(out.read_text().split("\n"))
    lines = [line for line in lines if line]
    assert lines == [
        f"task=0 node={own_cluster.nodes[0]} gpus={own_cluster.gpus_per_node}",
        f"task=1 node={own_cluster.nodes[1]} gpus={own_cluster.gpus_per_node}",
    ]
    # Node names resolve, so tasks can rendezvous by name.
    assert socket.gethostbyname(own_cluster.nodes[0]) == "127.0.0.1"


@pytest.mark.parametrize(
    "args, message",
    [
        (["-N", "3"], "Node count specification invalid"),
        (["-N", "1", "--gpus-per-node=9"], "Requested node configuration is not available"),
    ],
)
def test_oversized_request_is_rejected_by_slurm(slurm, args, message):
    res = slurm.run("sbatch", *args, "--wrap", "true", check=False)
    assert res.returncode != 0
    assert message in res.stderr


@pytest.mark.slurm  # starts munged (and a fake slurmctld) for a cluster of its own
def test_up_reports_a_daemon_that_dies_with_its_log(tmp_path):
    """Fault injection: a slurmctld that exits at once must be named, with its log, and nothing left."""
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "slurmctld").write_text("#!/bin/sh\necho 'fatal: injected failure' >&2\nexit 1\n")
    (fake / "slurmctld").chmod(0o755)
    state = tmp_path / "state"
    port = cluster_port("dies")
    res = run_up("--dir", str(state), "--name", f"dies{port}", "--no-accounting", "--port", str(port),
                 env_extra={"PATH": f"{fake}:{os.environ['PATH']}"})
    assert res.returncode != 0
    assert f"slurmctld died during start-up; read {state}/log/slurmctld.log" in res.stderr
    assert "injected failure" in (state / "log" / "slurmctld.log").read_text()
    assert not list((state / "run").glob("*.pid")), "a failed start must stop what it started"


@pytest.mark.slurm  # starts a cluster of its own
def test_up_twice_is_harmless_and_down_leaves_nothing_running(tmp_path):
    state = tmp_path / "state"
    port = cluster_port("twice")
    args = ("--dir", str(state), "--name", f"twice{port}", "--no-accounting", "--nodes", "1", "--gpus", "2",
            "--port", str(port))
    first = run_up(*args)
    assert first.returncode == 0, first.stderr
    pids = {p.name: p.read_text() for p in (state / "run").glob("*.pid")}
    assert len(pids) >= 3  # munged, slurmctld, one slurmd
    second = run_up(*args)
    assert second.returncode == 0, second.stderr
    assert {p.name: p.read_text() for p in (state / "run").glob("*.pid")} == pids
    assert f"export SLURM_CONF={state}/etc/slurm.conf" in second.stdout

    down = subprocess.run(["bash", DOWN, "--dir", str(state)], capture_output=True, text=True, timeout=60)
    assert down.returncode == 0
    for pid in pids.values():
        assert not os.path.exists(f"/proc/{pid.strip()}"), f"process {pid} still running after down.sh"
    again = subprocess.run(["bash", DOWN, "--dir", str(state)], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0
