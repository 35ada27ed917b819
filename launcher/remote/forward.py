"""A command about runs that live on a remote cluster, run there: ``launcher describe NAME`` for a run launched
from here to cluster ``site`` is ``launcher describe NAME`` run on ``site`` with this machine's launcher code,
its output, prompts and exit status passed through as if it ran here.

Which cluster: ``--cluster NAME``, else the one this machine's index of remote runs (launcher/remote/clusters.py)
names for every run given, when none of them is also a local run.
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional

from launcher.remote.clusters import cluster_of_runs, find_remote
from launcher.remote.ship import run_launcher, stream_launcher
from launcher.remote.ssh import Remote
from launcher.core.run_index import find_run, known_roots


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


def without_option(args: List[str], option: str) -> List[str]:
    """The command line less ``option VALUE`` (or ``option=VALUE``)."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(f"{option}="):
            out.append(arg)
    return out


def forward(remote: Remote, args: List[str]) -> int:
    """Run ``launcher ARGS`` on the cluster; its exit status (output and prompts pass straight through).
    ``logs --follow`` survives a dropped connection (:func:`follow_logs`)."""
    args = without_option(args, "--cluster")  # the cluster's own launcher runs it as a local command
    if args[:1] == ["logs"] and ("--follow" in args or "-f" in args):
        return follow_logs(remote, args)
    return run_launcher(remote, "launcher", args, timeout=None, capture=False).returncode


def follow_logs(remote: Remote, args: List[str], retry_s: float = 2.0) -> int:
    """``logs --follow`` on the cluster, reconnecting when the connection drops (ssh's status 255): the command
    is started again from the log's beginning and what was printed already (up to the last line shown, each
    line stamped with its time) is skipped, so no line is lost or shown twice."""
    last: Optional[str] = None
    while True:
        proc = stream_launcher(remote, args)
        skipping = last is not None
        assert proc.stdout is not None
        for line in proc.stdout:
            if skipping:
                skipping = line != last
                continue
            sys.stdout.write(line)
            sys.stdout.flush()
            last = line
        status = proc.wait()
        if status != 255:
            return status
        print(f"warning: the connection to cluster {remote.cluster} dropped; reconnecting", file=sys.stderr)
        args = without_option(args, "--tail")  # from the beginning: the skip finds where it was
        time.sleep(retry_s)
