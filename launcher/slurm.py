"""Thin, typed wrappers over the Slurm client tools (sinfo, scontrol, squeue, sacct, scancel).

Everything the launcher knows about Slurm comes through here, always by running the client tools with an
argument list (never a shell), with a timeout, and with SLURM_CONF pointing at the chosen cluster.
"""
from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
LOCAL_SLURM_CONF = REPO / ".slurm" / "etc" / "slurm.conf"
TIMEOUT_S = 20


class SlurmError(RuntimeError):
    """A Slurm client tool failed or could not be reached; the message is one line for the user."""


def slurm_conf_for(cluster_name: str, slurm_conf: Optional[str]) -> Optional[str]:
    """The slurm.conf to use: the configured one, else the project's local cluster for ``local``."""
    if slurm_conf:
        return os.path.expanduser(slurm_conf)
    if cluster_name == "local":
        return os.environ.get("SLURM_CONF") or str(LOCAL_SLURM_CONF)
    return None


def use_cluster(cluster_name: str, slurm_conf: Optional[str]) -> None:
    """Point this process (and the sbatch that submitit runs) at the chosen cluster."""
    conf = slurm_conf_for(cluster_name, slurm_conf)
    if conf:
        os.environ["SLURM_CONF"] = conf


def run(args: Sequence[str], timeout: float = TIMEOUT_S) -> str:
    """Run a Slurm client tool and return its stdout; raise SlurmError with its first error line."""
    try:
        proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"'{args[0]}' is not installed; run scripts/setup.sh or load your site's Slurm") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"'{' '.join(args)}' did not answer in {timeout:.0f} s") from None
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()] or [f"exit code {proc.returncode}"]
        raise SlurmError(f"{args[0]}: {lines[-1].strip()}")
    return proc.stdout


def ping() -> None:
    """Fail with a one-line hint when the controller cannot be reached."""
    hint = "start the local cluster with 'bash slurm/up.sh' (or point SLURM_CONF at your cluster)"
    try:
        out = run(["scontrol", "ping"], timeout=10)
    except SlurmError as err:
        raise SlurmError(f"Slurm is not reachable ({err}); {hint}") from None
    if "UP" not in out:
        raise SlurmError(f"Slurm is not reachable (scontrol ping: {out.strip()}); {hint}")


@dataclass(frozen=True)
class Partition:
    """What a partition can ever hold."""

    name: str
    nodes: int
    gpus_per_node: int
    default: bool


def partitions() -> list[Partition]:
    """All partitions with their node count and GPUs per node (gres ``gpu[:type]:N``)."""
    out = run(["sinfo", "-h", "-o", "%P|%D|%G"])
    totals: dict[str, Partition] = {}
    for line in out.splitlines():
        name, nodes, gres = line.split("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        gpus = gpus_in_gres(gres)
        prev = totals.get(name)
        totals[name] = Partition(
            name=name,
            nodes=int(nodes) + (prev.nodes if prev else 0),
            gpus_per_node=max(gpus, prev.gpus_per_node if prev else 0),
            default=default,
        )
    return list(totals.values())


def gpus_in_gres(gres: str) -> int:
    """GPUs in a gres string such as ``gpu:8``, ``gpu:h100:8(S:0-1)`` or ``(null)``."""
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            return int(parts[-1])
    return 0


def find_partition(name: Optional[str]) -> Partition:
    """The named partition, or the cluster's default one."""
    parts = partitions()
    for part in parts:
        if (name is None and part.default) or part.name == name:
            return part
    names = ", ".join(p.name for p in parts) or "none"
    wanted = f"partition '{name}'" if name else "a default partition"
    raise SlurmError(f"the cluster has no {wanted} (partitions: {names})")
