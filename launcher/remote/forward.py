"""A command about runs that live on a remote cluster, run there: ``launcher describe NAME`` for a run launched
from here to cluster ``site`` is ``launcher describe NAME`` run on ``site`` with this machine's launcher code,
its output, prompts and exit status passed through as if it ran here.

Which cluster: ``--cluster NAME``, else the one this machine's index of remote runs (launcher/remote/clusters.py)
names for every run given, when none of them is also a local run.
"""
from __future__ import annotations

import argparse
from typing import List, Optional

from launcher.remote.clusters import cluster_of_runs, find_remote
from launcher.remote.ship import run_launcher
from launcher.remote.ssh import Remote
from launcher.status.index import find_run, known_roots


def target(parsed: argparse.Namespace) -> Optional[Remote]:
    """The remote cluster to run this command on, or None to run it here."""
    if getattr(parsed, "root", None):
        return None  # a run root on this machine
    named = getattr(parsed, "cluster", None)
    if named:
        return find_remote(named)
    names = [parsed.name] if getattr(parsed, "name", None) else list(getattr(parsed, "names", None) or [])
    cluster = cluster_of_runs(names) if names else None
    if cluster is None or any(found_here(name) for name in names):
        return None
    return find_remote(cluster)


def found_here(name: str) -> bool:
    for root in known_roots():
        try:
            find_run(root, name)
            return True
        except LookupError:
            continue
    return False


def without_cluster(args: List[str]) -> List[str]:
    """The command line less its ``--cluster NAME`` (the cluster's own launcher runs it as a local command)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == "--cluster":
            skip = True
        elif not arg.startswith("--cluster="):
            out.append(arg)
    return out


def forward(remote: Remote, args: List[str]) -> int:
    """Run ``launcher ARGS`` on the cluster; its exit status (output and prompts pass straight through)."""
    return run_launcher(remote, "launcher", without_cluster(args), timeout=None, capture=False).returncode

