"""Every check that can refuse a launch, made the same way for a launch, a dry run and ``launcher plan``.

A launch that would be refused must be refused before anything is submitted, and a dry run or a plan, the tools
meant for checking before GPU hours are spent, must say so in the same words. So all of them ask :func:`judge`:

- the launch refuses with the first refusal (one line, exit 2, nothing created);
- a dry run prints the plan and the script, then every refusal, and exits 2 if there is one (0 with warnings);
- ``launcher plan`` marks each row a launch would refuse (``--check``: exit 2 if any).

What is checked: the tracker's package, the share group, the launcher home and the run root (without creating
them), the memory gate and the run's budgets (launcher/forecast/gate.py), the tasks' Python, the partition's
limits (launcher/slurm/fit.py), and the site's accounts, QOS and their limits (launcher/slurm/limits.py): the
runs of one launch count against those limits together, behind the user's own queued and running jobs. A check
that needs a cluster that does not answer (or one reached over SSH, which checks there when launching) is not a
refusal: the verdict says which checks were not made and why.
"""
from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

from launcher.compose.catalog import other_clusters
from launcher.compose.composer import ComposedRun
from launcher.core.config import ClusterConfig, tracker_missing
from launcher.core.privacy import group_id
from launcher.core.rundir import SOURCE_ROOT, launcher_home
from launcher.core.run_index import root_problem
from launcher.core.safepath import check_home
from launcher.errors import LaunchError
from launcher.forecast.gate import Finding, fit_findings, machine_for, sweep_label
from launcher.job.entry import NoTorch
from launcher.job.stage_env import not_an_environment
from launcher.slurm.client import NoPartition, Partition, Slurm, SlurmError, for_cluster, not_the_local_cluster
from launcher.slurm.fit import cpus_per_task, refusal
from launcher.slurm.limits import Request, SiteRules, judge_site
from launcher.slurm.output import JobRow

# What the tasks' Python must import (the launcher itself comes from the run's frozen code on PYTHONPATH).
TASK_MODULES = ("torch", "submitit", "omegaconf", "yaml", "numpy")
# Asked of another interpreter without importing anything: the names of the modules it cannot find.
_FIND = ("import importlib.util as u, sys; print('missing:', *(m for m in sys.argv[1:] if u.find_spec(m) is None))")
PYTHON_CHECK_TIMEOUT_S = 20


@dataclass
class Verdict:
    """What the checks found (each a :class:`Finding` of one run), and the checks not made, with why: those Slurm
    could not be asked (``unchecked``), and the site's limits on a cluster whose accounting enforces none
    (``unenforced``, a lasting fact of the site that ``plan`` and ``clusters`` say, and a launch does not)."""

    findings: List[Finding] = field(default_factory=list)
    unchecked: List[str] = field(default_factory=list)
    unenforced: List[str] = field(default_factory=list)

    @property
    def refusals(self) -> List[Finding]:
        return [f for f in self.findings if f.refuses]

    @property
    def warnings(self) -> List[Finding]:
        return [f for f in self.findings if not f.refuses]

    def refusing(self, index: int) -> List[str]:
        """The reasons run ``index`` would be refused."""
        return [f.text for f in self.refusals if f.run == index]

    def lines(self, runs: Sequence[ComposedRun], findings: Sequence[Finding]) -> List[str]:
        return [sweep_label(runs[f.run], runs) + f.text for f in findings]

    def error(self, runs: Sequence[ComposedRun]) -> LaunchError:
        """The launch's one-line refusal: the first run's first reason, and how many runs are refused."""
        refused = sorted({f.run for f in self.refusals})
        first = next(f for f in self.refusals if f.run == refused[0])
        more = (f" ({len(refused)} of {len(runs)} runs refused; nothing was submitted)" if len(runs) > 1 else "")
        return LaunchError(self.lines(runs, [first])[0] + more)


def judge(runs: Sequence[ComposedRun]) -> Verdict:
    """Every check of every run, before anything is created or submitted."""
    verdict = Verdict()
    machine = machine_for(runs)
    partitions: Dict[tuple, tuple] = {}
    sites: Dict[Optional[str], Optional[_Site]] = {}
    home = _problem(lambda: check_home(launcher_home()))
    for index, run in enumerate(runs):
        cfg = run.config
        found = [local_problem(cfg.cluster), tracker_missing(cfg.tracking.backend),
                 _problem(lambda: group_id(cfg.share_group)), home,
                 root_problem(cfg.run_root, cfg.share_group) if not cfg.cluster.ssh else None]
        verdict.findings += [Finding(index, text) for text in found if text]
        part, problem = _partition(cfg.cluster, partitions, verdict.unchecked)
        verdict.findings += adopt_max_time(index, run, part)
        verdict.findings += fit_findings(index, run, machine)
        verdict.findings += python_findings(index, cfg.cluster, verdict.unchecked)
        fits = refusal(run.plan, cfg.cluster, part) if part is not None else problem
        verdict.findings += [Finding(index, fits)] if fits else []
        if part is not None and not fits:
            verdict.findings += site_findings(index, run, part, sites, verdict)
    return verdict


def adopt_max_time(index: int, run: ComposedRun, part: Optional[Partition]) -> List[Finding]:
    """A partition the user chose (on the command line or in a run file) whose MaxTime is below the cluster file's
    time limit brings its MaxTime, with a note: asking for ``cluster.partition=debug`` asks for its limit, not
    for a refusal of the cluster file's 60 minutes. Never a longer limit, nor over a limit the user set."""
    chosen = {line.split("=", 1)[0].lstrip("+") for line in run.overrides}
    limit = part.max_time_min if part is not None else None
    cluster = run.config.cluster
    if "cluster.partition" not in chosen or "cluster.time_limit_min" in chosen or limit is None or \
            limit >= cluster.time_limit_min:
        return []
    before = cluster.time_limit_min
    cluster.time_limit_min = run.resolved.cluster.time_limit_min = limit
    return [Finding(index, f"cluster.time_limit_min is {limit}, partition '{part.name}''s MaxTime, not the cluster "
                           f"file's {before} (set cluster.time_limit_min to choose another)", refuses=False)]


@dataclass
class _Site:
    """A cluster's rules for this user, and its jobs so far: the user's queued and running ones, then the runs of
    this launch already judged (each will be one more job behind the next)."""

    rules: SiteRules
    jobs: List[JobRow]


def site_findings(index: int, run: ComposedRun, part: Partition, sites: Dict[Optional[str], Optional[_Site]],
                  verdict: Verdict) -> List[Finding]:
    """Whether the site's accounting takes the run and lets it start (launcher/slurm/limits.py), asked once per
    cluster; where accounting enforces nothing, or cannot be asked, a note in the verdict says so."""
    cluster = run.config.cluster
    slurm = for_cluster(cluster)
    if slurm.conf not in sites:
        sites[slurm.conf] = _site(slurm, cluster.name, verdict)
    site = sites[slurm.conf]
    if site is None:
        return []
    plan = run.plan
    req = Request(gpus=plan.gpus, nodes=plan.nodes, cpus=plan.nodes * plan.tasks_per_node * cpus_per_task(cluster),
                  minutes=cluster.time_limit_min, account=cluster.account, qos=cluster.qos, partition=part.name)
    found = judge_site(req, site.rules, site.jobs)
    site.jobs.append(JobRow(f"(run {index + 1} of this launch)", "PENDING", "", "", "", user=site.rules.user,
                            gpus=plan.gpus, qos=cluster.qos or ""))
    return [Finding(index, text) for text in found.refusals] + \
        [Finding(index, text, refuses=False) for text in found.warnings]


def _site(slurm: Slurm, name: str, verdict: Verdict) -> Optional[_Site]:
    try:
        rules = slurm.site_rules()
        if not rules.enforced:
            _note(verdict.unenforced, f"the site's account and QOS limits on cluster {name}: its accounting enforces "
                                      "none (AccountingStorageEnforce), so Slurm refuses no run for them")
            return None
        return _Site(rules, slurm.squeue(user=rules.user))
    except SlurmError as err:
        _note(verdict.unchecked, f"the site's account and QOS limits on cluster {name} ({err})")
        return None


def local_problem(cluster: ClusterConfig) -> Optional[str]:
    """Cluster ``local`` is this machine's test cluster (slurm/up.sh, virtual GPUs): with a site's slurm.conf in
    $SLURM_CONF it would submit there with ``virtual_gpus: true``, which turns off the check that refuses to train
    on CPUs where GPUs are expected."""
    if cluster.name != "local" or cluster.ssh:
        return None
    conf = for_cluster(cluster).conf
    if not not_the_local_cluster(conf):
        return None
    return (f"cluster local is the local test cluster of slurm/up.sh, but $SLURM_CONF names another cluster's "
            f"slurm.conf ({conf}): add that cluster with 'launcher clusters add NAME' and launch with cluster=NAME"
            f"{other_clusters('local')}")


def _problem(check) -> Optional[str]:
    try:
        check()
    except (PermissionError, ValueError) as err:
        return str(err)
    return None


def _partition(cluster: ClusterConfig, asked: Dict[tuple, tuple],
               unchecked: List[str]) -> Tuple[Optional[Partition], Optional[str]]:
    """The run's partition as Slurm describes it (asked once per cluster and partition), or why there is none:
    Slurm's refusal (no such partition), or None where Slurm cannot be asked (a note in ``unchecked`` says why)."""
    if cluster.ssh:
        _note(unchecked, f"cluster {cluster.name} is reached over SSH: its partition's limits are checked there "
                         "when launching")
        return None, None
    slurm = for_cluster(cluster)
    key = (slurm.conf, cluster.partition)
    if key not in asked:
        try:
            asked[key] = slurm.partition(cluster.partition), None
        except NoPartition as err:  # Slurm answered: the partition itself is wrong
            asked[key] = None, str(err)
        except SlurmError as err:
            asked[key] = None, None
            _note(unchecked, f"the partition's limits on cluster {cluster.name} ({err})")
    return asked[key]


def _note(unchecked: List[str], note: str) -> None:
    if note not in unchecked:
        unchecked.append(note)


def python_findings(index: int, cluster: ClusterConfig, unchecked: List[str]) -> List[Finding]:
    """The tasks' Python, where this host can see it: executable by this user, and finding torch and the tasks'
    other packages (asked without importing them). One the host cannot see (it may exist only on the nodes) is
    a warning; a container's is not checked, nor a remote cluster's (its own launch checks it)."""
    if cluster.container.image is not None:
        _note(unchecked, "the container's Python (cluster.container.python): it is inside the image")
        return []
    if cluster.ssh:
        return []
    python = cluster.python or sys.executable
    path = python if os.sep in python else shutil.which(python)
    if path is None or not os.path.exists(path):
        return [Finding(index, f"cluster.python={python} does not exist on this host, so it was not checked: it "
                               "must exist on the cluster's nodes, with the [train] extra", refuses=False)]
    if not os.access(path, os.X_OK) or os.path.isdir(path):
        return [Finding(index, f"cluster.python={python} cannot be executed by you (mode "
                               f"{os.stat(path).st_mode & 0o777:o}); name an interpreter you may run")]
    missing = missing_modules(path)
    if isinstance(missing, str):
        return [Finding(index, f"cluster.python={python} {missing}; name an interpreter with the [train] extra")]
    if "torch" in missing:
        return [Finding(index, str(NoTorch(python)))]
    if missing:
        return [Finding(index, f"the tasks' Python {python} lacks {', '.join(missing)}: install "
                               "'slurm-gpt-launcher[train]' there (cluster.python)")]
    refused = cluster.stage_env and not_an_environment(python, Path(path).parent.parent)  # bin/python's prefix
    return [Finding(index, f"cluster.stage_env=true: {refused}")] if refused else []


@functools.lru_cache(maxsize=None)
def missing_modules(python: str) -> Union[List[str], str]:
    """The modules of :data:`TASK_MODULES` that ``python`` cannot find (this process's own when it is the same
    interpreter), or what went wrong asking it."""
    if os.path.abspath(python) == os.path.abspath(sys.executable):  # not realpath: a venv's python is a symlink
        return [name for name in TASK_MODULES if importlib.util.find_spec(name) is None]
    try:
        proc = subprocess.run([python, "-c", _FIND, *TASK_MODULES], capture_output=True, text=True,
                              timeout=PYTHON_CHECK_TIMEOUT_S)
    except OSError as err:
        return f"cannot be run ({err.strerror})"
    except subprocess.TimeoutExpired:
        return f"did not answer within {PYTHON_CHECK_TIMEOUT_S} s"
    answer = proc.stdout.split()
    if proc.returncode != 0 or answer[:1] != ["missing:"]:
        said = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}, no answer"])[-1]
        return f"is not a Python that runs here ({said})"
    return answer[1:]


PACK_TIMEOUT_S = 3600  # a first packing of the tasks' environment: minutes for one of a few GB


def pack_environment(python: str) -> None:
    """With ``cluster.stage_env``: the tasks' Python ``python`` packs its environment where this version is not
    packed yet (launcher/job/stage_env.py), the launcher's code on its path; LaunchError with its reason in one line
    where it cannot."""
    try:
        proc = subprocess.run([python, "-m", "launcher.job.stage_env", "pack"], capture_output=True, text=True,
                              timeout=PACK_TIMEOUT_S, env={**os.environ, "PYTHONPATH": str(SOURCE_ROOT)})
    except (OSError, subprocess.TimeoutExpired) as err:
        raise LaunchError(f"cluster.stage_env=true: the tasks' Python {python} could not pack its environment: "
                          f"{err}") from None
    if proc.returncode != 0:
        said = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise LaunchError(f"cluster.stage_env=true: {said}")
