"""The clusters survey, for ``launcher clusters`` and the console's clusters page: every configured cluster (the
cluster files of every config layer), each partition's GPUs and how much of them is free, whether the cluster
answers at all, and where each cluster file comes from; for the console, also the user's jobs in a cluster's queue
with the run behind each and why it waits.

Clusters are asked at once, each with short timeouts, so one that is down shows as unreachable within
seconds. Clusters that resolve to the same slurm.conf are asked once and shown as one.
"""
from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional

from launcher.compose.catalog import beside, default_cluster, option_files, origin
from launcher.errors import LaunchError
from launcher.remote.ship import call
from launcher.remote.ssh import Remote
from launcher.slurm.batch import WATCHER_SUFFIX
from launcher.slurm.client import Slurm, SlurmError, slurm_conf_for, user_name
from launcher.slurm.limits import SiteRules, largest_run
from launcher.slurm.output import JobRow
from launcher.status.pending import Queue, in_words
from launcher.status.usage import PartitionUsage, usage

SINFO_TIMEOUT_S = 5


@dataclass
class ClusterUsage:
    """One cluster as listed: its names (clusters sharing a slurm.conf), whether it answered, its partitions."""

    cluster: str
    also: List[str]
    slurm_conf: Optional[str]
    reachable: bool = False
    error: str = ""
    ssh: Optional[str] = None  # a cluster reached over SSH (launcher/remote/)
    partitions: List[PartitionUsage] = field(default_factory=list)
    origins: List[str] = field(default_factory=list)  # each name's config layer and file
    enforced: Optional[bool] = None  # whether its accounting enforces account and QOS limits (None: not known)


@dataclass(frozen=True)
class Configured:
    """A cluster file as ``clusters`` lists it: the cluster's name, its slurm.conf, and where the file is."""

    slurm_conf: Optional[str]
    origin: str = ""  # the config layer (package, site, user, project) and the file
    remote: Optional["Remote"] = None  # reached over SSH; its slurm_conf is a path there


def configured() -> Dict[str, Configured]:
    """Every cluster file of every config layer (launcher/compose/catalog.py), by its ``name``, with its
    slurm.conf (a relative one relative to the file) and its layer; ``local`` first."""
    from omegaconf import OmegaConf  # lazy: keeps omegaconf out of start-up

    from launcher.compose.layers import check_file  # lazy: keeps omegaconf out of start-up

    found: Dict[str, Configured] = {}
    files = option_files("cluster")
    for option in sorted(files, key=lambda o: (o != "local", o)):
        path = files[option]
        if origin(path) != "package":
            check_file("cluster", path)
        cfg = OmegaConf.to_container(OmegaConf.load(path), resolve=True)
        name = cfg.get("name") or option
        if cfg.get("ssh"):
            remote = Remote(name, cfg["ssh"], float(cfg.get("ssh_timeout_s") or 5.0), cfg.get("python"),
                            cfg.get("slurm_conf"), cfg.get("run_root"))
            found[name] = Configured(cfg.get("slurm_conf"), f"{origin(path)}: {path}", remote)
            continue
        conf = beside(cfg["slurm_conf"], path) if cfg.get("slurm_conf") else None
        found[name] = Configured(slurm_conf_for(name, conf), f"{origin(path)}: {path}")
    return found


def survey(clusters: Dict[str, Configured]) -> List[ClusterUsage]:
    """Ask every distinct cluster at once; a silent one is unreachable within a few seconds."""
    listed: Dict[Optional[str], ClusterUsage] = {}
    remotes: Dict[str, Remote] = {}
    for name, entry in clusters.items():
        # None: Slurm's default, which $SLURM_CONF sets; a remote cluster is its own, whatever its slurm.conf.
        key = f"ssh:{name}" if entry.remote else entry.slurm_conf or os.environ.get("SLURM_CONF")
        if key in listed:
            listed[key].also.append(name)
            listed[key].origins.append(entry.origin)
        else:
            listed[key] = ClusterUsage(name, [], entry.slurm_conf, origins=[entry.origin],
                                       ssh=entry.remote.ssh if entry.remote else None)
            if entry.remote:
                remotes[name] = entry.remote

    def ask(entry: ClusterUsage) -> None:
        try:
            if entry.cluster in remotes:
                answer = call(remotes[entry.cluster], "partitions", {"slurm_conf": entry.slurm_conf},
                              timeout=max(30.0, 4 * remotes[entry.cluster].timeout_s))
                entry.partitions = [PartitionUsage(**part) for part in answer["partitions"]]
            else:
                slurm = Slurm(entry.slurm_conf)
                slurm.ping()
                entry.partitions = usage(slurm.nodes(timeout=SINFO_TIMEOUT_S))
                rules = site_rules(slurm)
                entry.enforced = rules.enforced if rules is not None else None
                for part in entry.partitions:
                    part.yours = _yours(rules, part)
            entry.reachable = True
        except (SlurmError, LaunchError) as err:
            entry.error = err.message if isinstance(err, LaunchError) else str(err)

    threads = [threading.Thread(target=ask, args=(entry,)) for entry in listed.values()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return list(listed.values())


def site_rules(slurm: Slurm) -> Optional[SiteRules]:
    """The site's rules for this user (what ``clusters add`` proposes goes by them too); None where Slurm cannot
    say."""
    try:
        return slurm.site_rules()
    except SlurmError:
        return None


def _yours(rules: Optional[SiteRules], part: PartitionUsage) -> str:
    """The largest run this user may start on the partition, and what sets it where that is a site limit."""
    if rules is None:
        return "not known"
    if not rules.enforced:
        return str(part.max_run)
    most, why = largest_run(rules, part.name, part.max_run)
    return f"{most} ({why})" if why != "the partition" else str(most)


def to_json(entry: ClusterUsage) -> dict:
    """The cluster as ``clusters --json`` writes it and the console's page reads it: whether it is the default, and
    which of its names is (one slurm.conf may be configured under several)."""
    default = default_cluster()[0]
    mine = default in (entry.cluster, *entry.also)
    data = {**asdict(entry), "default": mine, "default_name": default if mine else None}
    for part in data["partitions"]:
        part.pop("free_per_node")
    return data


LIVE = ("PENDING", "RUNNING", "COMPLETING", "CONFIGURING", "SUSPENDED")  # a job still in the user's queue


@dataclass(frozen=True)
class YourJob:
    """One of the user's jobs in a cluster's queue: its name in Slurm (a run's, a sweep's job array's), the run or
    sweep it watches where it is the launcher's 0-GPU watcher (launcher/slurm/batch.py ``watcher``), and why it
    waits, in words ("" for a job that runs)."""

    job_id: str
    state: str
    partition: str
    gpus: int
    name: str
    watches: Optional[str]
    reason: str


def your_jobs(slurm_conf: Optional[str]) -> List[YourJob]:
    """The user's jobs still in the cluster's queue, the launcher's watchers last: one squeue of the whole queue (a
    pending reason needs the jobs ahead) and one of the user's jobs' names. SlurmError where Slurm cannot be asked."""
    slurm = Slurm(slurm_conf)
    rows, user = slurm.squeue(), user_name()
    names = slurm.job_names(user)
    queue = Queue(rows, nodes=slurm.nodes)
    jobs = [your_job(row, names.get(row.job_id, ""), queue) for row in rows if row.user == user and row.state in LIVE]
    return sorted(jobs, key=lambda job: job.watches is not None)


def your_job(row: JobRow, name: str, queue: Queue) -> YourJob:
    """The job of ``row``, named ``name``: a watcher says what it waits for; a pending job why, in words; a running
    one nothing (Slurm's reason for it is "None")."""
    watches = name[:-len(WATCHER_SUFFIX)] if name.endswith(WATCHER_SUFFIX) else None
    if watches is not None:
        reason = (f"the launcher's watcher of {watches}: it starts only if {watches}'s job fails, to judge its "
                  "attempt" if row.state == "PENDING" else f"the launcher's watcher of {watches}: judging the attempt "
                  f"of {watches}'s job, which ended without completing")
    elif row.state == "PENDING":
        reason = in_words(row, queue)
    else:
        reason = "" if row.reason in ("", "None", "(null)") else row.reason
    return YourJob(row.job_id, row.state, row.partition, row.gpus, name, watches, reason)
