"""``launcher describe RUN``: everything about one run, from its directory and from Slurm; of a search's trial, also
which trial of which search it is. ``launcher describe SWEEP_ID`` of a search: its study, summarised
(launcher/views/search_summary.py)."""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from launcher.search.study import trial_of
from launcher.search.view import view
from launcher.views.lookup import duration, lookup, roots_of
from launcher.views.search_summary import describe_lines, metric_text, named_search
from launcher.core.checkpoints import DAMAGED, complete_checkpoints, damaged_checkpoints, step_of
from launcher.core.plan import read_plan
from launcher.core.config import load_run_config
from launcher.core.events import Evaluated, Event, ExportFailed, Exported, encode
from launcher.core.metrics import FinalRow, encode as row_line
from launcher.core.rundir import (CODE, CODE_DIFF, CONFIG, METRICS, PLAN, TENSORBOARD, TRIAL, WANDB, is_search,
                                  read_events, read_metrics)
from launcher.errors import LaunchError
from launcher.core.run_index import RunRecord
from launcher.core.rundir import code_source
from launcher.slurm.client import Slurm, SlurmError
from launcher.core.attempt_log import AttemptLog
from launcher.status.goodput import goodput
from launcher.status.reading import reading
from launcher.status.job_state import JobState, job_states


def node_states(rec: RunRecord, nodelist: str) -> Dict[str, str]:
    """Each node of the job with its current Slurm state."""
    if not nodelist:
        return {}
    slurm = Slurm(rec.slurm_conf)
    try:
        hosts = slurm.hostnames(nodelist)
        states = slurm.node_states(nodelist)
    except SlurmError as err:
        return {nodelist: f"unknown ({err})"}
    return {host: states.get(host, "unknown") for host in hosts}


def checkpoints(run_dir: Path) -> List[Dict[str, Any]]:
    """Complete checkpoints, and those found damaged at a resume (set aside, never used again)."""
    found = []
    for path in complete_checkpoints(run_dir) + damaged_checkpoints(run_dir):
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        found.append({"step": step_of(path), "path": str(path), "bytes": size, "damaged": path.suffix == DAMAGED})
    return found


def gather(rec: RunRecord, state: JobState) -> Dict[str, Any]:
    run_dir = Path(rec.run_dir)
    cfg = load_run_config(run_dir / CONFIG)  # a damaged config or plan is said at once, in one line
    plan, config = read_plan(run_dir).to_dict(), (run_dir / CONFIG).read_text()
    metrics = read_metrics(run_dir)
    final = next((m for m in reversed(metrics) if isinstance(m, FinalRow)), None)
    latest = next((m for m in reversed(metrics) if not isinstance(m, FinalRow)), None)
    events = state.files.events if state.files else read_events(run_dir)
    measured = goodput(events, metrics, time.time())
    return {
        "name": rec.name, "job_id": rec.job_id, "cluster": rec.cluster, "sweep": rec.sweep, "rebuilt": rec.rebuilt,
        "state": state.state, "reason": state.reason, "state_source": state.source,
        "exit_code": state.exit_code, "start": state.start, "end": state.end, "elapsed": state.elapsed,
        "paths": {
            "run_dir": str(run_dir), "config": str(run_dir / CONFIG), "plan": str(run_dir / PLAN),
            "sbatch_script": str(run_dir / "sbatch.sh"), "logs": str(run_dir / "logs"),
            "submitit": str(run_dir / "submitit"), "metrics": str(run_dir / METRICS),
        },
        "plan": plan,
        "nodes": node_states(rec, state.nodes),
        "events": [encode(e) for e in events],
        "attempts": [dataclasses.asdict(row) for row in AttemptLog(events).history()],
        "goodput": None if measured is None else {"fraction": round(measured.fraction, 3), "wall_s": measured.wall_s,
                                                  "kept_s": measured.kept_s, "lost_s": measured.lost_s,
                                                  "line": measured.line()},
        "checkpoints": checkpoints(run_dir),
        "data": reading(cfg.data, latest),
        "latest_metrics": None if latest is None else row_line(latest),
        "final_metrics": None if final is None else row_line(final),
        "config": config,
        "code": code_source(run_dir),
        "curves": curves(run_dir, config),
        "trial": trial_info(run_dir),
        "evaluations": [_fields(e) for e in events if isinstance(e, Evaluated)],
        "exports": [_fields(e) for e in events if isinstance(e, (Exported, ExportFailed))],
    }


def _fields(event: Event) -> Dict[str, Any]:
    """An event as ``describe --json`` shows it: its line without the kind."""
    return {k: v for k, v in encode(event).items() if k != "event"}


def trial_info(run_dir: Path) -> Optional[Dict[str, Any]]:
    """Which trial of which search the run trains, with its state and value in the study (None when the study is
    gone or lacks it); None for a run that is no trial (one stat: the search's modules and Optuna are loaded only
    for a trial)."""
    if not (run_dir / TRIAL).exists():
        return None

    trial = trial_of(run_dir)
    found = [t for t in view(trial.path).trials if t.number == trial.number] if is_search(trial.path) else []
    return {"search": trial.path.name, "trial": trial.number, "state": found[0].state if found else None,
            "value": found[0].value if found else None}


def curves(run_dir: Path, config_text: str) -> Optional[Dict[str, str]]:
    """Where the run's tracker keeps its curves and how to look at them; None with tracking=none."""
    tracking = (yaml.safe_load(config_text) or {}).get("tracking") or {}
    backend, name = tracking.get("backend", "none"), run_dir.name
    if backend == "tensorboard":
        return {"tracker": backend, "path": str(run_dir / TENSORBOARD),
                "view": f"tensorboard --logdir {run_dir / TENSORBOARD}"}
    if backend == "wandb":
        project = tracking.get("project")
        if tracking.get("mode") == "online":
            return {"tracker": backend, "path": str(run_dir / WANDB), "view": f"W&B project {project}, run {name}"}
        return {"tracker": backend, "path": str(run_dir / WANDB),
                "view": f"wandb sync --id {name} -p {project} {run_dir / WANDB}/offline-run-*"}
    return None


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
    """The attempts table (a run that never started an attempt has none), then a blank line."""
    from tabulate import tabulate  # lazy: keeps tabulate out of start-up

    if not rows:
        return []
    when = lambda t: time.strftime("%H:%M:%S", time.localtime(t)) if t else ""  # noqa: E731
    table = [[r["attempt"], r["job_id"], r["nodes"], duration(r.get("queued_s")), when(r["start"]), when(r["end"]),
              r["outcome"], r["cause"], r["then"]] for r in rows]
    return ["Attempts:", tabulate(table, headers=["#", "JOB", "NODES", "QUEUED", "START", "END", "OUTCOME", "CAUSE",
                                                  "THEN"], disable_numparse=True), ""]


def render(info: Dict[str, Any]) -> str:
    from tabulate import tabulate  # lazy: keeps tabulate out of start-up

    state = info["state"] + (f" ({info['reason']})" if info["reason"] else "")
    out = [
        f"Run {info['name']}: Slurm job {info['job_id']} on cluster {info['cluster']}"
        + (f", sweep {info['sweep']}" if info["sweep"] else ""),
        *([trial_line(info["trial"])] if info.get("trial") else []),
        *([f"Record: rebuilt from events.jsonl and plan.json ({info['rebuilt']})"] if info.get("rebuilt") else []),
        f"Status: {state}  [from {info['state_source']}]"
        + "".join(f"  {k} {info[k]}" for k in ("start", "end", "elapsed", "exit_code") if info[k]),
        "",
        "Paths:",
        *(f"  {key:<14}{path}" for key, path in info["paths"].items()),
        "",
        code_line(info["code"], info["paths"]["run_dir"]),
        "Curves: metrics.jsonl" + (f"; {info['curves']['tracker']} in {info['curves']['path']}: "
                                    f"{info['curves']['view']}" if info["curves"] else ""),
        *([info["data"]["line"]] if info.get("data") else []),
        "",
        "Plan:",
        tabulate(info["plan"].items(), tablefmt="plain", disable_numparse=True),
        "",
        "Nodes:" if info["nodes"] else "Nodes: none yet",
        *(f"  {node:<16}{node_state}" for node, node_state in info["nodes"].items()),
        "",
        *attempt_lines(info["attempts"]),
        *([info["goodput"]["line"], ""] if info["goodput"] else []),
        "Events:",
        *(event_line(e) for e in info["events"]),
        "",
        "Checkpoints:" if info["checkpoints"] else "Checkpoints: none",
        *(f"  step {c['step']:>8}  {c['bytes'] / 1e6:9.1f} MB  {c['path']}" + ("  DAMAGED" if c["damaged"] else "")
          for c in info["checkpoints"]),
    ]
    if info["evaluations"]:
        out += ["", "Evaluations (launcher eval):", *(
            f"  step {e['step']:>8}  loss {e['loss']:.4f}  perplexity {e['perplexity']:,.2f}  on {e['tokens']:,} "
            f"tokens of {e['data']}" + (" (validation split)" if e.get("split") == "val" else "")
            for e in info["evaluations"])]
    if info["exports"]:
        out += ["", "Exports (train.export_every):", *(
            f"  step {e['step']:>8}  " + (e["path"] if "path" in e else f"FAILED: {e.get('error')}")
            for e in info["exports"])]
    for label in ("latest_metrics", "final_metrics"):
        if info[label]:
            out += ["", label.replace("_", " ").capitalize() + ":",
                    "  " + ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                                     for k, v in info[label].items() if v is not None and k not in ("final", "time"))]
    out += ["", "Config:", *("  " + line for line in info["config"].rstrip().splitlines())]
    return "\n".join(out)


def trial_line(trial: Dict[str, Any]) -> str:
    """Where a trial's run stands in its search."""
    value = f", value {metric_text(trial['value'])}" if trial["value"] is not None else ""
    return (f"Trial {trial['trial']} of search {trial['search']}: {trial['state'] or 'not in the study'}{value} "
            f"(the whole search: launcher describe {trial['search']})")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix), or a search's sweep id (or prefix)")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")


def main(args: argparse.Namespace) -> int:
    roots = roots_of(args)
    try:
        rec = lookup(roots, args.name)
    except LaunchError as err:
        path = named_search(roots, args.name)
        if path is None:
            raise LaunchError(f"{err.message} (and no search's sweep id starts with '{args.name}')") from None
        return describe_search(path, args.json)
    info = gather(rec, job_states([rec])[rec.name])
    print(json.dumps(info, indent=1) if args.json else render(info))
    return 0


def describe_search(path: Path, as_json: bool) -> int:
    search = view(path)
    print(json.dumps(search.to_dict(), indent=1) if as_json else "\n".join(describe_lines(search)))
    return 0
