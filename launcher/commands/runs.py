"""``launcher runs``: one row per run, newest first, with its true Slurm state and its progress (the listing is
launcher/service/runs.py, which the console's runs page shows too; this module parses the flags and draws it).

``--sweep ID`` of a search adds, for each trial, its parameters, its state in the study and its value, then the
best trial so far and the study's progress (launcher/views/search_summary.py); a grid sweep lists as any runs."""
from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, List, Sequence, TextIO

from launcher.errors import LaunchError
from launcher.service.runs import TRIAL_FIELDS, Filters, Listing, RunRow, listing, row_dict, statuses
from launcher.status.job_state import ACTIVE, DAMAGED, STATES
from launcher.views.lookup import clock, duration, roots_of
from launcher.views.search_summary import best_line, metric_text, param_names, progress_line, short
from launcher.views.width import fit_table, to_stderr, wrap

if TYPE_CHECKING:
    from launcher.search.space import Param


_FIELDS = [name for name in RunRow.__dataclass_fields__ if name not in TRIAL_FIELDS]
_KEYS = [f"  {json.dumps(name)}: " for name in _FIELDS]


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


# The STATUS cell's longest: a cause longer still (a cluster that is gone, say) is shortened to it by words, whole in
# ``describe`` and ``runs --json``; the table wraps the cell by words to fit the terminal (launcher/views/width.py).
STATUS_WIDTH = 100
# The reasons said beside any state, not only beside those that always say theirs: a stall, where a trial was
# pruned, and a last known state's date (Slurm not answering).
SAID_WHILE_RUNNING = ("stalled", "pruned", "as of")
HEADERS = ["NAME", "JOB ID", "CLUSTER", "MODEL", "GPUS", "STATUS", "TRY", "PROGRESS", "LOSS", "TOK/S", "MFU",
           "SUBMITTED", "ELAPSED/ETA"]
# On a narrow terminal (launcher/views/width.py): the name and the status wrap by words down to these widths, then
# these columns are left out, first to last.
WRAPPED = {"NAME": 16, "STATUS": 20}
LEAST_NEEDED = ["SUBMITTED", "MFU", "TOK/S", "JOB ID", "CLUSTER", "TRY", "TRIAL STATE", "MODEL", "LOSS", "GPUS"]


def table_row(row: RunRow) -> list:
    status = row.status + (f" ({row.reason})" if row.reason and (row.status in ("PENDING", "RECOVERING", "FAILED",
                                                                                  "UNKNOWN", "REQUEUED", DAMAGED)
                                                                  or row.reason.startswith(SAID_WHILE_RUNNING))
                                                                  else "")
    if len(status) > STATUS_WIDTH:  # shortened by words, its closing parenthesis kept
        closing = ")" if status.endswith(")") else ""
        status = textwrap.shorten(status[:len(status) - len(closing)], STATUS_WIDTH - len(closing),
                                  placeholder="…") + closing
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


def render(found: Listing, as_json: bool, roots: Sequence[Path] = ()) -> str:
    """The listing; for a search's sweep, each trial's columns and, under the table, the best trial so far and
    the study's progress (--json: the rows only, each trial's fields in its row). No runs: :func:`none_listed`."""
    rows, search = found.rows, found.search
    if as_json:
        return json_rows(rows)
    lines = [f"Search {search.search.id}: {progress_line(search)}", best_line(search)] if search else []
    if not rows:
        return wrap("\n".join([none_listed(found, roots), *lines]))
    if search is None:
        return fit_table([table_row(row) for row in rows], HEADERS, WRAPPED, LEAST_NEEDED)
    params = search.search.space.params
    table = [table_row(row) + trial_cells(row, params) for row in rows]
    headers = [*HEADERS, "TRIAL", "TRIAL STATE", *param_names(p.key for p in params).values(), search.metric]
    return "\n".join([fit_table(table, headers, WRAPPED, LEAST_NEEDED), wrap("\n".join(lines))])


def none_listed(found: Listing, roots: Sequence[Path]) -> str:
    """Why nothing is listed: runs in other states than ``--status`` asks for (how many of each), or none in the
    ``roots`` looked in, so a user whose runs are elsewhere knows where to point ``--root``."""
    where = ", ".join(map(str, roots))
    if found.left_out:
        states = ", ".join(f"{count} {state}" for state, count in sorted(found.left_out.items()))
        return f"No runs in the states --status asks for; {'in ' + where if where else 'there are'}: {states}."
    return f"No runs (looked in {where}; --root names another)." if where else "No runs."


def trial_cells(row: RunRow, params: Sequence["Param"]) -> list:
    """A trial's columns: its number, state in the study, each parameter's value (short) and its value."""
    if row.trial_state is None:  # a run of the sweep the study does not name (yet)
        return [""] * (len(params) + 3)
    drawn = row.params or {}
    return [row.trial, row.trial_state, *(short(drawn[p.key], p.log) if p.key in drawn else "" for p in params),
            metric_text(row.value)]


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
        print(render(listed(roots, args), args.json, roots))
        return 0
    try:
        watch(roots, args, sys.stdout)
    except KeyboardInterrupt:
        pass
    return 0


def listed(roots: List[Path], args: argparse.Namespace) -> Listing:
    """The listing the flags choose; each remote cluster that did not answer is a warning on stderr."""
    found = listing(roots, Filters(cluster=args.cluster, model=args.model, gpus=args.gpus, since=args.since,
                                   sweep=args.sweep, status=args.status, all=args.all, limit=args.limit,
                                   local_only=bool(args.root)))
    for line in found.unanswered:
        to_stderr(f"warning: {line}")
    return found


def watch(roots: List[Path], args, out: TextIO) -> None:
    """Print the listing every ``--interval`` seconds until none of its runs is active, ending with the
    final table. Only a terminal gets the escape codes that redraw in place: a pipe or a file gets each
    refresh appended as plain text, so ``runs --watch | tee log`` reads as a log and ends by itself."""
    in_place = out.isatty()
    while True:
        found = listed(roots, args)
        active = sum(row.status in ACTIVE for row in found.rows)
        stamp = time.strftime("%H:%M:%S")
        head = (f"{stamp}  {active} of {len(found.rows)} runs active; every {args.interval:g}s, Ctrl-C to stop"
                if active else f"{stamp}  no run active: final table")
        out.write(("\x1b[H\x1b[2J" if in_place else "") + head + "\n" + render(found, args.json, roots) + "\n"
                  + ("" if in_place or not active else "\n"))
        out.flush()
        if not active:
            return
        time.sleep(args.interval)
