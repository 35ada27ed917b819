"""How much of a cluster is free, per partition: nodes idle/allocated/down, GPUs free/total, and the largest run it
can start now and could ever hold (``launcher clusters``, here and on a remote cluster's side)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional

from launcher.slurm.client import Node
from launcher.slurm.output import unusable


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
    max_run: int = 0  # the most GPUs one job can ever have here: every node, or MaxNodes of them
    max_nodes: Optional[int] = None  # per job (MaxNodes)
    yours: str = ""  # the largest run this user's account and QOS let them start, and what sets it
    free_per_node: List[int] = field(default_factory=list, repr=False)


def usage(nodes: List[Node]) -> List[PartitionUsage]:
    """Per partition: nodes idle/allocated/down and GPUs free/total."""
    parts: Dict[str, PartitionUsage] = {}
    for node in nodes:
        kind = node.gpu_type or ("gpu" if node.gpus else "-")
        part = parts.setdefault(node.partition, PartitionUsage(node.partition, node.default, kind, node.gpus,
                                                               node.max_time, max_nodes=node.max_nodes))
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
        part.max_run = min(up + part.nodes_down, part.max_nodes or up + part.nodes_down) * part.gpus_per_node
        whole = min(sum(1 for free in part.free_per_node if free == part.gpus_per_node), part.max_nodes or up)
        part.max_run_now = max([whole * part.gpus_per_node, *part.free_per_node, 0])
    return list(parts.values())
