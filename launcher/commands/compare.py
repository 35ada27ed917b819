"""``launcher compare RUN... | --sweep ID``: how model sizes and GPU counts actually compared.

Everything comes from the runs' own ``metrics.jsonl``, ``run.json`` and ``config.yaml``:
The figures (launcher/status/scaling.py) as a table, CSV, JSON or a plot (launcher/views/scaling_plot.py);
MFU reads "n/a" with the reason where training measured none. Runs still going are compared on their steps
so far and marked as such. A search's sweep is compared the same way, and its plot is its trials' value against
each parameter (launcher/views/search_plot.py) rather than the scaling plot, which trials of one shape do not
make.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
from dataclasses import asdict
from pathlib import Path
from typing import Dict, List, Optional

from launcher.remote.ship import remote_error, run_launcher
from launcher.views.lookup import chosen_runs, duration, roots_of
from launcher.views.scaling_plot import plot
from launcher.views.search_plot import plot as plot_search
from launcher.views.search_summary import best_line, progress_line, search_of
from launcher.views.width import fit_table, to_stderr, wrap
from launcher.errors import LaunchError
from launcher.status.scaling import RunStats, compare


HEADERS = ["NAME", "MODEL", "GPUS", "NODES", "STEP TIME (median)", "TOK/S (median)", "TOK/S/GPU (median)", "MFU",
           "TIME TO STEP", "SPEEDUP", "SCALING EFF", "FINAL LOSS", "STATUS"]
# On a narrow terminal (launcher/views/width.py): these wrap by words down to these widths, then these columns are
# left out, first to last.
WRAPPED = {"NAME": 16, "STATUS": 12}
LEAST_NEEDED = ["NODES", "TIME TO STEP", "TOK/S/GPU (median)", "SPEEDUP", "MODEL", "FINAL LOSS", "MFU"]
MEDIAN_NOTE = ("(median): STEP TIME is the median over the log intervals after the first (warm-up); TOK/S and "
               "TOK/S/GPU are taken at that step time, so TOK/S x STEP TIME = tokens per step")


def table_rows(stats: List[RunStats]) -> List[list]:
    def num(value: Optional[float], fmt: str) -> str:
        return format(value, fmt) if value is not None else ""

    common = min((s.steps_done for s in stats), default=0)
    return [[
        s.name, s.model, s.gpus, s.nodes, step_time(s.median_step_time),
        num(s.tokens_per_s, ",.0f"), num(s.tokens_per_s_per_gpu, ",.0f"),
        "n/a" if s.mfu is None else f"{100 * s.mfu:.1f}%",
        f"{duration(s.time_to_common_step)} @{common}" if s.time_to_common_step is not None else "",
        num(s.speedup, ".2f") + ("x" if s.speedup else ""), num(s.scaling_efficiency and 100 * s.scaling_efficiency,
                                                                 ".0f") + ("%" if s.scaling_efficiency else ""),
        num(s.final_loss, ".4f"),
        s.status if s.finished else f"{s.status} (so far {s.steps_done}/{s.steps_total})",
    ] for s in stats]


def step_time(seconds: Optional[float]) -> str:
    """``1.750 s``, or below a second ``4.3 ms``, so a CPU's few-millisecond steps keep their digits."""
    if seconds is None:
        return ""
    return f"{seconds:.3f} s" if seconds >= 1 else f"{1000 * seconds:.1f} ms"


def notes(stats: List[RunStats]) -> List[str]:
    """The lines under the table: what the median columns mean, and why an MFU is n/a."""
    lines = [MEDIAN_NOTE]
    reasons: Dict[str, List[str]] = {}
    for s in stats:
        if s.mfu_note:
            reasons.setdefault(s.mfu_note, []).append(s.name)
    for reason, names in reasons.items():
        which = "" if len(names) == len(stats) else f" ({', '.join(names)})"
        lines.append(f"MFU n/a{which}: {reason}")
    return lines


def to_csv(stats: List[RunStats]) -> str:
    out = io.StringIO()
    fields = [k for k in asdict(stats[0]) if k != "loss_curve"]
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for s in stats:
        writer.writerow(asdict(s))
    return out.getvalue()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="RUN", help="runs to compare (names or unique prefixes)")
    parser.add_argument("--sweep", help="compare every run of this sweep (its id or a unique prefix)")
    parser.add_argument("--plot", type=Path, metavar="FILE.png",
                        help="also draw throughput against GPUs (with the ideal linear line) and the loss curves; "
                             "of a search: each trial's value against each parameter")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--csv", action="store_true", help="print CSV")


def remote_stats(remote, args: argparse.Namespace) -> List[RunStats]:
    """The comparison's figures as the runs' remote cluster computes them (``compare --json`` there)."""
    asked = ["compare", *args.names, *(["--sweep", args.sweep] if args.sweep else []), "--json"]
    proc = run_launcher(remote, "launcher", asked, timeout=300)
    if proc.returncode != 0:
        raise LaunchError(remote_error(remote, proc.stderr))
    return [RunStats(**row) for row in json.loads(proc.stdout)]


def main(args: argparse.Namespace) -> int:
    remote = getattr(args, "remote", None)  # runs on a cluster reached over SSH, their plot drawn here
    if remote:
        stats, search = remote_stats(remote, args), None
    else:
        roots = roots_of(args)
        records = chosen_runs(roots, args.names, args.sweep)
        stats, search = compare(records), search_of(roots, records[0].sweep if args.sweep and records else None)
    said = []  # what the plot leaves out of a search: said beside the table, or on stderr beside JSON or CSV
    if args.plot and search is not None:
        said = [note for note in [plot_search(search, args.plot).note(search.metric)] if note]
    elif args.plot:
        plot(stats, args.plot)
    if args.json:
        print(json.dumps([asdict(s) for s in stats], indent=1))
    elif args.csv:
        print(to_csv(stats), end="")
    if args.json or args.csv:
        for line in said:
            to_stderr(line)
        return 0
    lines = notes(stats)
    if search is not None:
        lines += [f"Search {search.search.id}: {progress_line(search)}", best_line(search)]
    if args.plot:
        lines.append(f"plot written to {args.plot}" + "".join(f"; {line}" for line in said))
    elif search is not None:
        lines.append(f"--plot FILE.png draws {search.metric} against each parameter")
    print(fit_table(table_rows(stats), HEADERS, WRAPPED, LEAST_NEEDED))
    print(wrap("\n".join(lines)))
    return 0
