"""``cluster=auto``: a run placed on the candidate cluster where it starts first.

The candidates are the clusters ``cluster.candidates=[a,b]`` names, else every configured cluster (each cluster file
of every config layer, local or reached over SSH: launcher/compose/catalog.py ``cluster_choices``). The run is composed
for each of them here (a mistake is found at once, and one cluster's refusal of the composition is that cluster's
line), then every candidate is asked at once, each in a thread of its own and bounded by :data:`ASK_TIMEOUT_S`: a
cluster of this machine through its Slurm, one over SSH through its agent, which asks on its own side
(launcher/submit/placement.py ``ask_here``, the same code). A cluster that does not answer in time is one line;
nothing waits for it.

:func:`place` serves a launch, a dry run and ``launcher plan``, and with :func:`again` an existing run's request
(``launcher move RUN cluster=auto``, and :func:`sooner`, which tells a waiting run's ``describe`` where it would start
sooner, asked when ``describe`` is asked, never while the job waits).
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import OverrideParseException

from launcher.compose.catalog import AUTO_CLUSTER as AUTO, cluster_choices
from launcher.compose.composer import ComposedRun, compose_runs, one_line
from launcher.compose.runfile import key_of, read_run_file, without_cluster
from launcher.core.config import ClusterConfig, RunConfig, load_run_config
from launcher.core.rundir import CONFIG
from launcher.errors import LaunchError
from launcher.remote.agent import run_item
from launcher.remote.clusters import remote_of
from launcher.remote.ship import call
from launcher.remote.ssh import Unreachable
from launcher.slurm.client import for_cluster
from launcher.slurm.output import SlurmError, start_epoch
from launcher.submit.placement import ASK_TIMEOUT_S, REMOTE_MARGIN_S, Candidate, ask_here, best_first, cannot
from launcher.views.lookup import invocation

CANDIDATES = "cluster.candidates"


@dataclass
class Placement:
    """The candidates as asked, best first, and the run composed for each cluster that took the composition."""

    candidates: List[Candidate]
    runs: Dict[str, ComposedRun] = field(default_factory=dict)

    @property
    def chosen(self) -> Optional[ComposedRun]:
        """The run composed for the best candidate, or None where no candidate can run it."""
        best = self.candidates[0] if self.candidates else None
        return self.runs[best.cluster] if best is not None and best.start is not None else None

    def refusal(self) -> LaunchError:
        """The one line of a launch that no candidate can take."""
        return LaunchError(f"cluster=auto: none of the {len(self.candidates)} candidate clusters can run it "
                           f"({'; '.join(c.line for c in self.candidates)})")


def place(overrides: Sequence[str], multirun: bool = False, leave_out: Sequence[str] = (), asker=None) -> Placement:
    """Compose the run of ``overrides`` (which say ``cluster=auto``) for each candidate cluster but those left out,
    ask them all at once (:func:`ask`, or ``asker``), and return them best first. LaunchError for a sweep, or a
    candidate that is no configured cluster."""
    if multirun:
        raise LaunchError("cluster=auto places one run; a sweep (-m) names its clusters: -m cluster=a,b")
    names = candidate_names(overrides)
    runs: Dict[str, ComposedRun] = {}
    refused: List[Candidate] = []
    for name in (name for name in names if name not in leave_out):
        try:
            (runs[name],) = compose_runs(for_candidate(overrides, name, names))
        except LaunchError as err:
            refused.append(cannot(name, f"refused: {err.message}"))
    answers = {c.cluster: c for c in (asker or ask)(list(runs.values())) + refused}
    return Placement(best_first([answers[name] for name in names if name in answers]), runs)


def again(run_dir: Path, names: Sequence[str] = ()) -> List[str]:
    """The overrides that place the run of ``run_dir`` again with ``cluster=auto``: its own request (run.yaml, its
    cluster's settings left to each candidate's, as a move composes it) among ``names``, else among the candidates it
    records, else every configured cluster (``launcher move``)."""
    kept = without_cluster(read_run_file(run_dir / "run.yaml"))
    chosen = list(names) or load_run_config(run_dir / CONFIG).cluster.candidates
    return [*kept, f"cluster={AUTO}", *([f"{CANDIDATES}=[{','.join(chosen)}]"] if chosen else [])]


def candidate_names(overrides: Sequence[str]) -> List[str]:
    """The clusters ``cluster.candidates=[a,b]`` names (each a configured one), else every configured cluster (but
    the package's template for a site)."""
    known = cluster_choices()  # the files' names, as cluster=NAME composes them
    given = [line for line in overrides if key_of(line) == CANDIDATES]
    if not given:
        return known
    try:
        value = OverridesParser.create().parse_overrides(given[:1])[0].value()
    except OverrideParseException as err:
        raise LaunchError(f"{given[0]}: {one_line(err)}; name clusters as cluster.candidates=[a,b]") from None
    names = list(dict.fromkeys(str(name) for name in (value if isinstance(value, list) else [value]) if name))
    unknown = [name for name in names if name not in known or name == AUTO]
    if not names or unknown:
        raise LaunchError(f"{given[0]} must name configured clusters ({', '.join(known)})"
                          + (f", not {', '.join(unknown)}" if unknown else ""))
    return names


def for_candidate(overrides: Sequence[str], name: str, names: Sequence[str]) -> List[str]:
    """The overrides of the run on cluster ``name``, recording the candidates (config.yaml and run.yaml keep them)."""
    kept = [line for line in overrides if line != f"cluster={AUTO}" and key_of(line) != CANDIDATES]
    return [*kept, f"cluster={name}", f"{CANDIDATES}=[{','.join(names)}]"]


def ask(runs: Sequence[ComposedRun], timeout: float = ASK_TIMEOUT_S) -> List[Candidate]:
    """Ask each run's cluster (one run per cluster) at once when it would start there: a cluster of this machine
    through its Slurm, one over SSH through its agent. Each answers within ``timeout`` or is one line saying it
    did not; the answers in the order of ``runs``."""
    answers: Dict[str, Candidate] = {}

    def one(run: ComposedRun) -> None:
        answers[run.config.cluster.name] = _asked(run, timeout)

    threads = [threading.Thread(target=one, args=(run,), daemon=True) for run in runs]
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [answers.get(run.config.cluster.name) or cannot(run.config.cluster.name,
                                                           f"unreachable: no answer within {timeout:g} s")
            for run in runs]


def _asked(run: ComposedRun, timeout: float) -> Candidate:
    """One candidate's answer: here, or from its agent over SSH (which cannot be reached, or refuses the run there,
    in one line)."""
    cluster = run.config.cluster
    if not cluster.ssh:
        return ask_here(run, timeout)
    try:
        there = max(1.0, timeout - REMOTE_MARGIN_S)  # so that the agent says why it did not answer, within ours
        return Candidate(**call(remote_of(cluster), "place", {"runs": [run_item(run)], "timeout": there},
                                timeout=timeout))
    except Unreachable as err:
        return cannot(cluster.name, f"unreachable: {err.message}")
    except LaunchError as err:
        return cannot(cluster.name, f"refused: {err.message}")


@dataclass(frozen=True)
class Sooner:
    """Where a waiting run would start sooner than where it waits: the candidate, and the command that moves it."""

    candidate: Candidate
    command: str

    @property
    def words(self) -> str:
        when = self.candidate.words.removeprefix("starts ")
        return f"would start sooner on {self.candidate.cluster}: {when}; {self.command}"


SOONER_MAX_AGE_S = 60.0  # a run's answer is asked again at most once a minute (the console's refreshes)
_known: Dict[str, Tuple[float, Optional[Sooner]]] = {}  # by run directory: when asked, and the answer
_asking: Dict[str, threading.Lock] = {}  # by run directory: held while its candidates are asked
_guard = threading.Lock()


def sooner(run_dir: Path, cfg: RunConfig, name: str, job_id: str, asker=None) -> Optional[Sooner]:
    """For a waiting run that ``cluster=auto`` placed (its config names candidates): the other candidate where it
    would start first, where that is sooner than Slurm expects it where it waits (a job Slurm has not planned yet
    counts as later than any start elsewhere); None otherwise, and at once for a run placed by name. The run's own
    request is placed again (:func:`again`) among the other candidates, as a launch would place it (``asker``: how
    they are asked); the answer is kept for :data:`SOONER_MAX_AGE_S`, and asked once at a time however many pages
    ask, so a page refreshed every few seconds in several tabs asks once a minute."""
    if not [c for c in cfg.cluster.candidates if c != cfg.cluster.name]:
        return None
    key = str(run_dir)
    with _guard:
        asking = _asking.setdefault(key, threading.Lock())
    with asking:  # a second page waits for the first's answer rather than asking again
        kept = _known.get(key)
        if kept is not None and time.monotonic() - kept[0] < SOONER_MAX_AGE_S:
            return kept[1]
        try:
            _, best = elsewhere(run_dir, cfg, job_id, asker=asker)
        except LaunchError:  # a candidate no longer configured: nothing to say of the others
            best = None
        found = Sooner(best, f"{invocation()} move {name} cluster={best.cluster}") if best is not None else None
    with _guard:
        now = time.monotonic()
        for old in [other for other, (when, _) in _known.items() if now - when >= SOONER_MAX_AGE_S]:
            del _known[old]  # runs that moved, started or ended are not asked of again: their answers go
            if not _asking[old].locked():
                del _asking[old]
        _known[key] = (now, found)
    return found


def elsewhere(run_dir: Path, cfg: RunConfig, job_id: str, names: Sequence[str] = (),
              asker=None) -> Tuple[Placement, Optional[Candidate]]:
    """The waiting run of ``run_dir`` placed again (:func:`again`, among ``names`` where given) on every candidate
    but the cluster it waits on, and the best of them where it starts sooner than Slurm expects it where it waits
    (else None): what :func:`sooner` tells and ``launcher move RUN cluster=auto`` acts on."""
    placement = place(again(run_dir, names), leave_out=[cfg.cluster.name], asker=asker)
    best = next(iter(placement.candidates), None)
    if best is None or best.start is None or best.start >= _expected(cfg.cluster, job_id):
        return placement, None
    return placement, best


def _expected(cluster: ClusterConfig, job_id: str) -> float:
    """When Slurm expects a pending job to start (its StartTime), or never where it has not planned it
    (launcher/slurm/output.py :func:`start_epoch`) or does not answer."""
    try:
        rows = [r for r in for_cluster(cluster).squeue() if r.job_id == job_id]
    except SlurmError:
        return math.inf
    start = start_epoch(rows[0].start, time.time()) if rows else None
    return math.inf if start is None else start
