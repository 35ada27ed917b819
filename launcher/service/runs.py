"""The runs listing, for ``launcher runs`` and the console's runs page: one row per run, newest first, with its true
Slurm state and its progress, from this machine's run roots and every remote cluster.

A search's sweep (``Filters.sweep``) gives, in :func:`listing`, each trial's row its parameters, its state in the
study and its value, and the study itself (launcher/views/search_summary.py); a grid sweep lists as any runs."""
from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Set, Tuple, Union

from launcher.core.damage import DamagedRun
from launcher.core.metrics import FinalRow, Row
from launcher.core.rundir import search_ids
from launcher.core.run_index import RunRecord, load_or_damage, record_names, unique_prefix
from launcher.errors import LaunchError
from launcher.remote.clusters import remotes
from launcher.remote.ship import remote_error, run_launcher
from launcher.remote.ssh import Remote
from launcher.status.job_state import DAMAGED, STATES, JobState, job_states
from launcher.status.run_files import RunFiles
from launcher.views.lookup import parse_since, slurm_seconds, sweep_runs
from launcher.views.search_summary import search_of

if TYPE_CHECKING:
    from launcher.search.view import SearchView


@dataclass(frozen=True)
class Filters:
    """Which runs a listing chooses: by cluster, model, GPU count, submit time (``since``: 30m, 2h, 3d, 1w or a
    date), sweep (its id or a unique prefix) and state, newest first, at most ``limit`` unless ``all``;
    ``local_only``: this machine's run roots only (a root was named), no remote cluster asked."""

    cluster: Optional[str] = None
    model: Optional[str] = None
    gpus: Optional[int] = None
    since: Optional[str] = None
    sweep: Optional[str] = None
    status: Optional[Set[str]] = None
    all: bool = False
    limit: int = 50
    local_only: bool = False


@dataclass
class RunRow:
    """A run as listed: its record, state and latest metrics, flattened (this is ``--json``)."""

    name: str
    job_id: Optional[str]
    cluster: str
    model: str
    gpus: int
    nodes: int
    gpus_per_node: int
    status: str
    reason: str
    step: Optional[int]
    steps: int
    loss: Optional[float]
    tokens_per_s: Optional[float]
    mfu: Optional[float]
    submitted_at: float
    elapsed_s: Optional[float]
    eta_s: Optional[float]
    sweep: Optional[str]
    run_dir: str
    state_source: str
    attempts: int  # starts of the run's job: the first, and each requeue or retry (launcher/job/recovery.py)
    # A last known state (Slurm not answering): when it was known, wall-clock (launcher/status/job_state.py); else None.
    as_of: Optional[float] = None
    # What tokens_per_s and mfu are: "interval", the newest logged interval's; "attempt", the mean of the attempt
    # that ended (its final row); None before the current attempt's first row.
    rates_over: Optional[str] = None
    # A search's trial, listed with --sweep: its number, drawn parameters (by key), state in the study (RUNNING,
    # COMPLETE, FAIL, PRUNED, WAITING) and value. A row that is no such trial has none of these keys in --json.
    trial: Optional[int] = None
    params: Optional[Dict[str, Any]] = None
    trial_state: Optional[str] = None
    value: Optional[float] = None


def build_row(rec: RunRecord, state: JobState) -> RunRow:
    """The run's row, from its record, its state and what telling the state read of its directory: its step, loss,
    throughput and ETA are the current attempt's (launcher/core/attempt_log.py ``Current``)."""
    files = state.files or RunFiles(rec.run_dir)
    latest = files.last_metrics
    if latest is not None and not files.attempts.current().holds(latest.time):
        latest = None  # an earlier attempt's: the current one has logged no step yet, its figures are not known
    row = latest or Row(step=0)  # before the current attempt's first row every figure is null
    step = latest.step if latest else None
    elapsed = slurm_seconds(state.elapsed)
    eta = None
    if state.state == "RUNNING" and step is not None and row.step_time:
        eta = max(0, rec.steps - step) * row.step_time
    return RunRow(
        name=rec.name, job_id=rec.job_id, cluster=rec.cluster, model=rec.model, gpus=rec.gpus, nodes=rec.nodes,
        gpus_per_node=rec.gpus_per_node, status=state.state, reason=with_rebuilt(state.reason, rec), step=step,
        steps=rec.steps,
        loss=row.loss, tokens_per_s=row.tokens_per_s, mfu=row.mfu,
        submitted_at=rec.submitted_at, elapsed_s=elapsed, eta_s=eta, sweep=rec.sweep, run_dir=rec.run_dir,
        state_source=state.source,
        attempts=files.attempts.count, as_of=state.as_of,
        rates_over=None if latest is None else "attempt" if isinstance(latest, FinalRow) else "interval",
    )


def with_rebuilt(reason: str, rec: RunRecord) -> str:
    """The row's reason, and that its record was rebuilt from the run's own files, where it was."""
    rebuilt = f"record rebuilt from events.jsonl and plan.json: {rec.rebuilt}" if rec.rebuilt else ""
    return "; ".join(filter(None, [reason, rebuilt]))


def damaged_row(damage: DamagedRun, submitted_at: float) -> RunRow:
    """A run whose record cannot be read: listed, never hidden, as DAMAGED with the file and how."""
    return RunRow(name=damage.run_dir.name, job_id=None, cluster="", model="", gpus=0, nodes=0, gpus_per_node=0,
                  status=DAMAGED, reason=damage.reason, step=None, steps=0, loss=None, tokens_per_s=None, mfu=None,
                  submitted_at=submitted_at, elapsed_s=None, eta_s=None, sweep=None, run_dir=str(damage.run_dir),
                  state_source="run directory", attempts=0)


Listed = Tuple[float, Union[RunRecord, DamagedRun]]  # (submit time, the run or why it cannot be read)


def rows_for(runs: List[Listed]) -> List[RunRow]:
    states = job_states([run for _, run in runs if isinstance(run, RunRecord)])
    return [build_row(run, states[run.name]) if isinstance(run, RunRecord) else damaged_row(run, submitted)
            for submitted, run in runs]


TRIAL_FIELDS = ("trial", "params", "trial_state", "value")


def row_dict(row: RunRow) -> Dict[str, Any]:
    """The row as --json writes it: a trial's fields only for a trial of a search listed with --sweep."""
    fields = asdict(row)
    return fields if row.trial_state is not None else {k: v for k, v in fields.items() if k not in TRIAL_FIELDS}


def select(roots: List[Path], chosen: Filters) -> Listing:
    """This machine's runs the filters choose, newest first, at most ``limit`` unless ``all``, and how many of each
    state ``status`` left out (so that an empty listing can say runs exist, only in other states).

    A damaged run (its record cannot be read) is listed whatever ``model`` and ``gpus`` say, as they
    cannot be known; only a ``status`` without DAMAGED, or a sweep (also unknown), leaves it out."""
    limit = None if chosen.all else chosen.limit
    since = parse_since(chosen.since) if chosen.since else None
    runs: List[Listed] = []
    if chosen.sweep:
        runs = [(rec.submitted_at, rec) for rec in sweep_runs(roots, chosen.sweep)
                if wanted(rec, chosen) and (since is None or rec.submitted_at >= since)]
    else:
        named = [(mtime, root, name) for root in roots for mtime, name in record_names(root)]
        for mtime, root, name in sorted(named, key=lambda item: -item[0]) if len(roots) > 1 else named:
            if since is not None and mtime < since:
                break  # newest first: everything after this is older
            run = load_or_damage(root / name)
            if isinstance(run, RunRecord) and not wanted(run, chosen):
                continue
            if isinstance(run, DamagedRun) and chosen.status and DAMAGED not in chosen.status:
                continue
            runs.append((mtime, run))
            if limit is not None and not chosen.status and len(runs) >= limit:
                break
    rows = rows_for(runs)
    left_out = Counter(row.status for row in rows if chosen.status and row.status not in chosen.status)
    rows = [row for row in rows if row.status in chosen.status] if chosen.status else rows
    return Listing(rows if limit is None else rows[:limit], left_out=dict(left_out))


@dataclass
class Listing:
    """The rows a listing found, why each remote cluster that did not answer did not (its rows are missing), for a
    search's sweep its study, and the states of this machine's runs that ``status`` left out, with how many of
    each."""

    rows: List[RunRow]
    unanswered: List[str] = field(default_factory=list)
    search: Optional["SearchView"] = None
    left_out: Dict[str, int] = field(default_factory=dict)


def gather(roots: List[Path], chosen: Filters) -> Listing:
    """The runs of this machine (unless ``cluster`` names a remote cluster) and of every remote cluster (unless
    ``local_only``), newest first: each remote cluster is asked at once, one round trip each, and one that does not
    answer is said in ``unanswered``, the others still listed."""
    far = [] if chosen.local_only else [r for r in remotes() if not chosen.cluster or r.cluster == chosen.cluster]
    here = not (chosen.cluster and far)  # a cluster naming a remote cluster: only its runs
    asking = remote_rows(far, chosen)  # the clusters answer while this machine's runs are read
    found = select(roots, chosen) if here else Listing([])
    # a damaged run's cluster is not known: a cluster chosen leaves it out
    found.rows = [row for row in found.rows if not chosen.cluster or row.cluster == chosen.cluster]
    if not far:
        return found
    for answer in asking():
        if isinstance(answer, str):
            found.unanswered.append(f"{answer}; its runs are not listed")
        else:
            found.rows += answer
    found.rows.sort(key=lambda row: -row.submitted_at)
    found.rows = found.rows if chosen.all else found.rows[:chosen.limit]
    return found


def remote_rows(far: List[Remote], chosen: Filters) -> Callable[[], List[Union[str, List[RunRow]]]]:
    """Ask each remote cluster for its rows (``launcher runs --json`` there, with the same filters), in parallel
    threads; returns the function that waits for the answers: each cluster's rows, or why it did not answer."""
    forwarded = [*(["--status", ",".join(sorted(chosen.status))] if chosen.status else []),
                 *(["--model", chosen.model] if chosen.model else []),
                 *(["--gpus", str(chosen.gpus)] if chosen.gpus else []),
                 *(["--since", chosen.since] if chosen.since else []),
                 *(["--sweep", chosen.sweep] if chosen.sweep else []),
                 *(["--all"] if chosen.all else ["--limit", str(chosen.limit)]), "--json"]
    answers: list = [None] * len(far)

    def ask(index: int) -> None:
        remote = far[index]
        try:
            proc = run_launcher(remote, "launcher", ["runs", *forwarded], timeout=max(30.0, 4 * remote.timeout_s))
            if proc.returncode != 0:
                answers[index] = remote_error(remote, proc.stderr)
            else:
                answers[index] = [RunRow(**row) for row in json.loads(proc.stdout)]
        except LaunchError as err:
            answers[index] = err.message
        except (ValueError, TypeError) as err:
            answers[index] = f"cluster {remote.cluster}: its runs could not be read ({err})"

    threads = [threading.Thread(target=ask, args=(index,), daemon=True) for index in range(len(far))]
    for thread in threads:
        thread.start()

    def answered() -> list:
        for thread in threads:
            thread.join()
        return answers
    return answered


def wanted(rec: RunRecord, chosen: Filters) -> bool:
    """Whether the record passes ``cluster``, ``model`` and ``gpus``."""
    return ((not chosen.cluster or rec.cluster == chosen.cluster) and (not chosen.model or rec.model == chosen.model)
            and (not chosen.gpus or rec.gpus == chosen.gpus))


def statuses(text: str) -> set:
    """The states a comma-separated ``text`` names (``--status``, the console's filter); LaunchError otherwise."""
    wanted = {s.strip().upper() for s in text.split(",") if s.strip()}
    bad = wanted - set(STATES)
    if bad:
        raise LaunchError(f"--status {','.join(sorted(bad))}: allowed {', '.join(STATES)}")
    return wanted


def listing(roots: List[Path], chosen: Filters) -> Listing:
    """:func:`gather`'s rows, and for a search's sweep its study, each trial's row given its trial's fields."""
    found = gather(roots, chosen)
    found.search = search_of(roots, listed_sweep(roots, chosen.sweep, found.rows)) if chosen.sweep else None
    if found.search is not None:
        trials = found.search.by_run()
        found.rows = [replace(row, trial=trial.number, params=trial.params, trial_state=trial.state,
                              value=trial.value) if trial else row
                      for row, trial in ((row, trials.get(row.name)) for row in found.rows)]
    return found


def listed_sweep(roots: List[Path], text: str, rows: List[RunRow]) -> Optional[str]:
    """The sweep id --sweep named: its rows' (found by its id or a unique prefix), or, when the filters left no
    row, the search it names (a grid sweep without rows then has nothing to add)."""
    if rows:
        return rows[0].sweep
    try:
        return unique_prefix(text, [sweep for root in roots for sweep in search_ids(root)], "sweep", roots[0])
    except LookupError:
        return None


