"""``launcher clusters``: per partition, its GPUs and how much of it is free, from ``sinfo``.

The two MAX columns answer "where does a 16- or 128-GPU run fit": the largest run the partition can
start right now (whole idle nodes, or the free GPUs of one node) and the largest it can ever hold.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field
from typing import List

from launcher.errors import LaunchError
from launcher.slurm import SlurmError, gpus_in_gres, run, use_cluster

DOWN_WORDS = ("down", "drain", "fail", "not_responding", "maint", "reboot", "power", "unknown", "inval")


@dataclass
class PartitionUsage:
    name: str
    default: bool
    gpu_type: str
    gpus_per_node: int
    time_limit: str
    nodes_idle: int = 0
    nodes_allocated: int = 0
    nodes_down: int = 0
    gpus_free: int = 0
    gpus_total: int = 0
    max_run_now: int = 0
    max_run: int = 0
    free_per_node: List[int] = field(default_factory=list, repr=False)


def gpu_type(gres: str) -> str:
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu":
            return parts[1] if len(parts) == 3 else "gpu"
    return "-"


def usage() -> List[PartitionUsage]:
    out = run(["sinfo", "-h", "-N", "-O", "NodeList:|,Partition:|,Gres:|,GresUsed:|,StateLong:|,Time:"])
    parts: dict[str, PartitionUsage] = {}
    for line in out.splitlines():
        node, partition, gres, used, state, limit = line.split("|")[:6]
        name = partition.rstrip("*")
        total = gpus_in_gres(gres)
        part = parts.setdefault(name, PartitionUsage(name, partition.endswith("*"), gpu_type(gres), total, limit))
        part.gpus_per_node = max(part.gpus_per_node, total)
        part.gpus_total += total
        state = state.lower()
        if any(word in state for word in DOWN_WORDS):
            part.nodes_down += 1
            continue
        free = total - gpus_in_gres(used)
        part.gpus_free += free
        part.free_per_node.append(free)
        if state.startswith("idle"):
            part.nodes_idle += 1
        else:
            part.nodes_allocated += 1
    for part in parts.values():
        up = len(part.free_per_node)
        part.max_run = (up + part.nodes_down) * part.gpus_per_node
        whole = sum(1 for free in part.free_per_node if free == part.gpus_per_node)
        part.max_run_now = max([whole * part.gpus_per_node, *part.free_per_node, 0])
    return list(parts.values())


HEADERS = ["PARTITION", "GPU", "GPUS/NODE", "NODES IDLE/ALLOC/DOWN", "GPUS FREE/TOTAL", "MAX RUN NOW", "MAX RUN",
           "TIME LIMIT"]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster-conf", metavar="SLURM_CONF",
                        help="slurm.conf of the cluster to show (default: $SLURM_CONF, else the local cluster)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def main(args: argparse.Namespace) -> int:
    use_cluster("local", args.cluster_conf)
    try:
        parts = usage()
    except SlurmError as err:
        raise LaunchError(f"{err}; start the local cluster with 'bash slurm/up.sh' or set SLURM_CONF") from None
    if args.json:
        print(json.dumps([{k: v for k, v in asdict(p).items() if k != "free_per_node"} for p in parts], indent=1))
        return 0
    from tabulate import tabulate

    rows = [[p.name + ("*" if p.default else ""), p.gpu_type, p.gpus_per_node,
             f"{p.nodes_idle}/{p.nodes_allocated}/{p.nodes_down}", f"{p.gpus_free}/{p.gpus_total}",
             p.max_run_now, p.max_run, p.time_limit] for p in parts]
    print(tabulate(rows, headers=HEADERS, disable_numparse=True))
    return 0
