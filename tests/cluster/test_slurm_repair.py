"""slurm/up.sh repairs a cluster with a daemon gone instead of restarting it: the node comes back into
service and the jobs, running and pending, go on under the same ids (on the shared test cluster, which
the test leaves as it found it)."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from support.helpers import UP, cluster_port, run_down, run_up, wait_for
# slurm/up.sh's settings file, key -> the variable that sets it.
SETTINGS_ENV = {"name": "SLURM_LOCAL_NAME", "nodes": "SLURM_LOCAL_NODES", "gpus": "SLURM_LOCAL_GPUS",
                "cpus": "SLURM_LOCAL_CPUS", "mem": "SLURM_LOCAL_MEM_MB", "port": "SLURM_LOCAL_PORT",
                "accounting": "SLURM_LOCAL_ACCOUNTING", "min_job_age": "SLURM_LOCAL_MIN_JOB_AGE",
                "strict": "SLURM_LOCAL_STRICT"}


def up_env(slurm) -> dict:
    """The environment that makes up.sh address the cluster under test with the settings it was started with."""
    state = Path(slurm.env["SLURM_CONF"]).parent.parent
    settings = dict(item.split("=", 1) for item in (state / "settings").read_text().split())
    return {**slurm.env, "SLURM_LOCAL_DIR": str(state), **{SETTINGS_ENV[k]: v for k, v in settings.items()}}


def job_state(slurm, job: str) -> str:
    out = slurm.run("squeue", "-h", "-j", job, "-o", "%T", check=False).stdout.strip()
    return out or slurm.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", job).stdout.split()[0]


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, IndexError):
        return True


def test_up_after_slurmds_died_starts_only_them_and_the_jobs_survive(own_cluster):
    """One node's slurmd dies under a running job; another's dies and Slurm marks its node down."""
    env = up_env(own_cluster)
    node, idle = own_cluster.nodes[0], own_cluster.nodes[-1]
    assert node != idle, "the test cluster has two nodes or more"
    run_dir = Path(env["SLURM_LOCAL_DIR"]) / "run"
    others = {p.name: p.read_text() for p in run_dir.glob("*.pid") if not p.name.startswith(f"slurmd-{node}.")
              and not p.name.startswith(f"slurmd-{idle}.")}
    running = own_cluster.run("sbatch", "--parsable", "-o", "/dev/null", "-w", node, "-N1", "-n1", "--wrap",
                              "sleep 15").stdout.strip()
    wait_for(lambda: job_state(own_cluster, running) == "RUNNING", 60, f"start of job {running}", interval=0.2)
    # Every node whole: it waits for the first job, so it is pending when the slurmd dies.
    pending = own_cluster.run("sbatch", "--parsable", "-o", "/dev/null", "-N", str(len(own_cluster.nodes)), "--exclusive", "--wrap",
                        "true").stdout.strip()
    assert job_state(own_cluster, pending) == "PENDING"

    pids = {n: int((run_dir / f"slurmd-{n}.pid").read_text()) for n in (node, idle)}
    for pid in pids.values():
        os.kill(pid, 9)
        wait_for(lambda: gone(pid), 60, f"end of slurmd {pid}", interval=0.2)
    own_cluster.run("scontrol", "update", f"nodename={idle}", "state=down", "reason=slurmd died")  # as after SlurmdTimeout
    res = subprocess.run(["bash", UP], env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"Repaired: started slurmd-{node} slurmd-{idle} (running jobs left alone)." in res.stdout
    assert all(int((run_dir / f"slurmd-{n}.pid").read_text()) != pid for n, pid in pids.items())
    assert {p.name: p.read_text() for p in run_dir.glob("*.pid") if not p.name.startswith(f"slurmd-{node}.")
            and not p.name.startswith(f"slurmd-{idle}.")} == others  # nothing else was restarted
    for n in (node, idle):
        state = own_cluster.run("sinfo", "-h", "-n", n, "-o", "%T").stdout.split()[0]
        assert state in ("allocated", "mixed", "idle", "completing"), (n, state)
    assert job_state(own_cluster, running) in ("RUNNING", "COMPLETING", "COMPLETED")  # the same job, not requeued
    assert job_state(own_cluster, pending) in ("PENDING", "RUNNING", "COMPLETING", "COMPLETED")
    assert own_cluster.wait(running, timeout=120).startswith("COMPLETED")
    assert own_cluster.wait(pending, timeout=120).startswith("COMPLETED")

    again = subprocess.run(["bash", UP], env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0 and "Repaired" not in again.stdout and "is up" in again.stdout


@pytest.mark.slurm  # starts a cluster of its own
def test_a_real_restart_is_asked_for_with_restart_and_only_then_cancels_jobs(tmp_path):
    """On a cluster of its own: up.sh with everything running changes nothing; --restart starts anew."""
    state = tmp_path / "state"
    port = cluster_port("restart")
    args = ("--dir", str(state), "--name", f"rst{port}", "--no-accounting", "--nodes", "1", "--gpus", "1",
            "--port", str(port))
    assert run_up(*args).returncode == 0
    env = {**os.environ, "SLURM_CONF": str(state / "etc" / "slurm.conf")}
    try:
        job = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "--hold", "--wrap", "true"], env=env, capture_output=True,
                             text=True, check=True).stdout.strip()
        queued = lambda: subprocess.run(["squeue", "-h", "-o", "%i"], env=env, capture_output=True,  # noqa: E731
                                        text=True).stdout.split()
        pids = {p.name: p.read_text() for p in (state / "run").glob("*.pid")}
        again = run_up(*args)
        assert again.returncode == 0 and "Repaired" not in again.stdout
        assert {p.name: p.read_text() for p in (state / "run").glob("*.pid")} == pids and queued() == [job]
        restarted = run_up(*args, "--restart")
        assert restarted.returncode == 0, restarted.stderr
        assert queued() == [] and {p.name: p.read_text() for p in (state / "run").glob("*.pid")} != pids
    finally:
        run_down(state)
