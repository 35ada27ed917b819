"""``launcher move``: a run waiting on a busy cluster moved to a free one trains there exactly as a run launched there
does; two moves at once give one job; a run that is not waiting is refused in one line; a run with a checkpoint
moved to a cluster over SSH resumes there from it.

The busy cluster is one of this module's own (1 node x 2 GPUs, as slurm/site/cluster/local2.yaml describes a second
cluster, found through $LAUNCHER_LOCAL2_CONF) on the suite's port + 950, whose node a sleeping job holds whole.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.helpers import (REPO, UNTIL_STOPPED, cluster_port, events, launch, losses, run_down, run_name, run_up,
                             runs_json, wait_for, wait_status)

# A cluster of the module's own on a fixed port, and the SSH site's fixed sshd port: the SSH site's group, one worker.
pytestmark = pytest.mark.xdist_group("remote_site")
RUN = ("model=gpt_tiny", "gpus=1", "train.steps=6", "train.log_every=1")


@pytest.fixture(scope="module")
def local2(tmp_path_factory):
    """The environment that makes ``cluster=local2`` this module's second cluster."""
    port = cluster_port("move")
    state = tmp_path_factory.mktemp("local2")
    up = run_up("--dir", str(state), "--name", f"busy{port}", "--port", str(port), "--nodes", "1", "--gpus", "2",
                "--no-accounting")
    assert up.returncode == 0, up.stderr
    yield {"LAUNCHER_LOCAL2_CONF": str(state / "etc" / "slurm.conf"),
           "LAUNCHER_SITE_CONFIG": str(REPO / "slurm" / "site")}
    run_down(state)


def occupy(slurm, env) -> str:
    """Hold the second cluster's one node with a sleeping job (cancelled by :func:`free`); its job id."""
    held = subprocess.run(["sbatch", "--parsable", "--exclusive", "--output=/dev/null", "--wrap", "sleep 900"],
                          env={**slurm.env, "SLURM_CONF": env["LAUNCHER_LOCAL2_CONF"]}, capture_output=True, text=True,
                          timeout=60)
    assert held.returncode == 0, held.stderr
    return held.stdout.strip()


def free(slurm, env, job: str) -> None:
    subprocess.run(["scancel", job], env={**slurm.env, "SLURM_CONF": env["LAUNCHER_LOCAL2_CONF"]}, timeout=60)


@pytest.fixture
def busy(slurm, local2):
    """``local2`` while a sleeping job holds its node."""
    job = occupy(slurm, local2)
    yield local2
    free(slurm, local2, job)


def test_a_waiting_run_moved_to_a_free_cluster_trains_as_a_run_launched_there(slurm, busy, tmp_path):
    name = run_name(tmp_path, launch(slurm, tmp_path, "cluster=local2", *RUN, env=busy), "local2")
    direct = run_name(tmp_path, launch(slurm, tmp_path, "cluster=local", *RUN, env=busy))
    assert wait_status(slurm, tmp_path, name, {"PENDING"}, env=busy)["cluster"] == "local2"

    env = {**slurm.env, **busy, "LAUNCHER_RUN_ROOT": str(tmp_path)}
    # two moves at once, one to a named cluster, one to where it starts first (cluster=auto: local, the only other)
    moves = [subprocess.Popen([sys.executable, "-m", "launcher", "move", name, target], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for target in ("cluster=local", "cluster=auto")]
    answers = sorted((move.wait(timeout=180), *move.communicate()) for move in moves)
    (ok, said, _), (refused, _, why) = answers
    assert (ok, refused) == (0, 2), answers
    assert f"Moved {name} from local2 (job " in said and " to local as Slurm job " in said, said
    assert said.startswith((f"Moved {name}", "local: starts now")), said  # auto's: each candidate's line first
    assert why.count("\n") == 1 and any(words in why for words in (
        "one job of a run at a time", "already waits on", f"{name} stays on local: no other candidate would start "
        "it sooner (local2: ", "only a waiting (PENDING) run moves")), why

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


SITE = "movesite"


@pytest.fixture
def laptop(remote_site, local2, tmp_path):
    """A site config directory naming ``local2`` and the SSH site (``movesite``, the suite's cluster as another user),
    a launcher home of its own; the site's run root is removed afterwards."""
    site = tmp_path / "site" / "cluster"
    site.mkdir(parents=True)
    shutil.copy(REPO / "slurm" / "site" / "cluster" / "local2.yaml", site)
    remote_root = f"{remote_site.home}/move-runs-{os.getpid()}"
    (site / f"{SITE}.yaml").write_text("\n".join([
        f"name: {SITE}", f"ssh: {remote_site.alias}", f"python: {remote_site.python}",
        f"slurm_conf: {remote_site.slurm_conf}", f"run_root: {remote_root}", "gpus_per_node: 8",
        "virtual_gpus: true", "cpus_per_gpu: 1", "time_limit_min: 30", "ssh_timeout_s: 5", ""]))
    home = Path("/tmp") / f"lh-move-{os.getpid()}"  # short: the masters' sockets live there
    yield {**local2, "LAUNCHER_SITE_CONFIG": str(tmp_path / "site"), "LAUNCHER_HOME": str(home),
           "LAUNCHER_SSH_CONFIG": str(remote_site.ssh_config), "REMOTE_ROOT": remote_root}
    subprocess.run(["ssh", "-F", str(remote_site.ssh_config), "-o", f"ControlPath={home}/ssh/%C", "-O", "exit",
                    remote_site.alias], capture_output=True)
    remote_site.ssh("rm", "-rf", remote_root)
    shutil.rmtree(home, ignore_errors=True)


def test_a_waiting_run_with_a_checkpoint_moved_over_ssh_resumes_there_from_it(slurm, laptop, remote_site, tmp_path):
    job = launch(slurm, tmp_path, "cluster=local2", "train.steps=400", "train.checkpoint_every=1000", defaults=RUN,
                 env={**laptop, **UNTIL_STOPPED})
    name = run_name(tmp_path, job, "local2")
    run_dir = tmp_path / name
    wait_for(lambda: (run_dir / "metrics.jsonl").exists(), 120, f"a step of {name}", patient=True)
    stopped = slurm.launcher("stop", name, root=tmp_path, env=laptop)
    assert f"Stopped {name}" in stopped.stdout, stopped.stderr
    saved = next(e["step"] for e in events(run_dir) if e["event"] == "stopped")
    held = occupy(slurm, laptop)
    try:
        resumed = slurm.launcher("resume", name, root=tmp_path, env=laptop)
        assert resumed.returncode == 0, resumed.stderr
        wait_status(slurm, tmp_path, name, {"PENDING"}, env=laptop)
        moved = slurm.launcher("move", name, f"cluster={SITE}", root=tmp_path, env=laptop)
    finally:
        free(slurm, laptop, held)
    assert moved.returncode == 0 and f"Moved {name} from local2 (job " in moved.stdout, moved.stderr
    assert not run_dir.exists() and len(list((tmp_path / ".moved").glob(f"{name}.*"))) == 1
    there = f"{laptop['REMOTE_ROOT']}/{name}"

    def remote_events():
        answer = remote_site.ssh("cat", f"{there}/events.jsonl")
        return [json.loads(line) for line in answer.stdout.splitlines()]
    wait_for(lambda: any(e["event"] == "finished" for e in remote_events()), 240, f"{name}'s end there", patient=True)
    assert [e["step"] for e in remote_events() if e["event"] == "resumed"] == [saved]
    move = next(e for e in remote_events() if e["event"] == "moved")
    assert (move["from_cluster"], move["cluster"]) == ("local2", SITE)
    rows = {row["name"]: row for row in json.loads(slurm.launcher("runs", "--json", root=tmp_path, env=laptop).stdout)}
    assert rows[name]["cluster"] == SITE and rows[name]["status"] == "COMPLETED", rows
    described = slurm.launcher("describe", name, root=tmp_path, env=laptop).stdout  # asked there, where the run is
    assert f"Run {name}: Slurm job {move['job_id']} on cluster {SITE}" in described, described
    assert "Moved: from local2" in described, described
