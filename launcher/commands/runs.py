"""``launcher runs``: one row per run, newest first, with its true Slurm state and its progress.

``--sweep ID`` of a search adds, for each trial, its parameters, its state in the study and its value, then the
best trial so far and the study's progress (launcher/views/search_summary.py); a grid sweep lists as any runs."""
from __future__ import annotations

import argparse
import json
import math
import sys
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple, Union

from launcher.remote.clusters import remotes
from launcher.remote.ship import remote_error, run_launcher
from launcher.views.lookup import clock, duration, parse_since, roots_of, slurm_seconds, sweep_runs
from launcher.views.search_summary import best_line, metric_text, param_names, progress_line, search_of, short
from launcher.errors import LaunchError
from launcher.core.run_index import RunRecord, load_or_damage, record_names, unique_prefix
from launcher.core.damage import DamagedRun
from launcher.core.metrics import encode
from launcher.core.rundir import search_ids
from launcher.status.job_state import ACTIVE, DAMAGED, STATES, JobState, job_states
from launcher.status.run_files import RunFiles

if TYPE_CHECKING:
    from launcher.search.space import Param
    from launcher.search.view import SearchView


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
    # A search's trial, listed with --sweep: its number, drawn parameters (by key), state in the study (RUNNING,
    # COMPLETE, FAIL, PRUNED, WAITING) and value. A row that is no such trial has none of these keys in --json.
    trial: Optional[int] = None
    params: Optional[Dict[str, Any]] = None
    trial_state: Optional[str] = None
    value: Optional[float] = None


def build_row(rec: RunRecord, state: JobState) -> RunRow:
    """The run's row, from its record, its state and what telling the state read of its directory."""
    files = state.files or RunFiles(rec.run_dir)
    metrics = encode(files.last_metrics) if files.last_metrics else {}
    step = metrics.get("step")
    elapsed = slurm_seconds(state.elapsed)
    eta = None
    if state.state == "RUNNING" and step is not None and metrics.get("step_time"):
        eta = max(0, rec.steps - step) * metrics["step_time"]
    return RunRow(
        name=rec.name, job_id=rec.job_id, cluster=rec.cluster, model=rec.model, gpus=rec.gpus, nodes=rec.nodes,
        gpus_per_node=rec.gpus_per_node, status=state.state, reason=with_rebuilt(state.reason, rec), step=step,
        steps=rec.steps,
        loss=metrics.get("loss"), tokens_per_s=metrics.get("tokens_per_s"), mfu=metrics.get("mfu"),
        submitted_at=rec.submitted_at, elapsed_s=elapsed, eta_s=eta, sweep=rec.sweep, run_dir=rec.run_dir,
        state_source=state.source,
        attempts=files.attempts.count,
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
_FIELDS = [name for name in RunRow.__dataclass_fields__ if name not in TRIAL_FIELDS]
_KEYS = [f"  {json.dumps(name)}: " for name in _FIELDS]


def row_dict(row: RunRow) -> Dict[str, Any]:
    """The row as --json writes it: a trial's fields only for a trial of a search listed with --sweep."""
    fields = asdict(row)
    return fields if row.trial_state is not None else {k: v for k, v in fields.items() if k not in TRIAL_FIELDS}


def json_rows(rows: List[RunRow]) -> str:
    """``json.dumps([row_dict(row) for row in rows], indent=1)``, byte for byte, in a fraction of its time: with
    an indent, json encodes in Python, and asdict deep-copies every value; a row holds only scalars, so each is
    encoded on its own with json's own functions (a value of another type, or a search's trials, which hold
    their parameters, fall back to json.dumps)."""
    if any(row.trial_state is not None for row in rows):
        return json.dumps([row_dict(row) for row in rows], indent=1)
    items = []
    for row in rows:
        values = row.__dict__
        try:
            items.append(" {\n" + ",\n".join([key + _SCALARS[type(values[name])](values[name])
                                                for key, name in zip(_KEYS, _FIELDS)]) + "\n }")
        except KeyError:  # not a plain scalar
            return json.dumps([row_dict(row) for row in rows], indent=1)
    return "[\n" + ",\n".join(items) + "\n]" if items else "[]"


def _float(value: float) -> str:
    """A float as json writes it (NaN and the infinities as JavaScript names them)."""
    if value != value:
        return "NaN"
    if value in (math.inf, -math.inf):
        return "Infinity" if value > 0 else "-Infinity"
    return float.__repr__(value)


# How json.dumps writes each scalar type (exact types: a subclass takes json.dumps's own path).
_SCALARS = {str: json.encoder.encode_basestring_ascii, int: int.__repr__, float: _float,
            bool: lambda value: "true" if value else "false", type(None): lambda value: "null"}


# The STATUS column's widest: a long cause (a cluster that is gone, a pending reason in words) is cut there, whole
# in ``describe`` and ``runs --json``, so that the table still fits a terminal.
STATUS_WIDTH = 72
HEADERS = ["NAME", "JOB ID", "CLUSTER", "MODEL", "GPUS", "STATUS", "TRY", "PROGRESS", "LOSS", "TOK/S", "MFU",
           "SUBMITTED", "ELAPSED/ETA"]


def table_row(row: RunRow) -> list:
    status = row.status + (f" ({row.reason})" if row.reason and (row.status in ("PENDING", "RECOVERING", "FAILED",
                                                                                  "UNKNOWN", "REQUEUED", DAMAGED)
                                                                  or row.reason.startswith(("stalled", "pruned")))
                                                                  else "")
    if len(status) > STATUS_WIDTH:
        status = status[:STATUS_WIDTH - 2].rstrip() + "…" + (")" if status.endswith(")") else "")
    if row.status == DAMAGED:
        return [row.name, "", "", "", "", status, "", "", "", "", "", clock(row.submitted_at), ""]
    progress = f"{row.step}/{row.steps} ({100 * row.step // row.steps}%)" if row.step is not None else f"-/{row.steps}"
    time_col = f"ETA {duration(row.eta_s)}" if row.eta_s is not None else duration(row.elapsed_s)
    return [
        row.name, row.job_id, row.cluster, row.model, f"{row.nodes}x{row.gpus_per_node}", status,
        row.attempts or "", progress,
        f"{row.loss:.4f}" if row.loss is not None else "",
        f"{row.tokens_per_s:,.0f}" if row.tokens_per_s is not None else "",
        f"{100 * row.mfu:.1f}%" if row.mfu is not None else "",
        clock(row.submitted_at), time_col,
    ]


def select(roots: List[Path], args) -> List[RunRow]:
    """The runs the filters choose, newest first, at most ``--limit`` unless ``--all``.

    A damaged run (its record cannot be read) is listed whatever ``--model`` and ``--gpus`` say, as they
    cannot be known; only ``--status`` without DAMAGED, or a sweep (also unknown), leaves it out."""
    limit = None if args.all else args.limit
    since = parse_since(args.since) if args.since else None
    runs: List[Listed] = []
    if args.sweep:
        runs = [(rec.submitted_at, rec) for rec in sweep_runs(roots, args.sweep)
                if wanted(rec, args) and (since is None or rec.submitted_at >= since)]
    else:
        named = [(mtime, root, name) for root in roots for mtime, name in record_names(root)]
        for mtime, root, name in sorted(named, key=lambda item: -item[0]) if len(roots) > 1 else named:
            if since is not None and mtime < since:
                break  # newest first: everything after this is older
            run = load_or_damage(root / name)
            if isinstance(run, RunRecord) and not wanted(run, args):
                continue
            if isinstance(run, DamagedRun) and args.status and DAMAGED not in args.status:
                continue
            runs.append((mtime, run))
            if limit is not None and not args.status and len(runs) >= limit:
                break
    rows = rows_for(runs)
    if args.status:
        rows = [row for row in rows if row.status in args.status]
    return rows if limit is None else rows[:limit]


def gather(roots: List[Path], args, warn: Callable[[str], None] = None) -> List[RunRow]:
    """The runs of this machine (unless ``--cluster`` names a remote cluster) and of every remote cluster (unless
    ``--root`` names a local root), newest first: each remote cluster is asked at once, one round trip each, and
    one that does not answer is a warning (a line on stderr, or ``warn``'s), the others still listed."""
    chosen = [] if args.root else [r for r in remotes() if not args.cluster or r.cluster == args.cluster]
    here = not (args.cluster and chosen)  # --cluster naming a remote cluster: only its runs
    asking = remote_rows(chosen, args)  # the clusters answer while this machine's runs are read
    rows = [row for row in select(roots, args) if not args.cluster or row.cluster == args.cluster] if here else []
    if not chosen:
        return rows
    for answer in asking():
        if isinstance(answer, str):
            (warn or _warning)(f"{answer}; its runs are not listed")
        else:
            rows += answer
    rows.sort(key=lambda row: -row.submitted_at)
    return rows if args.all else rows[:args.limit]


def _warning(text: str) -> None:
    print(f"warning: {text}", file=sys.stderr)


def remote_rows(chosen, args):
    """Ask each remote cluster for its rows (``launcher runs --json`` there, with the same filters), in parallel
    threads; returns the function that waits for the answers: each cluster's rows, or why it did not answer."""
    forwarded = [*(["--status", ",".join(sorted(args.status))] if args.status else []),
                 *(["--model", args.model] if args.model else []), *(["--gpus", str(args.gpus)] if args.gpus else []),
                 *(["--since", args.since] if args.since else []), *(["--sweep", args.sweep] if args.sweep else []),
                 *(["--all"] if args.all else ["--limit", str(args.limit)]), "--json"]
    answers: list = [None] * len(chosen)

    def ask(index: int) -> None:
        remote = chosen[index]
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

    threads = [threading.Thread(target=ask, args=(index,), daemon=True) for index in range(len(chosen))]
    for thread in threads:
        thread.start()

    def answered() -> list:
        for thread in threads:
            thread.join()
        return answers
    return answered


def wanted(rec: RunRecord, args) -> bool:
    """Whether the record passes ``--model`` and ``--gpus``."""
    return (not args.model or rec.model == args.model) and (not args.gpus or rec.gpus == args.gpus)


def statuses(text: str) -> set:
    wanted = {s.strip().upper() for s in text.split(",") if s.strip()}
    bad = wanted - set(STATES)
    if bad:
        raise LaunchError(f"--status {','.join(sorted(bad))}: allowed {', '.join(STATES)}")
    return wanted


def render(rows: List[RunRow], as_json: bool, search: Optional["SearchView"] = None,
           roots: Sequence[Path] = ()) -> str:
    """The listing; for a search's sweep, each trial's columns and, under the table, the best trial so far and
    the study's progress (--json: the rows only, each trial's fields in its row). No runs: which ``roots`` were
    looked in, so a user whose runs are elsewhere knows where to point ``--root``."""
    if as_json:
        return json_rows(rows)
    lines = [f"Search {search.search.id}: {progress_line(search)}", best_line(search)] if search else []
    if not rows:
        looked = f" (looked in {', '.join(map(str, roots))}; --root names another)" if roots else ""
        return "\n".join([f"No runs{looked}.", *lines])
    from tabulate import tabulate  # lazy: keeps tabulate out of start-up

    if search is None:
        return tabulate([table_row(row) for row in rows], headers=HEADERS, disable_numparse=True)
    params = search.search.space.params
    table = [table_row(row) + trial_cells(row, params) for row in rows]
    headers = [*HEADERS, "TRIAL", "TRIAL STATE", *param_names(p.key for p in params).values(), search.metric]
    return "\n".join([tabulate(table, headers=headers, disable_numparse=True), *lines])


def trial_cells(row: RunRow, params: Sequence["Param"]) -> list:
    """A trial's columns: its number, state in the study, each parameter's value (short) and its value."""
    if row.trial_state is None:  # a run of the sweep the study does not name (yet)
        return [""] * (len(params) + 3)
    drawn = row.params or {}
    return [row.trial, row.trial_state, *(short(drawn[p.key], p.log) if p.key in drawn else "" for p in params),
            metric_text(row.value)]


def listing(roots: List[Path], args) -> Tuple[List[RunRow], Optional["SearchView"]]:
    """The rows, and for a search's sweep (--sweep) its study, each trial's row given its trial's fields."""
    rows = gather(roots, args)
    search = search_of(roots, listed_sweep(roots, args.sweep, rows)) if args.sweep else None
    if search is None:
        return rows, None
    trials = search.by_run()
    return [replace(row, trial=trial.number, params=trial.params, trial_state=trial.state, value=trial.value)
            if trial else row for row, trial in ((row, trials.get(row.name)) for row in rows)], search


def listed_sweep(roots: List[Path], text: str, rows: List[RunRow]) -> Optional[str]:
    """The sweep id --sweep named: its rows' (found by its id or a unique prefix), or, when the filters left no
    row, the search it names (a grid sweep without rows then has nothing to add)."""
    if rows:
        return rows[0].sweep
    try:
        return unique_prefix(text, [sweep for root in roots for sweep in search_ids(root)], "sweep", roots[0])
    except LookupError:
        return None


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--status", type=statuses, help=f"comma-separated states: {', '.join(STATES)}")
    parser.add_argument("--model", help="only this model, e.g. gpt_1b")
    parser.add_argument("--gpus", type=int, help="only runs with this many GPUs")
    parser.add_argument("--since", help="submitted since: 30m, 2h, 3d, 1w, or a date")
    parser.add_argument("--sweep", help="only the runs of this sweep (its id or a unique prefix)")
    parser.add_argument("--limit", type=int, default=50, help="at most N runs (default 50)")
    parser.add_argument("--all", action="store_true", help="every run, no limit")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    parser.add_argument("--watch", action="store_true",
                        help="refresh every --interval seconds until none of the listed runs is PENDING, RUNNING "
                             "or REQUEUED, then print the final table and exit (Ctrl-C stops earlier); redrawn in "
                             "place on a terminal, appended as plain text (a time line and the table) otherwise")
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between --watch refreshes")


def main(args: argparse.Namespace) -> int:
    if args.limit <= 0:
        raise LaunchError(f"--limit must be positive, got {args.limit}")
    if args.interval <= 0:
        raise LaunchError(f"--interval must be positive, got {args.interval:g}")
    roots = roots_of(args)
    if not args.watch:
        rows, search = listing(roots, args)
        print(render(rows, args.json, search, roots))
        return 0
    try:
        watch(roots, args, sys.stdout)
    except KeyboardInterrupt:
        pass
    return 0


def watch(roots: List[Path], args, out: TextIO) -> None:
    """Print the listing every ``--interval`` seconds until none of its runs is active, ending with the
    final table. Only a terminal gets the escape codes that redraw in place: a pipe or a file gets each
    refresh appended as plain text, so ``runs --watch | tee log`` reads as a log and ends by itself."""
    in_place = out.isatty()
    while True:
        rows, search = listing(roots, args)
        active = sum(row.status in ACTIVE for row in rows)
        stamp = time.strftime("%H:%M:%S")
        head = (f"{stamp}  {active} of {len(rows)} runs active; every {args.interval:g}s, Ctrl-C to stop" if active
                else f"{stamp}  no run active: final table")
        out.write(("\x1b[H\x1b[2J" if in_place else "") + head + "\n" + render(rows, args.json, search, roots) + "\n"
                  + ("" if in_place or not active else "\n"))
        out.flush()
        if not active:
            return
        time.sleep(args.interval)
