"""What the site's accounting lets this user run: accounts, QOS and their limits, read before submitting.

A strict site (``AccountingStorageEnforce=associations,limits,qos``) rejects at submission a job whose account
or QOS the user may not use, and queues for ever a job that no limit will ever let start: 16 GPUs under a QOS
of 8 per user pends as ``QOSMaxGRESPerUser`` until someone cancels it. Both can be known before submitting, from
what the cluster tells any user about themself: ``sacctmgr show assoc`` (their accounts, each one's QOS list and
default, the association's limits), ``sacctmgr show qos`` (each QOS's limits), ``scontrol show partition`` (a
partition's own QOS, AllowAccounts and AllowQos) and the controller's ``AccountingStorageEnforce``.
:func:`judge_site` turns them into refusals (the job would be rejected, or could never start) and warnings (it
will wait behind the user's own jobs), each one line naming the limit and what would run instead.

Where nothing is enforced, nothing is refused: Slurm itself would not. The rules change rarely, and ``sacctmgr``
asks slurmdbd, so :class:`SiteRules` are kept in the launcher's home for :data:`CACHE_TTL_S` (one file per cluster
and user): a dry run, a plan and a launch minutes apart ask once.
"""
from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from launcher.core.rundir import write_atomic
from launcher.core.safepath import HOME, UnsafePath, check_tree
from launcher.slurm.output import JobRow, minutes

CACHE_TTL_S = 300
# The trackable resources a run asks for, in the user's words.
TRES_WORDS = {"gres/gpu": "GPUs", "node": "nodes", "cpu": "CPUs"}
# What one plain run submits: its job and the watcher beside it (launcher/job/submission.py).
JOBS_PER_RUN = 2
QOS_FIELDS = ("Name", "MaxTRES", "MaxTRESPU", "MaxTRESPA", "GrpTRES", "MinTRES", "MaxWall", "MaxJobsPU",
              "MaxSubmitPU")
ASSOC_FIELDS = ("Account", "Partition", "QOS", "DefaultQOS", "MaxTRES", "GrpTRES", "MaxWall", "MaxJobs",
                "MaxSubmit")


@dataclass(frozen=True)
class Limits:
    """The limits of one QOS or association that decide whether a job can ever start, or when."""

    per_job: Dict[str, int] = field(default_factory=dict)  # MaxTRES (MaxTRESPerJob)
    per_user: Dict[str, int] = field(default_factory=dict)  # MaxTRESPU: all of a user's running jobs together
    per_account: Dict[str, int] = field(default_factory=dict)  # MaxTRESPA
    group: Dict[str, int] = field(default_factory=dict)  # GrpTRES: every job of the QOS or association together
    min_per_job: Dict[str, int] = field(default_factory=dict)  # MinTRES
    max_wall_min: Optional[int] = None
    max_jobs: Optional[int] = None  # running at once, per user
    max_submit: Optional[int] = None  # queued or running, per user


@dataclass(frozen=True)
class Association:
    """One of the user's associations: an account, for every partition (``partition`` "") or one."""

    account: str
    partition: str
    qos: Tuple[str, ...]
    default_qos: str
    limits: Limits


@dataclass(frozen=True)
class PartitionRules:
    """Who may use a partition, and its own QOS (``scontrol show partition``); None: everyone."""

    qos: str = ""
    allow_accounts: Optional[Tuple[str, ...]] = None
    allow_qos: Optional[Tuple[str, ...]] = None
    deny_accounts: Tuple[str, ...] = ()
    deny_qos: Tuple[str, ...] = ()


@dataclass(frozen=True)
class SiteRules:
    """Everything :func:`judge_site` needs to know about the site, as one user sees it."""

    user: str
    enforce: Tuple[str, ...]  # AccountingStorageEnforce's words (associations, limits, qos, safe, ...)
    default_account: str
    associations: Tuple[Association, ...]
    qos: Dict[str, Limits]
    partitions: Dict[str, PartitionRules]

    @property
    def enforced(self) -> bool:
        return "associations" in self.enforce or "limits" in self.enforce or "qos" in self.enforce

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "SiteRules":
        data = json.loads(text)
        assocs = tuple(Association(a["account"], a["partition"], tuple(a["qos"]), a["default_qos"],
                                   Limits(**a["limits"])) for a in data["associations"])
        parts = {name: PartitionRules(p["qos"], *(tuple(p[k]) if p[k] is not None else None
                                                  for k in ("allow_accounts", "allow_qos")),
                                      tuple(p["deny_accounts"]), tuple(p["deny_qos"]))
                 for name, p in data["partitions"].items()}
        return cls(data["user"], tuple(data["enforce"]), data["default_account"], assocs,
                   {name: Limits(**lim) for name, lim in data["qos"].items()}, parts)


@dataclass(frozen=True)
class Request:
    """What a run asks Slurm for, as the site's limits count it."""

    gpus: int
    nodes: int
    cpus: int
    minutes: Optional[int]
    account: Optional[str]  # cluster.account; None: the user's default
    qos: Optional[str]  # cluster.qos; None: the association's default
    partition: str

    @property
    def tres(self) -> Dict[str, int]:
        return {"gres/gpu": self.gpus, "node": self.nodes, "cpu": self.cpus}


# ---- reading what Slurm prints -------------------------------------------------------------------------------

def tres(text: str) -> Dict[str, int]:
    """``gres/gpu=8,node=2`` as a dict; a typed ``gres/gpu:h100=8`` counts as gres/gpu where that is missing."""
    counts: Dict[str, int] = {}
    for item in filter(None, text.strip().split(",")):
        name, _, value = item.partition("=")
        if value.isdigit():
            counts[name] = int(value)
    for name, value in list(counts.items()):
        if name.startswith("gres/gpu:"):
            counts.setdefault("gres/gpu", value)
    return counts


def _number(text: str) -> Optional[int]:
    return int(text) if text.strip().isdigit() else None


def _rows(out: str, fields: Sequence[str]) -> List[Dict[str, str]]:
    return [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line.strip()]


def parse_qos(out: str) -> Dict[str, Limits]:
    """``sacctmgr -n -P show qos format=<QOS_FIELDS>``."""
    return {r["Name"]: Limits(tres(r["MaxTRES"]), tres(r["MaxTRESPU"]), tres(r["MaxTRESPA"]), tres(r["GrpTRES"]),
                              tres(r["MinTRES"]), minutes(r["MaxWall"]), _number(r["MaxJobsPU"]),
                              _number(r["MaxSubmitPU"]))
            for r in _rows(out, QOS_FIELDS)}


def parse_associations(out: str) -> Tuple[Association, ...]:
    """``sacctmgr -n -P show assoc user=U cluster=C format=<ASSOC_FIELDS>``."""
    return tuple(Association(r["Account"], r["Partition"], tuple(q for q in r["QOS"].split(",") if q),
                             r["DefaultQOS"], Limits(per_job=tres(r["MaxTRES"]), group=tres(r["GrpTRES"]),
                                                     max_wall_min=minutes(r["MaxWall"]),
                                                     max_jobs=_number(r["MaxJobs"]),
                                                     max_submit=_number(r["MaxSubmit"])))
                 for r in _rows(out, ASSOC_FIELDS))


def parse_partition_rules(out: str) -> Dict[str, PartitionRules]:
    """``scontrol show partition -o``: one line of ``Key=Value`` per partition."""
    def names(value: Optional[str]) -> Optional[Tuple[str, ...]]:
        return None if value in (None, "", "ALL") else tuple(value.split(","))

    rules = {}
    for line in out.splitlines():
        keys = dict(word.split("=", 1) for word in line.split() if "=" in word)
        if "PartitionName" in keys:
            rules[keys["PartitionName"]] = PartitionRules(
                qos="" if keys.get("QoS", "N/A") == "N/A" else keys["QoS"],
                allow_accounts=names(keys.get("AllowAccounts")), allow_qos=names(keys.get("AllowQos")),
                deny_accounts=names(keys.get("DenyAccounts")) or (), deny_qos=names(keys.get("DenyQos")) or ())
    return rules


def enforce_words(config: str) -> Tuple[str, ...]:
    """AccountingStorageEnforce from ``scontrol show config``: ``associations,limits,qos`` as words; () for none."""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "AccountingStorageEnforce":
            return tuple(w for w in value.strip().lower().split(",") if w and w != "none")
    return ()


# ---- the cache -------------------------------------------------------------------------------------------------

def cached(path: Path, ask, now: Optional[float] = None) -> SiteRules:
    """The rules in ``path`` if written within :data:`CACHE_TTL_S`, else ``ask()``'s, written there (0600) for the
    next command. A cache that cannot be read or written, or in a folder another user could change (which would
    let them say what the site allows: launcher/core/safepath.py), is only asked around."""
    now = time.time() if now is None else now
    try:
        check_tree(path.parent, "cache folder", HOME)
    except UnsafePath:
        return ask()
    try:
        if now - path.stat().st_mtime < CACHE_TTL_S:
            return SiteRules.from_json(path.read_text())
    except (OSError, ValueError, KeyError, TypeError):
        pass
    rules = ask()
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, rules.to_json())  # 0600: its directory's mode
    except OSError:
        pass
    return rules


# ---- the judgement ---------------------------------------------------------------------------------------------

@dataclass
class SiteVerdict:
    refusals: List[str] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)


def judge_site(req: Request, rules: SiteRules, jobs: Sequence[JobRow], ways: bool = True) -> SiteVerdict:
    """Whether Slurm would take ``req`` from this user and could ever start it, and whether it will wait behind the
    user's own ``jobs`` (squeue's rows, anyone's: only the user's count). ``ways``: a refusal says what would run
    instead."""
    verdict = SiteVerdict()
    under = access(req, rules)
    if isinstance(under, str):
        verdict.refusals.append(under)
        return verdict
    account, qos = under
    mine = [job for job in jobs if job.user == rules.user and job.state.upper() in ("PENDING", "RUNNING")]
    for who, limits in _limits_of(req, rules, account, qos):
        found = never_starts(req, who, limits, len(mine))
        if found:
            verdict.refusals.append(found + (_way_out(req, rules, account, qos) if ways else ""))
            return verdict
        verdict.warnings += _waits(req, who, limits, [j for j in mine if not j.qos or j.qos == qos])
    return verdict


def access(req: Request, rules: SiteRules) -> Union[Tuple[str, str], str]:
    """(account, QOS) the job would run under, or why Slurm would reject it at submission."""
    if not rules.associations:
        return (f"user {rules.user} has no association on this cluster (no Slurm account to run under): ask the "
                "site's admins for one")
    accounts = sorted({a.account for a in rules.associations})
    account = req.account or rules.default_account or accounts[0]
    if account not in accounts:
        return f"cluster.account={account} is not one of your accounts ({', '.join(accounts)}): set one of them"
    assoc = _association(rules, account, req.partition)
    if assoc is None:
        return f"account {account} may not use partition '{req.partition}': pick another partition or account"
    part = rules.partitions.get(req.partition, PartitionRules())
    if (part.allow_accounts is not None and account not in part.allow_accounts) or account in part.deny_accounts:
        return f"partition '{req.partition}' does not take jobs of account {account}: pick another partition or account"
    qos = req.qos or assoc.default_qos or ("normal" if not assoc.qos or "normal" in assoc.qos else assoc.qos[0])
    if "qos" in rules.enforce and assoc.qos and qos not in assoc.qos:
        return (f"cluster.qos={qos} is not one of account {account}'s QOS for you ({', '.join(assoc.qos)}): set one "
                "of them")
    if (part.allow_qos is not None and qos not in part.allow_qos) or qos in part.deny_qos:
        allowed = ", ".join(part.allow_qos) if part.allow_qos is not None else f"any but {', '.join(part.deny_qos)}"
        return f"partition '{req.partition}' does not take QOS {qos} (it takes {allowed}): set cluster.qos"
    return account, qos


def _association(rules: SiteRules, account: str, partition: str) -> Optional[Association]:
    """The association a job of ``account`` in ``partition`` runs under: the partition's own, else the account's."""
    of_account = [a for a in rules.associations if a.account == account]
    return next((a for a in of_account if a.partition == partition), None) or \
        next((a for a in of_account if not a.partition), None)


def _limits_of(req: Request, rules: SiteRules, account: str, qos: str) -> List[Tuple[str, Limits]]:
    """The limits that apply, each with the words that name it: the job's QOS, the partition's, the association."""
    if "limits" not in rules.enforce and "safe" not in rules.enforce:
        return []
    part_qos = rules.partitions.get(req.partition, PartitionRules()).qos
    found = [(f"QOS {qos}", rules.qos.get(qos, Limits()))]
    if part_qos and part_qos != qos:
        found.append((f"partition '{req.partition}''s QOS {part_qos}", rules.qos.get(part_qos, Limits())))
    assoc = _association(rules, account, req.partition)
    found.append((f"account {account}", assoc.limits if assoc else Limits()))
    return found


def never_starts(req: Request, who: str, limits: Limits, queued: int) -> Optional[str]:
    """Why ``req`` can never start (or be submitted) under ``limits``, or None."""
    for name, need in req.tres.items():
        word = TRES_WORDS[name]
        asked = f"gpus={need}" if name == "gres/gpu" else f"a run of {need} {word}"
        for cap, how, key in ((limits.per_job, "per job", "MaxTRESPerJob"),
                              (limits.per_user, "to each user at once", "MaxTRESPerUser"),
                              (limits.per_account, "to each account at once", "MaxTRESPerAccount"),
                              (limits.group, "to all its jobs together", "GrpTRES")):
            if name in cap and need > cap[name]:
                return (f"{asked} can never start under {who}, which allows at most {cap[name]} {word} {how} "
                        f"({key}={name}={cap[name]})")
        if name in limits.min_per_job and need < limits.min_per_job[name]:
            return (f"{asked} is too small for {who}, which takes jobs of at least {limits.min_per_job[name]} {word} "
                    f"(MinTRESPerJob={name}={limits.min_per_job[name]})")
    if limits.max_wall_min is not None and req.minutes is not None and req.minutes > limits.max_wall_min:
        return (f"cluster.time_limit_min={req.minutes} is above {who}'s MaxWall of {limits.max_wall_min} min: lower "
                "cluster.time_limit_min")
    if limits.max_submit is not None and queued + JOBS_PER_RUN > limits.max_submit:
        return (f"you have {queued} jobs queued or running and {who} takes at most {limits.max_submit} per user "
                f"(MaxSubmitJobsPerUser); a run submits {JOBS_PER_RUN} (its job and its watcher): wait for some to end")
    return None


def _way_out(req: Request, rules: SiteRules, account: str, qos: str) -> str:
    """What would run instead: fewer GPUs within every limit, or another of the user's QOS that takes the run."""
    ways = []
    most = largest_gpus(req, rules, account, qos)
    if most is not None and 0 < most < req.gpus:
        ways.append(f"gpus={most}")
    assoc = _association(rules, account, req.partition)
    for other in (assoc.qos if assoc else ()):
        instead = dataclasses.replace(req, qos=other, account=account)
        if other != qos and not judge_site(instead, rules, (), ways=False).refusals:
            ways.append(f"cluster.qos={other}")
    return f": use {' or '.join(ways)}" if ways else ""


def largest_gpus(req: Request, rules: SiteRules, account: str, qos: str) -> Optional[int]:
    """The most GPUs a run may ask for under the QOS and association limits (None: they set none)."""
    return min((cap for cap, _ in _gpu_caps(req, rules, account, qos)), default=None)


def _gpu_caps(req: Request, rules: SiteRules, account: str, qos: str) -> List[Tuple[int, str]]:
    """Each limit on a job's GPUs that applies, with the words that name it."""
    return [(cap["gres/gpu"], f"{who}, {key}") for who, limits in _limits_of(req, rules, account, qos)
            for cap, key in ((limits.per_job, "MaxTRESPerJob"), (limits.per_user, "MaxTRESPerUser"),
                             (limits.per_account, "MaxTRESPerAccount"), (limits.group, "GrpTRES"))
            if "gres/gpu" in cap]


def _waits(req: Request, who: str, limits: Limits, mine: Sequence[JobRow]) -> List[str]:
    """Why ``req`` will wait behind the user's own queued and running ``mine`` under ``limits``."""
    found = []
    cap = limits.per_user.get("gres/gpu")
    held = [job for job in mine if job.gpus]
    if cap is not None and held and req.gpus + sum(j.gpus for j in held) > cap:
        found.append(f"will wait: {who} allows each user {cap} GPUs at once and your jobs "
                     f"{', '.join(j.job_id for j in held)} hold or ask for {sum(j.gpus for j in held)}")
    running = [job for job in mine if job.state.upper() == "RUNNING"]
    if limits.max_jobs is not None and len(running) >= limits.max_jobs:
        found.append(f"will wait: {who} runs at most {limits.max_jobs} jobs per user at once and "
                     f"{len(running)} of yours run ({', '.join(j.job_id for j in running)})")
    return found


def largest_run(rules: SiteRules, partition: str, most: int) -> Tuple[int, str]:
    """The most GPUs one run of this user may ask for on ``partition`` (at most ``most``, what the partition can
    hold) under their default account and QOS, and what sets it; (0, why) where they may not run there at all."""
    req = Request(gpus=most, nodes=1, cpus=1, minutes=None, account=None, qos=None, partition=partition)
    under = access(req, rules) if rules.enforced else None
    if isinstance(under, str):
        return 0, under
    return min([(most, "the partition"), *(_gpu_caps(req, rules, *under) if under else ())], key=lambda c: c[0])
