"""A run's description, for ``launcher describe RUN`` and the console's run page: everything about one run, from its
directory and from Slurm; of a search's trial, also which trial of which search it is."""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

import yaml

from launcher.core.attempt_log import AttemptLog
from launcher.core.checkpoints import DAMAGED, complete_checkpoints, damaged_checkpoints, saved_steps, step_of
from launcher.core.config import RunConfig, load_run_config
from launcher.core.events import Evaluated, Event, ExportFailed, Exported, encode
from launcher.core.metrics import MARKS, FinalRow, Row, encode as row_line
from launcher.core.plan import read_plan
from launcher.core.rundir import (CONFIG, METRICS, PLAN, TENSORBOARD, TRIAL, WANDB, code_source, is_search,
                                  read_events, read_metrics)
from launcher.core.run_index import RunRecord
from launcher.search.study import trial_of
from launcher.search.view import view
from launcher.slurm.client import Slurm, SlurmError
from launcher.service.move import moved_line
from launcher.status.goodput import goodput
from launcher.status.job_state import job_states
from launcher.status.reading import reading


@dataclass
class Description:
    """A run described: its record and Slurm state, its files, plan, nodes, events and attempts, goodput,
    checkpoints, data, metrics, config, code, curves, trial, evaluations and exports. Its fields, in this order,
    are ``describe --json``'s keys."""

    name: str
    job_id: Optional[str]
    cluster: str
    sweep: Optional[str]
    rebuilt: Optional[str]
    state: str
    reason: str
    state_source: str
    as_of: Optional[float]  # a last known state (Slurm not answering): when it was known; None for Slurm's answer now
    exit_code: str
    start: str
    end: str
    elapsed: str
    paths: Dict[str, str]
    plan: Dict[str, Any]
    nodes: Dict[str, str]  # each node of the job with its Slurm state
    events: List[Dict[str, Any]]
    attempts: List[Dict[str, Any]]
    goodput: Optional[Dict[str, Any]]
    checkpoints: List[Dict[str, Any]]
    data: Optional[Dict[str, Any]]
    latest_metrics: Optional[Row]  # the current attempt's newest step's row (launcher/core/attempt_log.py Current)
    final_metrics: Optional[FinalRow]  # the current attempt's summary, once it ended
    config: str  # config.yaml's text
    code: Optional[Dict[str, Any]]
    curves: Optional[Dict[str, str]]
    trial: Optional[Dict[str, Any]]
    evaluations: List[Dict[str, Any]]
    exports: List[Dict[str, Any]]
    moves: List[str]  # each move to another cluster, in words (launcher/service/move.py)
    # A waiting run placed by cluster=auto: where it would start sooner, and how to move it (launcher/service/auto.py)
    sooner: Optional[str] = None
    sooner_on: Optional[str] = None  # that cluster's name (the console's Move offers it first)

    def to_dict(self) -> Dict[str, Any]:
        """``describe --json``, which the console's run page is too: the metrics rows as their lines in
        metrics.jsonl."""
        info = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}
        for key in ("latest_metrics", "final_metrics"):
            info[key] = None if info[key] is None else row_line(info[key])
        return info


def describe(rec: RunRecord) -> Description:
    """The run of ``rec`` as Slurm and its directory say now; a damaged config or plan is said at once, in one
    line."""
    state = job_states([rec])[rec.name]
    run_dir = Path(rec.run_dir)
    cfg = load_run_config(run_dir / CONFIG)
    plan, config = read_plan(run_dir).to_dict(), (run_dir / CONFIG).read_text()
    metrics = read_metrics(run_dir)
    events = state.files.events if state.files else read_events(run_dir)
    current = AttemptLog(events).current()  # the figures shown are the current attempt's
    final = next((m for m in reversed(metrics) if isinstance(m, FinalRow) and current.holds(m.time)), None)
    latest = next((m for m in reversed(metrics) if not isinstance(m, FinalRow) and current.holds(m.time)), None)
    measured = goodput(events, metrics, time.time(), saved_steps(run_dir))
    return Description(
        name=rec.name, job_id=rec.job_id, cluster=rec.cluster, sweep=rec.sweep, rebuilt=rec.rebuilt,
        state=state.state, reason=state.reason, state_source=state.source, as_of=state.as_of,
        exit_code=state.exit_code, start=state.start, end=state.end, elapsed=state.elapsed,
        paths={
            "run_dir": str(run_dir), "config": str(run_dir / CONFIG), "plan": str(run_dir / PLAN),
            "sbatch_script": str(run_dir / "sbatch.sh"), "logs": str(run_dir / "logs"),
            "submitit": str(run_dir / "submitit"), "metrics": str(run_dir / METRICS),
        },
        plan=plan,
        nodes=node_states(rec, state.nodes, answering=state.as_of is None),
        events=[encode(e) for e in events],
        attempts=[dataclasses.asdict(row) for row in AttemptLog(events).history()],
        goodput=None if measured is None else {"fraction": round(measured.fraction, 3), "wall_s": measured.wall_s,
                                               "kept_s": measured.kept_s, "lost_s": measured.lost_s,
                                               "line": measured.line()},
        checkpoints=checkpoints(run_dir),
        data=reading(cfg.data, latest),
        latest_metrics=latest,
        final_metrics=final,
        config=config,
        code=code_source(run_dir),
        curves=curves(run_dir, config),
        trial=trial_info(run_dir),
        evaluations=[_fields(e) for e in events if isinstance(e, Evaluated)],
        exports=[_fields(e) for e in events if isinstance(e, (Exported, ExportFailed))],
        moves=[moved_line(moved) for moved in AttemptLog(events).moves()],
        **waiting_hint(rec, run_dir, cfg, state.state),
    )


def waiting_hint(rec: RunRecord, run_dir: Path, cfg: RunConfig, state: str) -> Dict[str, str]:
    """Where a waiting run that cluster=auto placed would start sooner (asked now, or a minute ago at most): the
    words with the command that moves it (``sooner``) and the cluster (``sooner_on``); none for any other run,
    which costs nothing."""
    if state != "PENDING" or not cfg.cluster.candidates or rec.job_id is None:
        return {}
    from launcher.service.auto import sooner  # lazy: Hydra, for a waiting run placed by cluster=auto only

    found = sooner(run_dir, cfg, rec.name, rec.job_id)
    return {"sooner": found.words, "sooner_on": found.candidate.cluster} if found is not None else {}


def node_states(rec: RunRecord, nodelist: str, answering: bool) -> Dict[str, str]:
    """Each node of the job with its current Slurm state; not asked where Slurm did not answer for the job's state
    (``answering`` false: its state is a last known one), which would only wait again."""
    if not nodelist:
        return {}
    if not answering:
        return {nodelist: "unknown (Slurm not answering)"}
    slurm = Slurm(rec.slurm_conf)
    try:
        hosts = slurm.hostnames(nodelist)
        states = slurm.node_states(nodelist)
    except SlurmError as err:
        return {nodelist: f"unknown ({err})"}
    return {host: states.get(host, "unknown") for host in hosts}


def named_values(row: Row) -> Dict[str, Any]:
    """A row's values by their names in metrics.jsonl, as ``describe`` shows them: its line but its time and the
    final row's mark."""
    return {key: value for key, value in row_line(row).items() if key not in ("time", MARKS[FinalRow])}


def checkpoints(run_dir: Path) -> List[Dict[str, Any]]:
    """Complete checkpoints, and those found damaged at a resume (set aside, never used again)."""
    found = []
    for path in complete_checkpoints(run_dir) + damaged_checkpoints(run_dir):
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        found.append({"step": step_of(path), "path": str(path), "bytes": size, "damaged": path.suffix == DAMAGED})
    return found


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
