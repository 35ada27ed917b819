"""Fixtures shared by the test suite: the local Slurm cluster that scripts/test.sh brings up."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SlurmCluster:
    """A running local cluster: the environment its client tools need, and its shape."""

    env: dict
    nodes: list[str]
    gpus_per_node: int

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def wait(self, job_id: str, timeout: float = 180) -> str:
        """Poll sacct until the job reaches a final state; return it."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            out = self.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id).stdout.split()
            if out and out[0].split()[0] in FINAL_STATES:
                return out[0]
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} did not finish in {timeout} s")

    def launcher(self, *args: str, root: Path, timeout: float = 60, env: dict | None = None
                 ) -> subprocess.CompletedProcess:
        """Run ``python -m launcher ARGS`` as a user would, with runs under ``root``."""
        env = {**self.env, **(env or {}), "LAUNCHER_RUN_ROOT": str(root)}
        return subprocess.run([sys.executable, "-m", "launcher", *args], env=env, capture_output=True,
                              text=True, timeout=timeout, cwd=REPO)


def overridden(defaults: tuple, extra: tuple) -> list:
    """A test's default overrides with ``extra`` replacing those of the same key (the launcher refuses a key
    given twice)."""
    keys = {arg.split("=", 1)[0] for arg in extra}
    return [arg for arg in defaults if arg.split("=", 1)[0] not in keys] + list(extra)


FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


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
        if os.environ.get("CI"):
            pytest.fail(reason)
        pytest.skip(reason)
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], env=env, capture_output=True, text=True,
                           check=True).stdout.split()
    gres = subprocess.run(["sinfo", "-h", "-N", "-o", "%G"], env=env, capture_output=True, text=True,
                          check=True).stdout.split()[0]
    return SlurmCluster(env=env, nodes=sorted(set(nodes)), gpus_per_node=int(gres.split(":")[-1]))


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs("1m")`` mounts a filesystem of that size under ``tmp_path`` (unmounted after the test): a disk
    that fills up for real. Needs root; skips without it, except in CI."""
    mounted = []

    def mount(size: str) -> Path:
        path = tmp_path / f"disk{len(mounted)}"
        path.mkdir()
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
    """That run, uninterrupted (``python -m train`` on 2 ranks): what resumed runs must reproduce exactly."""
    from train_harness import check_ok, launch, make_run_dir

    run_dir = make_run_dir(tmp_path_factory.mktemp("reference"), reference_config, world_size=2, micro_batch=2)
    check_ok(launch(["-m", "train", str(run_dir)], world_size=2))
    return run_dir


# A lost node is noticed by Slurm only after SlurmdTimeout; the second cluster sets it to 10 s (a site uses
# minutes), so tests wait seconds, not minutes, for what a site's cluster does the same way.
SLURMD_TIMEOUT_S = 10
# The time-limited run: each attempt trains at most about 52 s (the signal comes 30-60 s after the start,
# Slurm's 30-second tick, and starting takes 8 s or more), so 180 s of paced steps need at least 4 attempts.
PACE_S, PACED_STEPS = 0.1, 1800


@pytest.fixture(scope="session")
def three(slurm, tmp_path_factory):
    """A second local cluster beside the suite's own (port + 200): 3 nodes x 2 GPUs for the faults, and a
    fourth for the time-limited run."""
    conf = Path(slurm.env["SLURM_CONF"]).read_text()
    port = int(re.search(r"^SlurmctldPort=(\d+)", conf, re.M).group(1)) + 200
    state = tmp_path_factory.mktemp("three")
    up = subprocess.run(["bash", str(REPO / "slurm" / "up.sh"), "--dir", str(state), "--name", f"three{port}",
                         "--port", str(port), "--nodes", "4", "--gpus", "2"], capture_output=True, text=True,
                        timeout=180)
    assert up.returncode == 0, up.stderr
    env = {**slurm.env, "SLURM_CONF": str(state / "etc" / "slurm.conf")}
    cluster = SlurmCluster(env=env, nodes=[f"three{port}-node{n}" for n in (1, 2, 3, 4)], gpus_per_node=2)
    slurm_conf = state / "etc" / "slurm.conf"
    slurm_conf.write_text(re.sub(r"^SlurmdTimeout=\d+", f"SlurmdTimeout={SLURMD_TIMEOUT_S}",
                                 slurm_conf.read_text(), flags=re.M))
    cluster.run("scontrol", "reconfigure")
    yield cluster, state
    subprocess.run(["bash", str(REPO / "slurm" / "down.sh"), "--dir", str(state)], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def time_limited(three, tmp_path_factory):
    """A run that needs 4 or more attempts of a 2-minute time limit, on the fourth node (started first)."""
    cluster, _ = three
    root = tmp_path_factory.mktemp("time_limited")
    res = cluster.launcher("model=gpt_tiny", "gpus=2", f"train.steps={PACED_STEPS}", "train.log_every=1",
                           "train.checkpoint_every=0", "cluster.time_limit_min=2", "cluster.signal_delay_s=60",
                           f"+cluster.sbatch_flags.nodelist={cluster.nodes[3]}", "name=limited", root=root,
                           env={"LAUNCHER_FAULT": f"pace@{PACE_S}"})
    assert res.returncode == 0, res.stderr
    return cluster, root / "limited", re.search(r"as Slurm job (\d+)", res.stdout).group(1), time.time()


@pytest.fixture(scope="session", autouse=True)
def _start_the_time_limited_run_early(request):
    """The time-limited run takes minutes of wall time; when its test is among those collected, it starts
    with the session and runs on its own node while the other tests run."""
    if any("test_time_limit_slurm.py" in item.nodeid for item in request.session.items):
        request.getfixturevalue("time_limited")
