"""Fixtures shared by the test suite: the local Slurm cluster that scripts/test.sh brings up."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from helpers import REPO, SlurmCluster, cluster_lock, cluster_port, job_id_of, run_down, run_up, wait_for
from sshd_site import SSHD, started_site

# The fixtures that are, or stand on, a running cluster: a test that uses one is marked ``slurm``
# (pytest_itemcollected), so that ``pytest -m "not slurm"`` runs without a cluster. A test that starts
# a cluster of its own with slurm/up.sh carries the mark itself.
CLUSTER_FIXTURES = {"slurm", "three", "limited", "time_limited", "remote_site"}
# Clusters of their own: their tests run in one group, ``three``, started first, beside the time-limited run.
OWN_CLUSTERS = {"three", "limited"}
# Session fixtures that any number of workers may each set up on their own (the rest are shared state: a
# cluster on a fixed port, a run to reuse; their tests go to one worker).
PER_WORKER = {"slurm", "_unreachable_slurm", "_start_the_time_limited_run_early"}


def xdist_group(item) -> str | None:
    """The group of tests that must run in one pytest-xdist worker (``--dist loadgroup``), in order: those
    on the second cluster (``three``: one cluster, one time-limited run), those sharing a session fixture
    (its name), those mounting a tmpfs, and those sharing a module fixture (their module). A module without
    a cluster is one group (its module-scoped data is made once). Any other cluster test runs on its own."""
    scopes = {name: defs[-1].scope for name, defs in item._fixtureinfo.name2fixturedefs.items() if defs}
    if OWN_CLUSTERS & set(scopes):
        return "three"
    if "tmpfs" in scopes:
        return "tmpfs"
    shared = sorted(name for name, defs in item._fixtureinfo.name2fixturedefs.items() if defs
                    and defs[-1].scope == "session" and defs[-1].func.__module__ == __name__ and name not in PER_WORKER)
    if shared:
        return shared[0]
    module = item.module.__name__ if item.module else item.nodeid.split("::")[0]
    if item.get_closest_marker("slurm") is None or any(scope in ("module", "package") for scope in scopes.values()):
        return module
    return None


def pytest_itemcollected(item):
    """The mark as the item is collected, before ``-m`` selects."""
    if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.slurm)


# pytest-xdist's own loadgroup cannot read groups under pytest 9 (it renames item._nodeid, which pytest 9 no longer
# reads), so the groups go to the controller in a file: each worker writes the groups it collected, and the
# scheduler below reads them. Its units are handed out in the order collected (no reordering by size).
GROUPS_FILE = "SUITE_XDIST_GROUPS"


def pytest_configure(config):
    if not under_xdist(config) and getattr(config.option, "dist", "no") != "no":
        os.environ[GROUPS_FILE] = str(Path(tempfile.mkdtemp(prefix="xdist-groups-")) / "groups.json")


def pytest_collection_modifyitems(config, items):
    if not under_xdist(config):
        return
    # The second cluster's group first, for its time-limited run takes the longest; then the cluster tests,
    # which mostly wait; then the rest.
    items.sort(key=lambda item: 0 if xdist_group(item) == "three" else 1 if item.get_closest_marker("slurm") else 2)
    path = Path(os.environ[GROUPS_FILE])
    written = path.with_suffix(f".{config.workerinput['workerid']}")
    written.write_text(json.dumps({item.nodeid: xdist_group(item) for item in items}))
    written.replace(path)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") in ("no", "each"):  # -n alone means --dist load: groups must hold there too
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Each group of tests one unit of work, run in one worker in order; every other test a unit of its own."""

        groups = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(Path(os.environ[GROUPS_FILE]).read_text())
            group = self.groups.get(nodeid)
            return f"group:{group}" if group else nodeid

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


def under_xdist(config) -> bool:
    return hasattr(config, "workerinput")


# What a test not marked ``slurm`` finds of Slurm's client tools: a controller that cannot be contacted, at once
# (a real client given no reachable controller waits for its timeouts, up to a minute). Such a test never uses a
# cluster, whether one is up or not; one that needs a cluster and lacks the mark fails instead of using it.
SLURM_CLIENTS = ("sinfo", "squeue", "sacct", "sacctmgr", "scontrol", "sbatch", "srun", "scancel", "sstat")
UNREACHABLE = ('#!/bin/sh\necho "$(basename "$0"): error: Unable to contact slurm controller (connect failure)'
               ' [a test not marked slurm: tests/conftest.py]" >&2\nexit 1\n')


@pytest.fixture(scope="session")
def _unreachable_slurm(tmp_path_factory) -> Path:
    stubs = tmp_path_factory.mktemp("no-slurm")
    for name in SLURM_CLIENTS:
        (stubs / name).write_text(UNREACHABLE)
        (stubs / name).chmod(0o755)
    return stubs


@pytest.fixture(autouse=True)
def _no_cluster_unless_marked(request, monkeypatch):
    if request.node.get_closest_marker("slurm") is None:
        stubs = request.getfixturevalue("_unreachable_slurm")
        monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ['PATH']}")


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


@pytest.fixture(scope="session")
def remote_site(slurm, tmp_path_factory):
    """The suite's cluster as a remote site reached over SSH (tests/sshd_site.py): a real sshd on 127.0.0.1, a
    second Unix user, an ssh_config whose alias logs in as that user. Needs root and openssh-server; skips without
    them, except in CI. Its port is fixed per suite, so its tests share one worker (xdist_group)."""
    if os.geteuid() != 0:
        unavailable("the SSH site needs root (it makes a user and runs sshd)")
    if not os.access(SSHD, os.X_OK):
        unavailable("openssh-server is not installed (run scripts/setup.sh)")
    with started_site(slurm.env, tmp_path_factory.mktemp("sshd-site")) as site:
        yield site


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs("1m")`` mounts a filesystem of that size under ``tmp_path`` (or at ``at``; unmounted after the test):
    a disk that fills up for real, or that is made read-only. Needs root; skips without it, except in CI."""
    mounted = []

    def mount(size: str, at: Path | None = None) -> Path:
        path = at or tmp_path / f"disk{len(mounted)}"
        path.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"cannot mount a tmpfs: {result.stderr.strip()}")
            pytest.skip(f"cannot mount a tmpfs (needs root): {result.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:  # lazily where a job's last process still holds it: it goes when that one ends
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)


@pytest.fixture(scope="session")
def reference_config(tmp_path_factory) -> dict:
    """A 2-rank run of 6 steps, checkpointed and evaluated every 3 (tests/train_harness.py)."""
    from train_harness import make_tokens, tiny_config

    tokens = make_tokens(tmp_path_factory.mktemp("data") / "tokens.bin")
    return tiny_config(tokens, steps=6, checkpoint_every=3, eval_every=3, keep_checkpoints=2)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, reference_config) -> Path:
    """That run, uninterrupted (``python -m launcher.train`` on 2 ranks): what resumed runs must reproduce exactly."""
    from train_harness import check_ok, launch_ranks, make_run_dir

    run_dir = make_run_dir(tmp_path_factory.mktemp("reference"), reference_config, world_size=2, micro_batch=2)
    check_ok(launch_ranks(["-m", "launcher.train", str(run_dir)], world_size=2))
    return run_dir


# A lost node is noticed by Slurm only after SlurmdTimeout; the second cluster sets it to 10 s (a site uses
# minutes), so tests wait seconds, not minutes, for what a site's cluster does the same way.
SLURMD_TIMEOUT_S = 10
# The time-limited run: each attempt trains at most about 52 s (the signal comes 30-60 s after the start,
# Slurm's 30-second tick, and starting takes 8 s or more), so 180 s of paced steps need at least 4 attempts.
PACE_S, PACED_STEPS = 0.1, 1800


def extra_cluster(slurm, state: Path, purpose: str, nodes: int, gpus: int) -> SlurmCluster:
    """A local cluster of its own beside the suite's (its port from helpers.PORT_OFFSETS), state in ``state``."""
    port = cluster_port(purpose)
    up = run_up("--dir", str(state), "--name", f"{purpose}{port}", "--port", str(port), "--nodes", str(nodes),
                "--gpus", str(gpus))
    assert up.returncode == 0, up.stderr
    env = {**slurm.env, "SLURM_CONF": str(state / "etc" / "slurm.conf")}
    return SlurmCluster(env=env, nodes=[f"{purpose}{port}-node{n}" for n in range(1, nodes + 1)], gpus_per_node=gpus)


@pytest.fixture(scope="session")
def three(slurm, tmp_path_factory):
    """A second local cluster beside the suite's own: 3 nodes x 2 GPUs for the faults of the cluster itself."""
    state = tmp_path_factory.mktemp("three")
    cluster = extra_cluster(slurm, state, "three", nodes=3, gpus=2)
    slurm_conf = state / "etc" / "slurm.conf"
    slurm_conf.write_text(re.sub(r"^SlurmdTimeout=\d+", f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
                                 slurm_conf.read_text(), flags=re.M))
    cluster.run("scontrol", "reconfigure")
    yield cluster, state
    run_down(state)


@pytest.fixture(scope="session")
def limited(slurm, tmp_path_factory):
    """A cluster of one node x 2 GPUs for the time-limited run alone: the faults ``three`` suffers (its controller
    stopped for a minute) would otherwise fall on one of the run's requeues and fail it."""
    state = tmp_path_factory.mktemp("limited")
    yield extra_cluster(slurm, state, "limited", nodes=1, gpus=2)
    run_down(state)


@pytest.fixture(scope="session")
def time_limited(limited, tmp_path_factory):
    """A run that needs 4 or more attempts of a 2-minute time limit (started first)."""
    root = tmp_path_factory.mktemp("time_limited")
    res = limited.launcher("model=gpt_tiny", "gpus=2", f"train.steps={PACED_STEPS}", "train.log_every=1",
                           "train.checkpoint_every=0", "cluster.time_limit_min=2", "cluster.signal_delay_s=60",
                           "name=limited", root=root, env={"LAUNCHER_FAULT": f"pace@{PACE_S}"})
    assert res.returncode == 0, res.stderr
    return limited, root / "limited", job_id_of(res.stdout), time.time()


@pytest.fixture(scope="session", autouse=True)
def _start_the_time_limited_run_early(request):
    """The time-limited run takes minutes of wall time; when its test is among those collected, it starts
    with the session and runs on its own node while the other tests run. Under pytest-xdist every worker
    collects every test: the run starts instead with the first test of the ``three`` group, handed out first
    (its own cluster, ``limited``, beside the group's)."""
    if under_xdist(request.config):
        return
    if any("test_time_limit_slurm.py" in item.nodeid for item in request.session.items):
        request.getfixturevalue("time_limited")


@pytest.fixture(autouse=True)
def _time_limited_run_beside_the_three_group(request):
    if under_xdist(request.config) and "three" in request.fixturenames and any(
            "test_time_limit_slurm.py" in item.nodeid for item in request.session.items):
        request.getfixturevalue("time_limited")


# Cluster tests run side by side (pytest-xdist workers), each holding a shared lock on the suite's cluster; one
# marked ``whole_cluster`` (it needs every GPU free, or kills the cluster's daemons) holds it alone.
# Tests on clusters of their own need no lock.
@pytest.fixture(autouse=True)
def _share_the_cluster(request):
    if request.node.get_closest_marker("slurm") is None or "slurm" not in request.fixturenames \
            or OWN_CLUSTERS & set(request.fixturenames):  # the tests on clusters of their own use only those
        yield
        return
    whole = request.node.get_closest_marker("whole_cluster") is not None
    with cluster_lock(exclusive=whole):
        if whole:  # the jobs of tests just ended may hold their GPUs a while after sacct says they ended, and
            # one a test left queued would start during this one (a held job waits for ever: not counted)
            cluster = request.getfixturevalue("slurm")

            def idle() -> bool:
                listed = cluster.run("squeue", "-h", "-t", "RUNNING,COMPLETING,PENDING", "-o", "%i %r").stdout
                return not [line for line in listed.splitlines() if "JobHeld" not in line]
            wait_for(idle, 300, "no job running or about to run on the cluster")
        yield
