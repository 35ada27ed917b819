"""Fixtures shared by the test suite: the local Slurm cluster that scripts/test.sh brings up."""
from __future__ import annotations

import os
import shutil
import subprocess
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
