"""``launcher clusters``: every configured cluster (the cluster files of every config layer), each partition's
GPUs and how much of them is free, whether the cluster answers at all, and where each cluster file comes from (the
survey is launcher/service/clusters.py, which the console's clusters page shows too; this module prints it);
``launcher clusters add NAME`` writes a cluster file from what a cluster's Slurm says; ``launcher clusters default
NAME`` makes it the cluster a launch uses when it names none (the user's config.yaml: launcher/compose/catalog.py).

The two MAX columns answer "where does a 16- or 128-GPU run fit": the largest run the partition can
start right now (whole idle nodes, or the free GPUs of one node) and the largest it can ever hold.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import time
from typing import Any, Dict, List, Optional

from launcher.compose.catalog import SETTINGS_FILE, default_cluster, option_files, option_path, user_dir
from launcher.core import gpus
from launcher.core.rundir import write_atomic
from launcher.errors import LaunchError
from launcher.remote.ship import remote_error, run_launcher
from launcher.remote.ssh import Remote
from launcher.service.clusters import ClusterUsage, Configured, configured, site_rules, survey, to_json
from launcher.slurm.client import Slurm, SlurmError
from launcher.slurm.limits import Request, access
from launcher.slurm.output import Partition
from launcher.views.width import fit_table, to_stderr, wrap

HEADERS = ["CLUSTER", "PARTITION", "GPU", "GPUS/NODE", "NODES IDLE/ALLOC/DOWN", "GPUS FREE/TOTAL", "MAX RUN NOW",
           "MAX RUN", "YOUR MAX RUN", "TIME LIMIT"]
# On a narrow terminal (launcher/views/width.py): these wrap by words down to these widths, then these columns are
# left out, first to last.
WRAPPED = {"CLUSTER": 16, "YOUR MAX RUN": 16}
LEAST_NEEDED = ["NODES IDLE/ALLOC/DOWN", "TIME LIMIT", "GPUS/NODE", "MAX RUN", "GPU", "MAX RUN NOW"]


def table_rows(entry: ClusterUsage) -> List[list]:
    default = default_cluster()[0]
    name = ", ".join(n + (" (default)" if n == default else "") for n in [entry.cluster, *entry.also])
    if not entry.reachable:
        return [[name, "unreachable (below)"] + [""] * (len(HEADERS) - 2)]
    return [[name, p.name + ("*" if p.default else ""), p.gpu_type, p.gpus_per_node,
             f"{p.nodes_idle}/{p.nodes_allocated}/{p.nodes_down}", f"{p.gpus_free}/{p.gpus_total}",
             p.max_run_now, p.max_run, p.yours or "-", p.time_limit] for p in entry.partitions]


def configure(parser: argparse.ArgumentParser) -> None:
    parser.usage = ("launcher clusters [--cluster-conf SLURM_CONF] [--json] | launcher clusters add NAME [options] | "
                    "launcher clusters default [NAME]")
    parser.add_argument("action", nargs="?", choices=["add", "default"],
                        help="add NAME: ask Slurm and write a cluster file for it into your config directory; "
                             "default NAME: launch on it when no cluster= is given (no NAME: say which it is)")
    parser.add_argument("name", nargs="?", metavar="NAME",
                        help="with add or default: the cluster's name (cluster=NAME)")
    parser.add_argument("--cluster-conf", metavar="SLURM_CONF",
                        help="show only the cluster of this slurm.conf; with add: the cluster to ask")
    parser.add_argument("--partition", help="with add: the partition to run on (default: the default partition)")
    parser.add_argument("--print", dest="print_only", action="store_true",
                        help="with add: print the cluster file instead of writing it")
    parser.add_argument("--force", action="store_true", help="with add: replace an existing cluster file")
    parser.add_argument("--ssh", metavar="DEST", help="with add: a cluster reached over SSH (an ~/.ssh/config alias, "
                                                     "user@host or ssh://user@host:port), asked there")
    parser.add_argument("--gpu-type", metavar="TYPE",
                        help="with add: the GPUs' type (h100, a100-80gb, ...), where Slurm's gres names none or "
                             "another name; plans forecast step time, tokens/s and MFU only for a known type")
    parser.add_argument("--python", metavar="PATH",
                        help="with add: the interpreter the tasks run, with this package's [train] extra (default: "
                             "this one if it has torch; with --ssh: the cluster's python3)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def gpu_entries(part: Partition, virtual: bool, given: Optional[str], notes: List[str]) -> Dict[str, Any]:
    """The file's GPU keys: the type (``given``, else the partition's gres type) and its memory where the GPU table
    knows them, and the gres to ask for where the type given is not Slurm's name (``gpu`` for an untyped gres);
    where neither type nor memory can be known of real GPUs, a note says so and how to name them (virtual ones
    are planned as a stand-in)."""
    gpu_type = given or part.gpu_type
    entries: Dict[str, Any] = {"gpu_type": gpu_type}
    if given and given != part.gpu_type:
        entries["gres"] = f"gpu:{part.gpu_type}" if part.gpu_type else "gpu"
    memory = gpus.memory_gib(gpu_type) if gpu_type else None
    if memory:
        entries["gpu_memory_gb"] = memory
    elif gpu_type:
        notes.append(f"GPU type {gpu_type} is not in the launcher's GPU table: plans assume its memory and show no "
                     "step time, tokens/s or MFU; set gpu_memory_gb in the file")
    elif not virtual:
        notes.append(f"Slurm names no GPU type on partition {part.name} (gres gpu:{part.gpus_per_node}): plans show "
                     "no step time, tokens/s or MFU; name it with --gpu-type TYPE (e.g. h100)")
    return entries


def proposal(name: str, slurm: Slurm, partition: Optional[str], python: Optional[str] = None,
             gpu_type: Optional[str] = None, notes: Optional[List[str]] = None) -> str:
    """A cluster file for ``name`` from what Slurm says of the partition: its GPUs per node and their type and
    memory (:func:`gpu_entries`, its notes into ``notes``), CPUs and memory per GPU, MaxTime, whether its GPUs
    are virtual (the local cluster's nodes say so with the ``virtual_gpus`` feature), and the user's default
    account."""
    import yaml  # lazy: keeps yaml out of start-up

    slurm.ping()
    part = slurm.partition(partition)
    if not part.gpus_per_node:
        raise SlurmError(f"partition '{part.name}' has no GPUs (no gres gpu on its nodes); choose another "
                         "with --partition")
    account, qos = slurm.default_account(), None
    rules = site_rules(slurm)
    if rules and rules.enforced:
        under = access(Request(0, 0, 0, None, None, None, part.name), rules)
        account, qos = under if isinstance(under, tuple) else (account, None)
    limit = part.max_time_min
    virtual = "virtual_gpus" in slurm.features(part.name)
    data = {
        "name": name, "slurm_conf": slurm.conf, "partition": part.name, "account": account, "qos": qos,
        "gpus_per_node": part.gpus_per_node, **gpu_entries(part, virtual, gpu_type, [] if notes is None else notes),
        "virtual_gpus": virtual,
        "cpus_per_gpu": max(1, part.cpus_per_node // part.gpus_per_node),
        "mem_per_gpu": f"{part.mem_mb_per_node // part.gpus_per_node}M" if part.mem_mb_per_node else None,
        "time_limit_min": min(limit, 1440) if limit else 1440,
        "python": python,
    }
    said = (f"partition {part.name}: {part.offers()}, MaxTime {part.max_time}; default account "
            f"{account or 'none'}" + (f", default QOS {qos}" if qos else ""))
    return (f"# Written by `launcher clusters add {name}` on {time.strftime('%Y-%m-%d')} from what Slurm said:\n"
            f"# {said}.\n# Edit freely: a launch refuses a key it does not know, or a value out of its range.\n"
            + yaml.safe_dump(data, sort_keys=False))


def remote_proposal(args: argparse.Namespace, notes: List[str]) -> str:
    """The cluster file of a cluster reached over SSH: what its Slurm says, asked there by the launcher's own
    code (``clusters add --print`` run on the cluster with ``--python``; its notes into ``notes``), plus how to
    reach it."""
    remote = Remote(args.name, args.ssh, python=args.python, slurm_conf=args.cluster_conf)
    asked = ["clusters", "add", args.name, "--print", *(["--partition", args.partition] if args.partition else []),
             *(["--cluster-conf", args.cluster_conf] if args.cluster_conf else []),
             *(["--gpu-type", args.gpu_type] if args.gpu_type else [])]
    proc = run_launcher(remote, "launcher", asked, timeout=120)
    if proc.returncode != 0:
        raise LaunchError(remote_error(remote, proc.stderr))
    notes.extend(line[len("note: "):] for line in proc.stderr.splitlines() if line.startswith("note: "))
    reach = {"ssh": args.ssh, "python": args.python or "python3"}
    import yaml  # lazy: keeps yaml out of start-up

    return proc.stdout + "# Reached over SSH: every path above is the cluster's.\n" + \
        yaml.safe_dump(reach, sort_keys=False)


def add(args: argparse.Namespace) -> int:
    """``clusters add NAME``: propose a cluster file and write it into the user's config directory."""
    if not args.name or not NAME.fullmatch(args.name):
        raise LaunchError(f"clusters add needs a NAME of 1-64 letters, digits, '.', '_' or '-' (got "
                          f"{args.name!r}); e.g. launcher clusters add mysite")
    notes: List[str] = []
    if args.ssh:
        text = remote_proposal(args, notes)
    else:
        conf = os.path.abspath(os.path.expanduser(args.cluster_conf)) if args.cluster_conf else \
            os.environ.get("SLURM_CONF")
        python = tasks_python(args.python, notes)
        try:
            text = proposal(args.name, Slurm(conf), args.partition, python, args.gpu_type, notes)
        except SlurmError as err:
            raise LaunchError(str(err)) from None
    if args.print_only:
        print(text, end="")
        for note in notes:
            to_stderr(f"note: {note}")
        return 0
    path = user_dir() / "cluster" / f"{args.name}.yaml"
    if path.exists() and not args.force:
        raise LaunchError(f"{path} exists; --force replaces it, --print shows what would be written")
    shadowed = option_path("cluster", args.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, text)
    print(wrap(f"Wrote {path}"))
    if shadowed is not None and shadowed != path:
        print(wrap(f"  it takes the place of {shadowed} for cluster={args.name}"))
    for note in notes:
        print(wrap(f"  note     {note}", indent=" " * 9))
    gpus = next(line.split()[1] for line in text.splitlines() if line.startswith("gpus_per_node:"))
    print(f"  try      launcher plan cluster={args.name} gpus={gpus}")
    return 0


def tasks_python(given: Optional[str], notes: List[str]) -> Optional[str]:
    """The interpreter the cluster's tasks run (``python:`` in the file): ``--python``, else this one where it has
    torch. One this host sees must be able to run the tasks; one it does not see must exist on the nodes (a note);
    with neither, a note says the tasks need one, and a launch would refuse until the file names it."""
    from launcher.submit.checks import missing_modules  # lazy: keeps the checks out of start-up

    if given is None:
        if importlib.util.find_spec("torch") is not None:
            notes.append(f"the tasks run this Python, {sys.executable} (it has torch); --python names another")
            return sys.executable
        notes.append(f"the tasks need a Python with torch, which {sys.executable} lacks: add python: PATH to the "
                     "file, or run clusters add again with --python PATH (one with 'slurm-gpt-launcher[train]')")
        return None
    path = os.path.abspath(os.path.expanduser(given))
    if not os.path.exists(path):
        notes.append(f"--python {path} does not exist on this host: it must on the cluster's nodes")
        return path
    missing = missing_modules(path)
    if missing:
        what = missing if isinstance(missing, str) else f"lacks {', '.join(missing)}"
        raise LaunchError(f"--python {path} {what}: name an interpreter with 'slurm-gpt-launcher[train]'")
    return path


def set_default(args: argparse.Namespace) -> int:
    """Write ``cluster: NAME`` into the user's config.yaml (a cluster some layer defines), or say which is the
    default and where that comes from."""
    if args.partition or args.print_only or args.force or args.ssh or args.python or args.cluster_conf or args.json \
            or args.gpu_type:
        raise LaunchError("clusters default takes only a NAME")
    if args.name is None:
        name, where = default_cluster()
        print(f"{name} (from {where})")
        return 0
    known = sorted(option_files("cluster"))
    if args.name not in known:
        raise LaunchError(f"clusters default {args.name}: no such cluster (clusters: {', '.join(known)}); "
                          f"add it first with 'launcher clusters add {args.name}'")
    path = user_dir() / SETTINGS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, f"# The cluster a launch uses when it names none (launcher clusters default).\n"
                       f"cluster: {args.name}\n")
    name, where = default_cluster()
    print(wrap(f"Wrote {path}: launches without cluster= go to {args.name}"))
    if name != args.name:  # a project's .launcher/conf/config.yaml wins here
        print(wrap(f"  but here {where} makes {name} the default"))
    return 0


def main(args: argparse.Namespace) -> int:
    if args.action == "add":
        return add(args)
    if args.action == "default":
        return set_default(args)
    if args.name or args.partition or args.print_only or args.force or args.ssh or args.python:
        raise LaunchError("NAME, --partition, --print, --force, --ssh and --python go with "
                          "'launcher clusters add NAME' (NAME also with 'launcher clusters default NAME')")
    if args.gpu_type:
        raise LaunchError("--gpu-type goes with 'launcher clusters add NAME'")
    clusters = {args.cluster_conf: Configured(args.cluster_conf, "--cluster-conf")} if args.cluster_conf \
        else configured()
    entries = survey(clusters)
    if args.json:
        print(json.dumps([to_json(entry) for entry in entries], indent=1))
        return 0
    print(fit_table([row for entry in entries for row in table_rows(entry)], HEADERS, WRAPPED, LEAST_NEEDED))
    print(wrap("\n".join(notes(entries))))
    return 0


def notes(entries: List[ClusterUsage]) -> List[str]:
    """Under the table: why each unreachable cluster is, which clusters' accounting enforces no limit (said here
    and by ``plan``, not by every launch), and where each cluster file comes from."""
    lines = [f"{entry.cluster}: {entry.error}" for entry in entries if not entry.reachable]
    free = [entry.cluster for entry in entries if entry.reachable and entry.enforced is False]
    if free:
        lines.append(f"{', '.join(free)}: the site's accounting enforces no account or QOS limit "
                     "(AccountingStorageEnforce), so Slurm refuses no run for one; YOUR MAX RUN is the partition's")
    return [*lines, "", "from:", *(f"  {name}  {where}" for entry in entries
                                   for name, where in zip([entry.cluster, *entry.also], entry.origins))]
