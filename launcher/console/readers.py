"""What the console's pages show, read from the same record the CLI reads, as plain dicts for JSON.

The runs page is the runs listing ``launcher runs`` prints (its rows, filters, remote clusters and pending reasons in
words); a run's page is the description ``launcher describe`` prints, with its curves and its log tail beside; the
clusters page is the survey ``launcher clusters`` prints, and the user's queue with the run behind each job: each
read through the service both front ends share (launcher/service/). A sweep's page is ``launcher compare``'s figures
and its runs' loss curves and, for a search, its study as ``describe`` shows it. A run's page says, for Stop and
Resume, why each cannot act on the run as it is (the words the service would refuse it with), so that the page
offers only what can act.

A run's files grow while it trains: :class:`Tails` keeps, per file, the offset it has read to and what it parsed,
so a refresh reads only the bytes written since (a 100,000-step run's metrics are read once, then a line at a
time), and a curve is downsampled here to at most ``points`` before it is sent.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import yaml

from launcher.core.attempt_log import AttemptLog, Current
from launcher.core.checkpoints import saved_steps
from launcher.core.config import load_run_config
from launcher.core.events import decode
from launcher.core.metrics import Row, decode as row_of, encode
from launcher.core.plan import read_plan
from launcher.core.run_index import RunRecord, is_run
from launcher.core.rundir import CONFIG, METRICS, read_events
from launcher.forecast.estimate import estimate
from launcher.remote.clusters import remotes
from launcher.remote.ssh import Remote
from launcher.remote.ship import call, remote_error, run_launcher
from launcher.forecast.target import hardware_for, precision_of
from launcher.errors import LaunchError
from launcher.service.clusters import configured, survey, to_json, your_jobs
from launcher.service.describe import describe
from launcher.service.move import targets, unmovable
from launcher.service.resume import unresumable
from launcher.service.runs import Filters, gather, row_dict, statuses
from launcher.service.stop import unstoppable
from launcher.slurm.client import SlurmError
from launcher.status.goodput import goodput
from launcher.status.job_state import ACTIVE, DAMAGED
from launcher.status.scaling import compare
from launcher.status.tails import log_from, new_rows, rank_log, with_attempts
from launcher.views.lookup import lookup, sweep_runs
from launcher.views.search_summary import search_of

PER_PAGE = 50
# The curves a run's page draws, by their key in metrics.jsonl; tokens/s per GPU is derived where a record lacks it.
CURVES = ("loss", "eval_loss", "lr", "grad_norm", "tokens_per_s", "mfu", "peak_mem_gb")
SWEEP_POINTS = 300  # the most points each run's loss curve is sent with on a sweep's page


def runs_page(roots: List[Path], query: Dict[str, str], tails: Optional["Tails"] = None) -> Dict[str, Any]:
    """A page of ``launcher runs``: the filters (cluster, status, sweep, name) and the page number of the query,
    newest first, with each remote cluster that did not answer as a banner, and how many runs of each other state
    the status left out (``left_out``, where it left any); with ``tails``, each of this machine's runs also with its
    goodput (``describe``'s), from its metrics read incrementally."""
    page = _number(query.get("page", "0"), "page")
    name = query.get("name", "").strip()
    found = gather(roots, Filters(cluster=query.get("cluster") or None, sweep=query.get("sweep") or None,
                                  status=statuses(query["status"]) if query.get("status") else None, all=bool(name),
                                  limit=(page + 1) * PER_PAGE + 1))
    rows = [row for row in found.rows if name in row.name]
    shown = rows[page * PER_PAGE:(page + 1) * PER_PAGE]
    far = {remote.cluster for remote in remotes()} if shown else set()
    listed = [{**row_dict(row), "remote": row.cluster in far, "goodput": None} for row in shown]
    for row in listed if tails is not None else []:
        if not row["remote"] and row["status"] != DAMAGED:
            run_dir = Path(row["run_dir"])
            measured = goodput(read_events(run_dir), tails.rows(run_dir), time.time(), saved_steps(run_dir))
            row["goodput"] = None if measured is None else round(measured.fraction, 3)
    return {"rows": listed, "page": page, "more": len(rows) > (page + 1) * PER_PAGE, "banners": found.unanswered,
            **({"left_out": found.left_out} if found.left_out else {})}


def run_page(roots: List[Path], name: str) -> Dict[str, Any]:
    """``launcher describe NAME --json``, with the command that runs it again."""
    rec = lookup(roots, name)
    described = describe(rec)
    info = described.to_dict()
    info["refused"] = refusals(info, rec.steps)
    run_file = Path(rec.run_dir) / "run.yaml"
    info["again"] = f"launcher -f {run_file}"
    info["run_file"] = run_file.read_text() if run_file.is_file() else None
    info["gpus"] = rec.gpus
    info["predicted"] = predicted(Path(rec.run_dir), described.latest_metrics)
    info["move_to"] = sorted(targets(rec.cluster), key=lambda name: name != described.sooner_on)  # sooner first
    return info


def remote_run_page(remote: Remote, name: str, tails: Tails, rank: int, log_offset: Optional[int],
                    points: int, earlier: bool = False) -> Dict[str, Any]:
    """A run on a cluster reached over SSH: ``launcher describe NAME --json`` there, and what its metrics and rank
    log gained since the last refresh (launcher/remote/agent.py ``follow``): two SSH commands a refresh, each over
    the CLI's master connection."""
    proc = run_launcher(remote, "launcher", ["describe", name, "--json"], timeout=max(30.0, 4 * remote.timeout_s))
    if proc.returncode != 0:
        raise LaunchError(remote_error(remote, proc.stderr))
    info = json.loads(proc.stdout)
    key = (remote.cluster, info["paths"]["run_dir"])
    answer = call(remote, "follow", {"run_dir": key[1], "job_id": info["job_id"], "metrics_offset": tails.offset(key),
                                     "rank": rank, "log_offset": log_offset}, timeout=max(30.0, 4 * remote.timeout_s))
    records = tails.add(key, answer["metrics"], answer["metrics_offset"], answer["again"])
    run_file = info["paths"]["run_dir"] + "/run.yaml"
    current = AttemptLog([decode(line) for line in info["events"]]).current()
    steps = int(((yaml.safe_load(info["config"]) or {}).get("train") or {}).get("steps") or 0)
    refused = {**refusals(info, steps), "move": f"{info['name']} is on {remote.cluster}, reached over SSH: "
               f"'launcher move' there moves it between the clusters that machine has"}
    return {**info, "refused": refused,
            "curves": curves(records, info["plan"]["gpus"], points, current, earlier), "log": answer["log"],
            "again": f"launcher -f {run_file}  (on {remote.cluster})", "run_file": None, "predicted": None,
            "remote": remote.cluster, "move_to": []}


def refusals(info: Dict[str, Any], steps: int) -> Dict[str, Optional[str]]:
    """Why Stop, Resume and Move cannot act on the run ``info`` (``describe --json``) describes, in the service's words
    (None: it can); Delete always can."""
    name, job_id, state = info["name"], info["job_id"], info["state"]
    final = row_of(info["final_metrics"]) if info.get("final_metrics") else None
    return {"stop": unstoppable(name, job_id, state), "resume": unresumable(name, job_id, state, steps, final),
            "move": unmovable(name, job_id, state), "delete": None}


def remote_named(cluster: Optional[str]) -> Optional[Remote]:
    """The configured cluster reached over SSH called ``cluster``, or None."""
    return next((remote for remote in remotes() if remote.cluster == cluster), None) if cluster else None


def predicted(run_dir: Path, measured: Optional[Row] = None) -> Dict[str, Any]:
    """What ``launcher plan`` predicts for the run (memory per GPU, step time, tokens/s, MFU), beside which the
    page shows what was measured (``measured``, the newest row), and a note saying what the figures are of. There
    is no speed where the GPU's type is not known, and virtual GPUs are planned as a stand-in GPU, whose speed is
    not set beside a measurement on CPUs (a row without MFU): the two would not be comparable."""
    cfg = load_run_config(run_dir / CONFIG)
    hw = hardware_for(cfg.cluster, precision_of(cfg))
    est = estimate(cfg, read_plan(run_dir), hw)
    on_cpus = hw.stand_in and measured is not None and measured.mfu is None
    note = hw.unforecast
    if hw.stand_in:
        note = (f"planned for an {hw.gpu_type}: the cluster's GPUs are virtual"
                + ("; its ranks train on CPUs, so no stand-in's speed is set beside theirs" if on_cpus else ""))
    t = est.timing if not on_cpus else None
    tokens = t.tokens_per_s_per_gpu if t else None
    return {"memory_gb": est.memory.total / 1e9, "step_time_s": t.step_s if t else None,
            "tokens_per_s": None if tokens is None else tokens * est.plan.gpus, "mfu": t.mfu if t else None,
            "gpu": hw.gpu_type, "stand_in": hw.stand_in, "note": note}


class Tails:
    """Each followed metrics file's offset and what was read of it, shared by every tab (one reader per file):
    this machine's runs by their directory (the typed rows, and their lines for the page's JSON), a remote
    cluster's by (cluster, run directory there) (the lines its agent sent)."""

    def __init__(self) -> None:
        self._kept: Dict[Any, tuple] = {}  # key -> (offset, lines, rows)
        self._lock = threading.Lock()

    def metrics(self, run_dir: Path) -> List[dict]:
        """Every row of this machine's run's metrics.jsonl as its line, reading only what was appended since."""
        with self._lock:
            return list(self._read(run_dir)[0])

    def rows(self, run_dir: Path) -> List[Row]:
        """Every row of this machine's run's metrics.jsonl, typed, reading only what was appended since."""
        with self._lock:
            return list(self._read(run_dir)[1])

    def _read(self, run_dir: Path) -> Tuple[List[dict], List[Row]]:
        offset, lines, rows = self._kept.get(run_dir, (0, [], []))
        new, offset = new_rows(run_dir / METRICS, offset)
        if new is None:  # rewritten shorter: from the start
            new, offset = new_rows(run_dir / METRICS, 0)
            lines, rows = [], []
        lines.extend(map(encode, new))
        rows.extend(new)
        self._kept[run_dir] = (offset, lines, rows)
        return lines, rows

    def offset(self, key: Any) -> int:
        with self._lock:
            return self._kept.get(key, (0, [], []))[0]

    def add(self, key: Any, new: List[dict], offset: int, again: bool) -> List[dict]:
        """What a remote cluster read of its run's metrics from :meth:`offset` (``again``: from 0), kept here."""
        with self._lock:
            lines = [] if again else self._kept.get(key, (0, [], []))[1]
            lines.extend(new)
            self._kept[key] = (offset, lines, [])
            return list(lines)


def run_curves(roots: List[Path], name: str, tails: Tails, points: int, earlier: bool) -> Dict[str, Any]:
    """The curves of this machine's run ``name`` (:func:`curves`), its metrics read incrementally."""
    return record_curves(lookup(roots, name), tails, points, earlier)


def record_curves(rec: RunRecord, tails: Tails, points: int, earlier: bool = False) -> Dict[str, Any]:
    """:func:`curves` of this machine's run ``rec``: its current attempt's, its metrics read through ``tails``."""
    current = AttemptLog(read_events(Path(rec.run_dir))).current()
    return curves(tails.metrics(Path(rec.run_dir)), rec.gpus, points, current, earlier)


def curves(records: Sequence[dict], gpus: int, points: int, current: Current = Current(),
           earlier: bool = False) -> Dict[str, Any]:
    """The current attempt's curves against the step, from the step it resumed at (launcher/core/attempt_log.py
    ``Current``), at most ``points`` each (:func:`bucketed`); ``earlier_rows``: how many rows earlier attempts
    logged, which the page offers to draw, and with ``earlier`` their curves beside (``earlier``, as one line:
    :func:`one_line`), so that a run that restarted never draws a loop."""
    logged = [r for r in records if not r.get("final") and isinstance(r.get("step"), int)]
    mine = [r for r in logged if current.holds(r.get("time"))]
    older = [r for r in logged if not current.holds(r.get("time"))]
    out = {**bucketed(mine, gpus, points), "earlier_rows": len(older), "resumed_at": current.resumed_at}
    if earlier and older:
        out["earlier"] = bucketed(one_line(older), gpus, points)
    return out


def bucketed(logged: Sequence[dict], gpus: int, points: int) -> Dict[str, Any]:
    """Logged rows as curves of at most ``points`` each: a longer run is cut into that many buckets of rows, and a
    bucket's point is its last step with each curve's last value in it (an evaluation, logged every few hundred
    steps, is kept in its bucket; the newest values are always the last point)."""
    size = max(1, -(-len(logged) // points))
    buckets = [logged[i:i + size] for i in range(0, len(logged), size)]
    out: Dict[str, Any] = {"step": [bucket[-1]["step"] for bucket in buckets], "logged": len(logged)}
    for key in CURVES:
        out[key] = [next((r[key] for r in reversed(bucket) if r.get(key) is not None), None) for bucket in buckets]
    out["tokens_per_s_per_gpu"] = [v / gpus if isinstance(v, (int, float)) and gpus else None
                                   for v in out["tokens_per_s"]]  # what the page draws, for every run alike
    return out


def one_line(older: Sequence[dict]) -> List[dict]:
    """Earlier attempts' rows as one line, oldest first: from the newest back, a row is kept when its step is below
    every step kept after it, so that of the steps two attempts both logged (a restart from scratch, or from an
    earlier checkpoint) the later attempt's are drawn."""
    kept: List[dict] = []
    for row in reversed(older):
        if not kept or row["step"] < kept[-1]["step"]:
            kept.append(row)
    return kept[::-1]


def log_tail(roots: List[Path], name: str, rank: int, offset: Optional[int]) -> Dict[str, Any]:
    """Rank ``rank``'s log from ``offset`` (None: its last 64 KB), each attempt's part marked, and the offset to ask
    from next."""
    rec = lookup(roots, name)
    tail = log_from(rank_log(Path(rec.run_dir), rec.job_id, rank), offset)
    return {**tail, "text": with_attempts(tail["text"], Path(rec.run_dir))}


def sweep_page(roots: List[Path], sweep: str, tails: Tails) -> Dict[str, Any]:
    """A sweep's runs, ``launcher compare``'s figures of them (speedup and efficiency against the fewest GPUs),
    each run's loss curve (its current attempt's, at most SWEEP_POINTS, read through ``tails``), how many of its
    runs are active (what a stop of the sweep would act on), and a search's study as ``describe SWEEP`` gives it."""
    records = sweep_runs(roots, sweep)
    search = search_of(roots, records[0].sweep if records else sweep)
    if not records and search is None:
        raise LaunchError(f"no sweep or search '{sweep}'")
    runs = [asdict(s) for s in compare(records)]
    losses = {rec.name: record_curves(rec, tails, SWEEP_POINTS) for rec in records}
    return {"id": records[0].sweep if records else search.search.id, "runs": runs,
            "losses": {name: {"step": got["step"], "loss": got["loss"]} for name, got in losses.items()},
            "active": sum(run["status"] in ACTIVE for run in runs),
            "search": None if search is None else {**search.to_dict(), "metric": search.metric}}


def clusters_page(roots: List[Path]) -> List[Dict[str, Any]]:
    """``launcher clusters --json``, and on each local cluster the user's own jobs, each with the run or sweep
    behind it (``run``: one of ``roots``, whose page it links to) and why it waits, in words."""
    entries = [to_json(entry) for entry in survey(configured())]
    for entry in entries:
        entry["queue"] = _queue(entry["slurm_conf"], roots) if entry["reachable"] and not entry.get("ssh") else []
    return entries


def _queue(slurm_conf: Optional[str], roots: List[Path]) -> List[Dict[str, Any]]:
    try:
        jobs = your_jobs(slurm_conf)
    except SlurmError as err:
        return [{"job_id": "", "state": "UNKNOWN", "partition": "", "gpus": 0, "name": "", "watches": None,
                 "run": False, "reason": str(err)}]
    return [{**asdict(job), "run": any(is_run(root / job.name) for root in roots) if job.name else False}
            for job in jobs]


def _number(text: str, what: str) -> int:
    if not text.isdigit():
        raise LaunchError(f"{what} must be a number, got {text!r}")
    return int(text)
