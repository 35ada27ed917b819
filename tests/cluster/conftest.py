"""The cluster tier's fixtures: the suite's local cluster (slurm/up.sh, brought up by scripts/test.sh), clusters a
test has to itself, the time-limited run, and the SSH site. Every test here uses one of them, or carries the
``slurm`` mark itself (tests/conftest.py)."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from support.helpers import (PACE_S, PACED_STEPS, REPO, SITE_KILL_WAIT_S, SLURMD_TIMEOUT_S, STEADY_RUN, SlurmCluster,
                             cluster_port,
                             job_id_of, launch, losses, own_cluster_port, paced, run_down, run_up, shared_once,
                             wait_for)
from support.sshd_site import SSHD, started_site


def unavailable(reason: str):
    """Skip a test whose fixture cannot be had on this machine; in CI, where it must be had, fail it."""
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm() -> SlurmCluster:
    """The cluster from slurm/up.sh. Skips only where Slurm truly cannot run; in CI it must."""
    env = dict(os.environ)
    env.setdefault("SLURM_CONF", str(REPO / ".slurm" / "etc" / "slurm.conf"))
    reason = None
    if shutil.which("sbatch") is None:
        reason = "Slurm is not installed (run scripts/setup.sh)"
    elif "UP" not in subprocess.run(["scontrol", "ping"], env=env, capture_output=True, text=True).stdout:
        reason = "the local Slurm cluster is not up (run slurm/up.sh, or use scripts/test.sh)"
    if reason:
        unavailable(reason)
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    gres = subprocess.run(["sinfo", "-h", "-N", "-o", "%G"], env=env, capture_output=True, text=True,
                          check=True).stdout.split()[0]
    return SlurmCluster(env=env, nodes=sorted(set(nodes)), gpus_per_node=int(gres.split(":")[-1]))


# A test that needs a whole cluster (every GPU free, its daemons killed, its controller stopped) has one of its own,
# ``own_cluster`` or ``three``, which start in a few seconds beside the suite's; the others share the suite's.
def start_cluster(slurm: SlurmCluster, state: Path, name: str, port: int, nodes: int, gpus: int,
                  timers: dict[str, int] | None = None) -> SlurmCluster:
    """A local cluster beside the suite's, its state in ``state``: ``nodes`` x ``gpus``, with accounting, and
    slurm.conf's ``timers`` (``SlurmdTimeout``, ``KillWait``: seconds) set as given."""
    up = run_up("--dir", str(state), "--name", name, "--port", str(port), "--nodes", str(nodes), "--gpus", str(gpus))
    assert up.returncode == 0, up.stderr
    env = {**slurm.env, "SLURM_CONF": str(state / "etc" / "slurm.conf")}
    cluster = SlurmCluster(env=env, nodes=[f"{name}-node{n}" for n in range(1, nodes + 1)], gpus_per_node=gpus)
    if timers:
        slurm_conf = state / "etc" / "slurm.conf"
        text = slurm_conf.read_text()
        for key, seconds in timers.items():
            text = re.sub(rf"^{key}=\d+", f"{key}={seconds}", text, flags=re.M)
        slurm_conf.write_text(text)
        cluster.run("scontrol", "reconfigure")
    return cluster


@pytest.fixture
def own_cluster(slurm, tmp_path_factory):
    """A cluster of the test's own shaped as the suite's (2 nodes x 8 GPUs): for a test that needs every GPU free,
    or kills the cluster's daemons. Stopped after the test."""
    state = tmp_path_factory.mktemp("own")
    port = own_cluster_port()
    yield start_cluster(slurm, state, f"own{port}", port, nodes=len(slurm.nodes), gpus=slurm.gpus_per_node)
    run_down(state)


@pytest.fixture
def three(slurm, tmp_path_factory):
    """A cluster of the test's own, 3 nodes x 2 GPUs, for the faults of the cluster itself (a node lost, the
    controller stopped); a lost node is noticed after ``SLURMD_TIMEOUT_S``. Stopped after the test."""
    state = tmp_path_factory.mktemp("three")
    port = own_cluster_port()
    yield start_cluster(slurm, state, f"three{port}", port, nodes=3, gpus=2,
                        timers={"SlurmdTimeout": SLURMD_TIMEOUT_S}), state
    run_down(state)


@pytest.fixture
def site_kill_wait(slurm, tmp_path_factory):
    """A cluster of the test's own, 1 node x 2 GPUs, that gives a job's tasks Slurm's default (and a site's usual)
    KillWait of 30 s between its SIGTERM and its SIGKILL; the suite's clusters give 5 s, which keeps their cancels
    quick. Stopped after the test."""
    state = tmp_path_factory.mktemp("kw")
    port = own_cluster_port()
    yield start_cluster(slurm, state, f"kw{port}", port, nodes=1, gpus=2, timers={"KillWait": SITE_KILL_WAIT_S})
    run_down(state)


@dataclass(frozen=True)
class Steady:
    """The steady run: called, it waits for the run's end and gives its losses; ``run_dir`` has its records."""

    slurm: SlurmCluster
    root: Path

    def __call__(self) -> dict[int, float]:
        return self.slurm.wait((self.root / "job").read_text(), timeout=400) == "COMPLETED" and losses(self.run_dir)

    @property
    def run_dir(self) -> Path:
        return self.root / "steady"


@pytest.fixture(scope="session")
def steady(slurm, tmp_path_factory) -> Steady:
    """The steady run (``STEADY_RUN``), never interrupted: what every interrupted run of that config must reproduce
    (the recovery and preemption tests). Launched once per session by the first worker that asks."""
    def submit(root: Path) -> None:
        (root / "job").write_text(launch(slurm, root, "name=steady", defaults=STEADY_RUN))

    return Steady(slurm, shared_once(tmp_path_factory, "steady", submit))


@dataclass(frozen=True)
class TimeLimited:
    """The time-limited run: its cluster, run directory, job, when it was submitted, and the file its test touches
    once it has read what it needs (the cluster stays up until then)."""

    cluster: SlurmCluster
    run_dir: Path
    job: str
    submitted: float
    checked: Path


@pytest.fixture(scope="session")
def time_limited(slurm, tmp_path_factory):
    """A run that needs 4 or more attempts of a 2-minute time limit, on a cluster of one node x 2 GPUs of its own
    (no other test's job or fault falls on one of its requeues). Started once per session, with the session
    (``_the_time_limited_run_starts_first``), by whichever worker comes first; its test is handed out last
    (tests/conftest.py, ``order``), so that its minutes of wall time pass beside the other tests and keep no worker
    waiting. The worker that started it stops its cluster at the end of its session, once the test is done."""
    port = cluster_port("limited")

    def start(shared: Path) -> None:
        cluster = start_cluster(slurm, shared / "c", f"limited{port}", port, nodes=1, gpus=2)
        # Each attempt trains what is left of its minute after a slow start on a machine the other tests keep busy:
        # the cluster's daemons, and so its jobs' processes (which inherit it), come first for the CPU.
        for pidfile in (shared / "c" / "run").glob("slurm*.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.setpriority(os.PRIO_PROCESS, int(pidfile.read_text()), -10)
        res = cluster.launcher("model=gpt_tiny", "gpus=2", f"train.steps={PACED_STEPS}", "train.log_every=1",
                               "train.checkpoint_every=0", "cluster.time_limit_min=2", "cluster.signal_delay_s=60",
                               "name=limited", root=shared / "runs", env=paced(PACE_S))
        assert res.returncode == 0, res.stderr
        (shared / "job").write_text(job_id_of(res.stdout))
        (shared / "started").write_text(f"{os.environ.get('PYTEST_XDIST_WORKER', '')} {time.time()}")

    # Short names: slurmstepd's sockets live under the state directory, and a socket path has at most 108 bytes.
    shared = shared_once(tmp_path_factory, "limited", start)
    starter, submitted = (shared / "started").read_text().split(" ")
    env = {**slurm.env, "SLURM_CONF": str(shared / "c" / "etc" / "slurm.conf")}
    run = TimeLimited(SlurmCluster(env=env, nodes=[f"limited{port}-node1"], gpus_per_node=2), shared / "runs" / "limited",
                      (shared / "job").read_text(), float(submitted), shared / "checked")
    yield run
    if starter == os.environ.get("PYTEST_XDIST_WORKER", ""):
        with contextlib.suppress(AssertionError):  # at most as long as its test would wait
            wait_for(lambda: run.checked.exists(), max(60.0, 2400 - (time.time() - run.submitted)),
                     "the time-limited run's test", interval=2)
        run_down(shared / "c")


@pytest.fixture(scope="session", autouse=True)
def _the_time_limited_run_starts_first(request):
    """Slurm's limits are whole minutes: when the time-limited test is among those collected, its run starts with
    the session (every pytest-xdist worker collects every test; the first to get here starts it)."""
    if any("time_limited" in getattr(item, "fixturenames", ()) for item in request.session.items):
        request.getfixturevalue("time_limited")


@pytest.fixture(scope="session")
def remote_site(slurm, tmp_path_factory):
    """The suite's cluster as a remote site reached over SSH (tests/support/sshd_site.py): a real sshd on 127.0.0.1,
    a second Unix user, an ssh_config whose alias logs in as that user. Needs root and openssh-server; skips without
    them, except in CI. Its port is fixed per suite, so its tests share one worker (tests/conftest.py)."""
    if os.geteuid() != 0:
        unavailable("the SSH site needs root (it makes a user and runs sshd)")
    if not os.access(SSHD, os.X_OK):
        unavailable("openssh-server is not installed (run scripts/setup.sh)")
    with started_site(slurm.env, tmp_path_factory.mktemp("sshd-site")) as site:
        yield site
