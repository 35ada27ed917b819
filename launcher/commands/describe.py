"""``launcher describe RUN``: everything about one run, from its directory and from Slurm; of a search's trial, also
which trial of which search it is (launcher/service/describe.py, which the console's run page shows too; this module
prints it). ``launcher describe SWEEP_ID`` of a search: its study, summarised (launcher/views/search_summary.py)."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.core.rundir import CODE, CODE_DIFF
from launcher.errors import LaunchError
from launcher.search.view import view
from launcher.service.describe import Description, describe, named_values
from launcher.views.lookup import duration, lookup, roots_of
from launcher.views.search_summary import describe_lines, metric_text, named_search
from launcher.views.width import fit_table, wrap


def code_line(code: Optional[Dict[str, Any]], run_dir: str) -> str:
    """Which code the run's jobs import: its frozen copy, with the commit and whether the tree was dirty."""
    if code is None:
        return "Code: the checkout's, as it is when a task starts (submitted before code was frozen)"
    where = f"Code: {Path(run_dir) / CODE} from {code['source']}"
    if code.get("commit") is None:
        return f"{where}, not a git checkout"
    if not code.get("dirty"):
        return f"{where} at commit {code['commit']} (clean)"
    return (f"{where} at commit {code['commit']} (dirty: {len(code.get('changed') or [])} file(s) changed, "
            f"diff in {Path(run_dir) / CODE / CODE_DIFF})")


def event_line(event: Dict[str, Any]) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(event.get("time", 0)))
    details = ", ".join(f"{k}={v}" for k, v in event.items() if k not in ("time", "event") and v is not None)
    return f"  {when}  {event.get('event', '?'):<10} {details}"


def attempt_lines(rows: List[Dict[str, Any]]) -> List[str]:
    """The attempts table (a run that never started an attempt has none), then a blank line; where its attempts ran
    on more than one cluster (a moved run), each job is named with its cluster."""
    if not rows:
        return []
    when = lambda t: time.strftime("%H:%M:%S", time.localtime(t)) if t else ""  # noqa: E731
    moved = len({r.get("cluster") for r in rows}) > 1  # job ids repeat across clusters: name each job's
    job = lambda r: f"{r['job_id']} ({r.get('cluster')})" if moved else r["job_id"]  # noqa: E731
    table = [[r["attempt"], job(r), r["nodes"], duration(r.get("queued_s")), when(r["start"]), when(r["end"]),
              r["outcome"], r["cause"], r["then"]] for r in rows]
    return ["Attempts:", fit_table(table, ["#", "JOB", "NODES", "QUEUED", "START", "END", "OUTCOME", "CAUSE", "THEN"],
                                   {"NODES": 12, "CAUSE": 16, "THEN": 12}, ["QUEUED", "JOB", "START"]), ""]


def render(info: Description, config: bool = False) -> str:
    """The run's description, each line within the terminal's width; its config with ``config``."""
    state = info.state + (f" ({info.reason})" if info.reason else "")
    out = [
        f"Run {info.name}: Slurm job {info.job_id} on cluster {info.cluster}"
        + (f", sweep {info.sweep}" if info.sweep else ""),
        *([trial_line(info.trial)] if info.trial else []),
        *info.moves,
        *([f"Record: rebuilt from events.jsonl and plan.json ({info.rebuilt})"] if info.rebuilt else []),
        f"Status: {state}  [from {info.state_source}]"
        + "".join(f"  {k} {getattr(info, k)}" for k in ("start", "end", "elapsed", "exit_code") if getattr(info, k)),
        *([f"  {info.sooner}"] if info.sooner else []),
        "",
        "Paths:",
        *(f"  {key:<14}{path}" for key, path in info.paths.items()),
        "",
        code_line(info.code, info.paths["run_dir"]),
        "Curves: metrics.jsonl" + (f"; {info.curves['tracker']} in {info.curves['path']}: "
                                    f"{info.curves['view']}" if info.curves else ""),
        *([info.data["line"]] if info.data else []),
        "",
        "Plan:",
        fit_table(info.plan.items(), wrap_to={1: 24}, tablefmt="plain"),
        "",
        "Nodes:" if info.nodes else "Nodes: none yet",
        *(f"  {node:<16}{node_state}" for node, node_state in info.nodes.items()),
        "",
        *attempt_lines(info.attempts),
        *([info.goodput["line"], ""] if info.goodput else []),
        "Events:",
        *(event_line(e) for e in info.events),
        "",
        "Checkpoints:" if info.checkpoints else "Checkpoints: none",
        *(f"  step {c['step']:>8}  {c['bytes'] / 1e6:9.1f} MB  {c['path']}" + ("  DAMAGED" if c["damaged"] else "")
          for c in info.checkpoints),
    ]
    if info.evaluations:
        out += ["", "Evaluations (launcher eval):", *(
            f"  step {e['step']:>8}  loss {e['loss']:.4f}  perplexity {e['perplexity']:,.2f}  on {e['tokens']:,} "
            f"tokens of {e['data']}" + (" (validation split)" if e.get("split") == "val" else "")
            for e in info.evaluations)]
    if info.exports:
        out += ["", "Exports (train.export_every):", *(
            f"  step {e['step']:>8}  " + (e["path"] if "path" in e else f"FAILED: {e.get('error')}")
            for e in info.exports)]
    for label, row in (("Latest metrics", info.latest_metrics), ("Final metrics", info.final_metrics)):
        if row:
            out += ["", label + ":",
                    "  " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in named_values(row).items() if v is not None)]
    if config:
        out += ["", "Config:", *("  " + line for line in info.config.rstrip().splitlines())]
    else:
        out += ["", f"Config: {info.paths['config']} (describe --config prints it)"]
    return wrap("\n".join(out), indent="    ")


def trial_line(trial: Dict[str, Any]) -> str:
    """Where a trial's run stands in its search."""
    value = f", value {metric_text(trial['value'])}" if trial["value"] is not None else ""
    return (f"Trial {trial['trial']} of search {trial['search']}: {trial['state'] or 'not in the study'}{value} "
            f"(the whole search: launcher describe {trial['search']})")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix), or a search's sweep id (or prefix)")
    parser.add_argument("--config", action="store_true", help="also print the run's whole config")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts (the config included)")


def main(args: argparse.Namespace) -> int:
    roots = roots_of(args)
    try:
        rec = lookup(roots, args.name)
    except LaunchError as err:
        path = named_search(roots, args.name)
        if path is None:
            raise LaunchError(f"{err.message} (and no search's sweep id starts with '{args.name}')") from None
        return describe_search(path, args.json)
    info = describe(rec)
    print(json.dumps(info.to_dict(), indent=1) if args.json else render(info, args.config))
    return 0


def describe_search(path: Path, as_json: bool) -> int:
    search = view(path)
    print(json.dumps(search.to_dict(), indent=1) if as_json else "\n".join(describe_lines(search)))
    return 0
