"""``launcher clusters``: every configured cluster (conf/cluster/*.yaml), each partition's GPUs and how much of
it is free, and whether the cluster answers at all.

The two MAX columns answer "where does a 16- or 128-GPU run fit": the largest run the partition can
start right now (whole idle nodes, or the free GPUs of one node) and the largest it can ever hold.
Clusters are asked at once, each with short timeouts, so one that is down shows as unreachable within
seconds. Clusters that resolve to the same slurm.conf are asked once and shown as one.
"""
from __future__ import annotations

import argparse
import json
import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from launcher.slurm.client import Node, Slurm, SlurmError, slurm_conf_for
from launcher.slurm.output import unusable

SINFO_TIMEOUT_S = 5


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


def usage(nodes: List[Node]) -> List[PartitionUsage]:
    """Per partition: nodes idle/allocated/down and GPUs free/total."""
    parts: Dict[str, PartitionUsage] = {}
    for node in nodes:
        kind = node.gpu_type or ("gpu" if node.gpus else "-")
        part = parts.setdefault(node.partition, PartitionUsage(node.partition, node.default, kind, node.gpus,
                                                               node.max_time))
        part.gpus_per_node = max(part.gpus_per_node, node.gpus)
        part.gpus_total += node.gpus
        state = node.state.lower()
        if unusable(state):
            part.nodes_down += 1
            continue
        free = node.gpus - node.gpus_used
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


@dataclass
class ClusterUsage:
    """One cluster as listed: its names (clusters sharing a slurm.conf), whether it answered, its partitions."""

    cluster: str
    also: List[str]
    slurm_conf: Optional[str]
    reachable: bool = False
    error: str = ""
    partitions: List[PartitionUsage] = field(default_factory=list)


def configured() -> Dict[str, Optional[str]]:
    """Every cluster of conf/cluster/*.yaml (its ``name``) with its slurm.conf, ``local`` first."""
    from omegaconf import OmegaConf

    from launcher.compose.catalog import options, CONF_DIR

    found: Dict[str, Optional[str]] = {}
    for option in sorted(options("cluster"), key=lambda o: (o != "local", o)):
        cfg = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "cluster" / f"{option}.yaml"), resolve=True)
        name = cfg.get("name") or option
        found[name] = slurm_conf_for(name, cfg.get("slurm_conf"))
    return found


def survey(clusters: Dict[str, Optional[str]]) -> List[ClusterUsage]:
    """Ask every distinct cluster at once; a silent one is unreachable within a few seconds."""
    listed: Dict[Optional[str], ClusterUsage] = {}
    for name, conf in clusters.items():
        key = conf or os.environ.get("SLURM_CONF")  # None: Slurm's default, which $SLURM_CONF sets
        if key in listed:
            listed[key].also.append(name)
        else:
            listed[key] = ClusterUsage(name, [], conf)

    def ask(entry: ClusterUsage) -> None:
        slurm = Slurm(entry.slurm_conf)
        try:
            slurm.ping()
            entry.partitions = usage(slurm.nodes(timeout=SINFO_TIMEOUT_S))
            entry.reachable = True
        except SlurmError as err:
            entry.error = str(err)

    threads = [threading.Thread(target=ask, args=(entry,)) for entry in listed.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return list(listed.values())


HEADERS = ["CLUSTER", "PARTITION", "GPU", "GPUS/NODE", "NODES IDLE/ALLOC/DOWN", "GPUS FREE/TOTAL", "MAX RUN NOW",
           "MAX RUN", "TIME LIMIT"]


def table_rows(entry: ClusterUsage) -> List[list]:
    name = entry.cluster + "".join(f", {other}" for other in entry.also)
    if not entry.reachable:
        return [[name, "unreachable (below)"] + [""] * (len(HEADERS) - 2)]
    return [[name, p.name + ("*" if p.default else ""), p.gpu_type, p.gpus_per_node,
             f"{p.nodes_idle}/{p.nodes_allocated}/{p.nodes_down}", f"{p.gpus_free}/{p.gpus_total}",
             p.max_run_now, p.max_run, p.time_limit] for p in entry.partitions]


def to_json(entry: ClusterUsage) -> dict:
    data = asdict(entry)
    for part in data["partitions"]:
        part.pop("free_per_node")
    return data


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--cluster-conf", metavar="SLURM_CONF", help="show only the cluster of this slurm.conf")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def main(args: argparse.Namespace) -> int:
    clusters = {args.cluster_conf: args.cluster_conf} if args.cluster_conf else configured()
    entries = survey(clusters)
    if args.json:
        print(json.dumps([to_json(entry) for entry in entries], indent=1))
        return 0
    from tabulate import tabulate

    print(tabulate([row for entry in entries for row in table_rows(entry)], headers=HEADERS, disable_numparse=True))
    for entry in entries:
        if not entry.reachable:
            print(f"{entry.cluster}: {entry.error}")
    return 0
