"""Will a partition run this request? Checked before sbatch, and sbatch's refusals explained in the same words.

Every message is one line: what was asked (``gpus=8 as 1 node x 8 tasks x 1 CPU``), what the partition
offers, and what to change.
"""
from __future__ import annotations

import re
from typing import List, Optional

from launcher.core.config import ClusterConfig
from launcher.core.plan import Plan
from launcher.slurm.output import Partition

_MEM_UNITS = {"K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}


def mem_mb(text: str) -> Optional[int]:
    """An sbatch memory size (``100G``, ``512M``, ``2048``: MB by default) in MB; None if unreadable."""
    match = re.fullmatch(r"(\d+)([KMGT]?)B?", str(text).strip().upper())
    return int(int(match.group(1)) * _MEM_UNITS[match.group(2) or "M"]) if match else None


def cpus_per_task(cluster: ClusterConfig) -> int:
    """The CPUs each task gets: ``cluster.cpus_per_gpu``, else Slurm's default of one."""
    return cluster.cpus_per_gpu or 1


def asked(plan: Plan, cluster: ClusterConfig) -> str:
    """The request in one phrase: ``gpus=8 as 1 node x 8 tasks x 1 CPU``."""
    cpus = cpus_per_task(cluster)
    text = (f"gpus={plan.gpus} as {plan.nodes} node{'s' if plan.nodes > 1 else ''} x {plan.tasks_per_node} "
            f"task{'s' if plan.tasks_per_node > 1 else ''} x {cpus} CPU{'s' if cpus > 1 else ''}")
    return text + (f", {cluster.mem_per_gpu} per GPU" if cluster.mem_per_gpu else "")


def problems(plan: Plan, cluster: ClusterConfig, part: Partition) -> List[str]:
    """Each way the request exceeds what the partition can ever give, with what to change."""
    where, gpus, full = f"partition '{part.name}'", f"gpus={plan.gpus}", asked(plan, cluster)
    found = []
    if cluster.gres is None and cluster.gpu_type is not None and part.gpus_per_node and \
            cluster.gpu_type not in part.gpu_types:
        has = (f"has GPUs of type {', '.join(part.gpu_types)}" if part.gpu_types else
               "names no GPU type (untyped gres gpu)")
        change = f"set cluster.gpu_type={part.gpu_types[0]}" if len(part.gpu_types) == 1 else \
            "set cluster.gpu_type to one of them" if part.gpu_types else \
            "set cluster.gpu_type=null, or cluster.gres=gpu to ask for untyped GPUs and keep the type for the plan"
        found.append(f"cluster.gpu_type={cluster.gpu_type}: {where} {has}; {change}")
    if plan.gpus_per_node > part.gpus_per_node:
        found.append(f"{gpus} needs {plan.gpus_per_node} GPUs per node; {where} nodes have {part.gpus_per_node}; "
                     f"spread it over more nodes (layout.nodes) or ask for fewer GPUs")
    if plan.nodes > part.nodes:
        found.append(f"{gpus} needs {plan.nodes} nodes x {plan.gpus_per_node} GPUs, but {where} has {part.nodes} "
                     f"node{'s' if part.nodes != 1 else ''} x {part.gpus_per_node} GPUs "
                     f"(at most {part.nodes * part.gpus_per_node} GPUs); ask for fewer GPUs")
    if part.max_nodes is not None and plan.nodes > part.max_nodes:
        found.append(f"{gpus} needs {plan.nodes} nodes; {where} allows at most {part.max_nodes} per job (MaxNodes); "
                     f"ask for fewer GPUs or another partition (cluster.partition)")
    cpus = plan.tasks_per_node * cpus_per_task(cluster)
    if not cluster.overcommit and cpus > part.cpus_per_node:
        most = part.cpus_per_node // plan.tasks_per_node
        change = (f"lower cluster.cpus_per_gpu (at most {most})" if most else
                  "spread it over more nodes (layout.nodes)") + " or set cluster.overcommit=true"
        found.append(f"{full} needs {cpus} CPUs per node; {where} nodes have {part.cpus_per_node} CPUs; {change}")
    per_gpu = mem_mb(cluster.mem_per_gpu) if cluster.mem_per_gpu else None
    if per_gpu and part.mem_mb_per_node and per_gpu * plan.gpus_per_node > part.mem_mb_per_node:
        found.append(f"{full} needs {per_gpu * plan.gpus_per_node} MB per node "
                     f"(cluster.mem_per_gpu={cluster.mem_per_gpu}); {where} nodes have {part.mem_mb_per_node} MB; "
                     f"lower cluster.mem_per_gpu (at most {part.mem_mb_per_node // plan.gpus_per_node}M) "
                     "or set it to null")
    limit = part.max_time_min
    if limit is not None and cluster.time_limit_min > limit:
        found.append(f"cluster.time_limit_min={cluster.time_limit_min} is above {where}'s MaxTime of {limit} min; "
                     f"lower cluster.time_limit_min")
    return found


def refusal(plan: Plan, cluster: ClusterConfig, part: Partition) -> Optional[str]:
    """The one-line refusal of a request the partition cannot run, or None if it can."""
    found = problems(plan, cluster, part)
    return found[0] if found else None


# Slurm's reasons for refusing a job, and what to change.
_HINTS = (
    ("node configuration is not available", "ask for fewer CPUs (cluster.cpus_per_gpu), less memory "
                                            "(cluster.mem_per_gpu) or fewer GPUs per node (layout.nodes)"),
    ("account", "set cluster.account to an account you may use on this partition"),
    ("qos", "set cluster.qos to a QOS you may use"),
    ("time limit", "lower cluster.time_limit_min"),
    ("partition", "choose another cluster.partition"),
    ("node count", "ask for fewer nodes (gpus, layout.nodes)"),
    ("generic resource", "check cluster.gpu_type and the partition's GPUs (launcher clusters)"),
    ("memory", "lower cluster.mem_per_gpu"),
)


def explain_rejection(reason: str, plan: Plan, cluster: ClusterConfig, part: Optional[Partition]) -> str:
    """sbatch's refusal as one line: what was asked, what the partition offers, Slurm's reason, what to change."""
    if part is not None:
        known = refusal(plan, cluster, part)
        if known:
            return known
    hint = next((h for key, h in _HINTS if key in reason.lower()), "see 'launcher clusters' for what it offers")
    offers = f" on partition '{part.name}' ({part.offers()})" if part is not None else ""
    return f"Slurm refused {asked(plan, cluster)}{offers}: {reason}; {hint}"
