"""The remote clusters this machine knows (cluster files that name ``ssh``), a launch to one of them, and which
cluster holds each run launched from here.

The launch composes, checks and plans here, from this machine's config layers (a mistake is found at once,
with no round trip), then sends the composed runs to the cluster's agent (launcher/remote/agent.py), which checks
the data and submits them there. ``$LAUNCHER_HOME/remote-runs.json`` remembers each run's cluster, so that
``launcher describe NAME`` finds a remote run by its name alone, as it finds a local one.
"""
from __future__ import annotations

import fcntl
import json
import os
import sys
from typing import TYPE_CHECKING, Dict, List, Optional

from launcher.core.run_index import RunRecord
from launcher.core.rundir import launcher_home, write_atomic
from launcher.core.safepath import UnsafePath, check_home, ensure_home, open_nofollow
from launcher.errors import LaunchError
from launcher.remote.ship import call
from launcher.remote.ssh import Remote

if TYPE_CHECKING:
    from launcher.compose.composer import ComposedRun
    from launcher.core.config import ClusterConfig
    from launcher.core.run_index import RunRecord
    from launcher.submit.submitter import Launched

RUNS_INDEX = "remote-runs.json"


def remote_of(cluster: "ClusterConfig") -> Remote:
    return Remote(cluster.name, cluster.ssh or "", cluster.ssh_timeout_s, cluster.python, cluster.slurm_conf,
                  cluster.run_root)


def remotes() -> List[Remote]:
    """Every cluster file of every config layer that names an ``ssh`` destination (read as plain YAML: listing
    runs must not pay for composition)."""
    from launcher.compose.catalog import option_files  # lazy: `runs` imports this module and needs no catalogue

    found = []
    for option, path in sorted(option_files("cluster").items()):
        text = path.read_text()
        if "ssh" not in text:
            continue
        import yaml  # lazy: keeps yaml out of start-up

        data = yaml.safe_load(text) or {}
        if isinstance(data, dict) and data.get("ssh"):
            found.append(Remote(str(data.get("name") or option), str(data["ssh"]),
                                float(data.get("ssh_timeout_s") or 5.0), data.get("python"), data.get("slurm_conf"),
                                data.get("run_root")))
    return found


def find_remote(name: str) -> Remote:
    """The remote cluster called ``name``; LaunchError naming those there are."""
    known = remotes()
    for remote in known:
        if remote.cluster == name:
            return remote
    names = ", ".join(r.cluster for r in known) or "none: a cluster file with ssh: DEST makes one"
    raise LaunchError(f"no remote cluster '{name}'; remote clusters: {names}")


def launch_remote(runs: List["ComposedRun"], sweep: bool) -> "Launched":
    """Submit runs composed here on their remote cluster; what was submitted, as a local launch returns it."""
    from launcher.remote.agent import request  # lazy: keeps hydra out of start-up
    from launcher.submit.submitter import Launched  # lazy: keeps hydra, submitit out of start-up

    same_remote(runs)
    try:
        check_home(launcher_home())  # where the runs are remembered, after they are submitted
    except UnsafePath as err:
        raise LaunchError(str(err)) from None
    remote = remote_of(runs[0].config.cluster)
    answer = call(remote, "launch", request(runs, sweep, sys.argv[1:]))
    records = [RunRecord(**record) for record in answer["records"]]
    remember(remote.cluster, records)
    return Launched(records, answer["sweep_id"], answer["note"], remote=remote.cluster)


def same_remote(runs: List["ComposedRun"]) -> None:
    """LaunchError unless every run goes to one cluster, reached over SSH."""
    names = sorted({run.config.cluster.name for run in runs})
    if len(names) > 1 or any(run.config.cluster.ssh is None for run in runs):
        raise LaunchError(f"a sweep goes to one remote cluster at a time; this one names {', '.join(names)}")


def remember(cluster: str, records: List["RunRecord"]) -> None:
    """Note each run's cluster in this machine's index of remote runs, in a launcher home no other user can
    change, following no symlink there (launcher/core/safepath.py)."""
    try:
        path = ensure_home(launcher_home()) / RUNS_INDEX
        lock = open_nofollow(path.with_suffix(".lock"), os.O_WRONLY | os.O_CREAT)
    except UnsafePath as err:
        raise LaunchError(str(err)) from None
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        index = remote_runs()
        index.update({record.name: cluster for record in records})
        write_atomic(path, json.dumps(index, indent=1, sort_keys=True))
    finally:
        os.close(lock)


def remote_runs() -> Dict[str, str]:
    """Run name → remote cluster, for the runs launched from here."""
    try:
        with os.fdopen(open_nofollow(launcher_home() / RUNS_INDEX)) as f:
            index = json.load(f)
    except (OSError, json.JSONDecodeError):
        return {}
    return index if isinstance(index, dict) else {}


def cluster_of_runs(names: List[str]) -> Optional[str]:
    """The remote cluster that holds every run named (a name or a unique prefix of one launched from here), or
    None when they are not all on one remote cluster."""
    index = remote_runs()
    clusters = set()
    for name in names:
        matches = {run: cluster for run, cluster in index.items() if run == name or run.startswith(name)}
        if name in index:
            matches = {name: index[name]}
        if len(matches) != 1:
            return None
        clusters.update(matches.values())
    return clusters.pop() if len(clusters) == 1 else None
