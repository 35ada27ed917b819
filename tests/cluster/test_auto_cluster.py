"""``cluster=auto`` on real clusters: three local ones at once (one whose GPUs a sleeping job holds, one strict with a
QOS of 8 GPUs, one free), the suite's cluster reached over SSH (``remote_site``), and one whose controller takes
connections and never answers. A plan, a dry run and a launch of a 16-GPU run print one line per candidate, in
words; the plan and the dry run submit nothing anywhere, the launch submits to the free cluster (held: nothing
trains), and a run left waiting on the busy cluster is told by ``describe`` where it would start sooner.

The clusters have no accounting but the strict one (cheaper to start); the silent controller is a socket of this
test's that listens and never answers, so its line comes at the bound of ``scontrol ping`` without delaying the rest.
"""
from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from support.helpers import (REPO, cluster_port, job_id_of, own_cluster_port, run_down, run_launcher, run_up,
                             wait_for)

# Its clusters are on fixed ports (the module's fixture), and it uses the SSH site (a fixed sshd port): its tests
# run in the SSH site's group, on one worker, after one another.
pytestmark = pytest.mark.xdist_group("remote_site")
HELD = "+cluster.sbatch_flags.hold=true"  # submitted, never started: nothing trains
RUN = ("model=gpt_tiny", "gpus=16", "train.steps=5")
CANDIDATES = "cluster.candidates=[abusy,astrict,asilent,afree,asite]"


def start(state: Path, name: str, port: int, *more: str) -> Path:
    up = run_up("--dir", str(state), "--name", name, "--port", str(port), "--nodes", "2", "--gpus", "8", *more)
    assert up.returncode == 0, up.stderr
    return state / "etc" / "slurm.conf"


def cluster_file(folder: Path, name: str, *lines: str) -> None:
    (folder / f"{name}.yaml").write_text("\n".join([f"name: {name}", "gpus_per_node: 8", "virtual_gpus: true",
                                                    "cpus_per_gpu: 1", "time_limit_min: 30", *lines, ""]))


@pytest.fixture(scope="module")
def sites(remote_site, slurm, tmp_path_factory):
    """The candidates' cluster files in a site layer, the environment that finds them, each local cluster's
    slurm.conf, and the sleeping job that holds every GPU of the busy one."""
    base = tmp_path_factory.mktemp("auto")
    states = {name: base / name for name in ("busy", "strict", "free")}
    confs = {"abusy": start(states["busy"], "abusy", cluster_port("auto_busy"), "--no-accounting"),
             "astrict": start(states["strict"], "astrict", cluster_port("auto_strict"), "--strict", "root"),
             "afree": start(states["free"], "afree", own_cluster_port(), "--no-accounting")}
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)  # takes connections, answers none
    silent = base / "silent.conf"
    silent.write_text(confs["afree"].read_text().replace(f"SlurmctldPort={own_cluster_port()}",
                                                         f"SlurmctldPort={listener.getsockname()[1]}"))
    folder = base / "site" / "cluster"
    folder.mkdir(parents=True)
    for name, conf in {**confs, "asilent": silent}.items():
        cluster_file(folder, name, f"slurm_conf: {conf}")
    remote_root = f"{remote_site.home}/auto-runs-{os.getpid()}"
    cluster_file(folder, "asite", f"ssh: {remote_site.alias}", f"python: {remote_site.python}",
                 f"slurm_conf: {remote_site.slurm_conf}", f"run_root: {remote_root}", "ssh_timeout_s: 5")
    env = {**slurm.env, "LAUNCHER_SITE_CONFIG": str(base / "site"), "LAUNCHER_SSH_CONFIG": str(remote_site.ssh_config),
           "LAUNCHER_HOME": f"/tmp/lh-auto-{os.getpid()}", "LAUNCHER_RUN_ROOT": str(base / "runs")}
    sleeper = subprocess.run(["sbatch", "--parsable", "-N2", "--gpus-per-node=8", "-t", "30", "-o", "/dev/null",
                              "--wrap", "sleep 1800"], env={**slurm.env, "SLURM_CONF": str(confs["abusy"])},
                             capture_output=True, text=True)
    assert sleeper.returncode == 0, sleeper.stderr
    sites = {"env": env, "confs": confs, "root": base / "runs", "sleeper": sleeper.stdout.strip()}
    wait_for(lambda: queued(sites, "abusy") == [f"{sites['sleeper']} wrap R"], 30, "the sleeper running")
    yield sites
    listener.close()
    with ThreadPoolExecutor() as pool:  # each waits for its daemons to end: at once, not one after another
        list(pool.map(run_down, states.values()))
    subprocess.run(["rm", "-rf", env["LAUNCHER_HOME"]])
    remote_site.ssh("rm", "-rf", remote_root)


def launcher(sites, *args: str) -> subprocess.CompletedProcess:
    return run_launcher(*args, env=sites["env"], timeout=120, cwd=REPO, stdin=subprocess.DEVNULL)


def queued(sites, cluster: str) -> list[str]:
    env = {**sites["env"], "SLURM_CONF": str(sites["confs"][cluster])}
    out = subprocess.run(["squeue", "-h", "-o", "%i %j %t"], env=env, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def lines(stdout: str) -> dict[str, str]:
    """Each candidate's line by its cluster's name."""
    return {line.split(": ", 1)[0]: line.split(": ", 1)[1] for line in stdout.splitlines()
            if line.split(": ", 1)[0] in ("abusy", "astrict", "asilent", "afree", "asite")}


def said_why(found: dict[str, str]) -> None:
    assert found["afree"] == "starts now (16 GPUs free)", found
    assert re.fullmatch(r"starts in about (2\d|30) min \(16 of its 16 GPUs in use\)", found["abusy"]), found
    assert found["astrict"] == ("refused: gpus=16 can never start under QOS normal, which allows at most 8 GPUs to each "
                                "user at once (MaxTRESPerUser=gres/gpu=8): use gpus=8 or cluster.qos=big"), found
    assert found["asilent"] == "unreachable: 'scontrol ping' did not answer in 4 s", found
    assert found["asite"].startswith(("starts now", "starts in about")), found


def test_plan_and_a_dry_run_say_where_it_would_start_and_submit_nothing(sites):
    before = {cluster: queued(sites, cluster) for cluster in sites["confs"]}
    started = time.monotonic()
    plan = launcher(sites, "plan", "cluster=auto", CANDIDATES, *RUN)
    took = time.monotonic() - started
    assert plan.returncode == 0, plan.stderr
    said_why(lines(plan.stdout))
    assert "# plan gpt_tiny: " in plan.stdout and "cluster=afree" in plan.stdout, plan.stdout
    assert took < 25, took  # the silent controller's line came at its bound, and nothing waited longer
    dry = launcher(sites, "cluster=auto", CANDIDATES, *RUN, "dry_run=json")
    assert dry.returncode == 0, dry.stderr
    said_why(lines(dry.stderr))
    assert json.loads(dry.stdout)["overrides"][-2:] == ["cluster=afree", CANDIDATES]
    assert {cluster: queued(sites, cluster) for cluster in sites["confs"]} == before
    assert not sites["root"].exists() or not any(sites["root"].iterdir())


def test_a_waiting_run_is_told_where_it_would_start_sooner_and_a_launch_goes_where_it_starts_first(sites):
    waiting = launcher(sites, "cluster=abusy", "cluster.candidates=[abusy,afree]", *RUN, "name=waiting")
    assert waiting.returncode == 0, waiting.stderr
    described = launcher(sites, "describe", "waiting")
    assert described.returncode == 0, described.stderr
    hint = re.search(r"^  would start sooner on afree: now \(16 GPUs free\); .* move waiting cluster=afree$",
                     described.stdout, re.M)
    assert hint, described.stdout
    # Its job and its watcher out of the busy cluster's queue, so that it is as the other test found it.
    others = [line.split()[0] for line in queued(sites, "abusy") if not line.startswith(f"{sites['sleeper']} ")]
    subprocess.run(["scancel", *others], env={**sites["env"], "SLURM_CONF": str(sites["confs"]["abusy"])}, check=True)
    wait_for(lambda: len(queued(sites, "abusy")) == 1, 30, "the waiting run's jobs gone")
    res = launcher(sites, "cluster=auto", CANDIDATES, *RUN, HELD, "name=placed")
    assert res.returncode == 0, res.stderr
    said_why(lines(res.stdout))
    job = job_id_of(res.stdout)
    run_dir = sites["root"] / "placed"
    assert json.loads((run_dir / "run.json").read_text())["cluster"] == "afree"
    assert "cluster.candidates:\n- abusy\n- astrict\n- asilent\n- afree\n- asite\n" in (run_dir / "run.yaml").read_text()
    assert any(line.startswith(f"{job} ") for line in queued(sites, "afree"))
