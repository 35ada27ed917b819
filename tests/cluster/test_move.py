"""``launcher move``: a run waiting on a busy cluster moved to a free one trains there exactly as a run launched there
does; two moves at once give one job; a run that is not waiting is refused in one line.

The busy cluster is one of this module's own (1 node x 2 GPUs, as slurm/site/cluster/local2.yaml describes a second
cluster, found through $LAUNCHER_LOCAL2_CONF) on the suite's port + 950, whose node a sleeping job holds whole.
"""
from __future__ import annotations

import subprocess
import sys

import pytest

from support.helpers import (REPO, cluster_port, events, launch, losses, run_down, run_name, run_up, runs_json,
                             wait_status)

pytestmark = pytest.mark.xdist_group("move")  # a cluster of the module's own on a fixed port
RUN = ("model=gpt_tiny", "gpus=1", "train.steps=6", "train.log_every=1")


@pytest.fixture(scope="module")
def busy(slurm, tmp_path_factory):
    """The environment that makes ``cluster=local2`` a cluster whose one node a sleeping job holds."""
    port = cluster_port("move")
    state = tmp_path_factory.mktemp("busy")
    up = run_up("--dir", str(state), "--name", f"busy{port}", "--port", str(port), "--nodes", "1", "--gpus", "2",
                "--no-accounting")
    assert up.returncode == 0, up.stderr
    conf = str(state / "etc" / "slurm.conf")
    held = subprocess.run(["sbatch", "--parsable", "--exclusive", "--wrap", "sleep 900"], env={**slurm.env,
                          "SLURM_CONF": conf}, capture_output=True, text=True, timeout=60)
    assert held.returncode == 0, held.stderr
    yield {"LAUNCHER_LOCAL2_CONF": conf, "LAUNCHER_SITE_CONFIG": str(REPO / "slurm" / "site")}
    run_down(state)


def test_a_waiting_run_moved_to_a_free_cluster_trains_as_a_run_launched_there(slurm, busy, tmp_path):
    name = run_name(tmp_path, launch(slurm, tmp_path, "cluster=local2", *RUN, env=busy), "local2")
    direct = run_name(tmp_path, launch(slurm, tmp_path, "cluster=local", *RUN, env=busy))
    assert wait_status(slurm, tmp_path, name, {"PENDING"}, env=busy)["cluster"] == "local2"

    env = {**slurm.env, **busy, "LAUNCHER_RUN_ROOT": str(tmp_path)}
    moves = [subprocess.Popen([sys.executable, "-m", "launcher", "move", name, "cluster=local"], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    answers = sorted((move.wait(timeout=180), *move.communicate()) for move in moves)
    (ok, said, _), (refused, _, why) = answers
    assert (ok, refused) == (0, 2), answers
    assert said.startswith(f"Moved {name} from local2 (job ") and " to local as Slurm job " in said, said
    assert why.count("\n") == 1 and ("one job of a run at a time" in why or "already waits on" in why), why

    for run in (name, direct):
        assert wait_status(slurm, tmp_path, run, {"COMPLETED", "FAILED"}, timeout=240, env=busy)["status"] \
            == "COMPLETED", run
    run_dir = tmp_path / name
    assert losses(run_dir) == losses(tmp_path / direct)
    moved = [e for e in events(run_dir) if e["event"] == "moved"]
    assert len(moved) == 1 and (moved[0]["from_cluster"], moved[0]["cluster"]) == ("local2", "local"), moved
    attempts = [e for e in events(run_dir) if e["event"] == "attempt"]
    assert [(e["job_id"], e["cluster"]) for e in attempts] == [(moved[0]["job_id"], "local")]
    assert runs_json(slurm, tmp_path, busy)[name]["cluster"] == "local"
    described = slurm.launcher("describe", name, root=tmp_path, env=busy).stdout
    assert "Moved: from local2 at " in described and f"to local (job {moved[0]['job_id']})" in described, described

    again = slurm.launcher("move", name, "cluster=local2", root=tmp_path, env=busy)
    assert again.returncode == 2 and again.stderr.count("\n") == 1, again.stderr
    assert f"{name} is COMPLETED; only a waiting (PENDING) run moves" in again.stderr
