"""The cluster's side of a launch from another machine: ``python -m launcher.remote.agent launch`` with a JSON
request on standard input and a JSON answer on standard output (launcher/remote/ship.py runs it over SSH); and of a
run moved here from another cluster (``incoming``, then ``adopt``: launcher/service/move.py).

The request holds runs composed, checked and planned on the user's machine from its config layers (so a mistake
is found there at once) and that machine's git state. Here, where the cluster's paths mean something, each run's
data is checked and the runs are submitted as a local launch submits them (launcher/submit/submitter.py): a run
directory under the cluster's run root, the frozen copy of the shipped code, a Slurm job. A refusal is one line
``error: ...`` on standard error and exit status 2, as the CLI's.
"""
from __future__ import annotations

import json
import shutil
import socket
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any, Dict, List

from omegaconf import OmegaConf

from launcher.compose.composer import ComposedRun
from launcher.core.config import RunConfig
from launcher.core.damage import DamagedRun
from launcher.core.metrics import encode
from launcher.core.plan import Plan
from launcher.core.events import Moved
from launcher.core.rundir import METRICS, SOURCE_ROOT, append_event
from launcher.core.run_index import RunRecord, default_root, ensure_root, index_run
from launcher.dataset.check import check_data
from launcher.errors import LaunchError
from launcher.slurm.client import Slurm, SlurmError
from launcher.status.tails import log_from, new_rows, rank_log
from launcher.status.usage import usage
from launcher.submit.freeze import adopt_source, source_state
from launcher.submit.git import TreeState

INCOMING = ".incoming-"  # a folder of the run root a moved run is copied into: hidden from listings


def request(runs: List[ComposedRun], sweep: bool, argv: List[str]) -> Dict[str, Any]:
    """The launch request for ``runs``, from this machine: what the cluster's side needs to submit them."""
    state = source_state()
    return {"runs": [run_item(run) for run in runs], "sweep": sweep, "argv": argv,
            "source": {"commit": state.commit, "changed": state.changed, "diff": state.diff,
                       "where": f"{socket.gethostname()}:{SOURCE_ROOT}"}}


def run_item(run: ComposedRun) -> Dict[str, Any]:
    """A composed run as a request carries it (:func:`composed` makes it a run again on the cluster's side)."""
    return {"overrides": run.overrides, "resolved": OmegaConf.to_container(run.resolved), "plan": run.plan.to_dict(),
            "run_file": run.run_file}


def composed(item: Dict[str, Any]) -> ComposedRun:
    """A run of the request as a local launch has it; the cluster is local here (no ``ssh``)."""
    item["resolved"]["cluster"]["ssh"] = None
    resolved = OmegaConf.create(item["resolved"])
    config: RunConfig = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RunConfig), resolved))  # type: ignore
    plan = Plan.from_dict(item["plan"])
    return ComposedRun(overrides=item["overrides"], config=config, resolved=resolved, plan=plan,
                       run_file=item["run_file"], data=check_data(config, plan))


def launch(payload: Dict[str, Any]) -> Dict[str, Any]:
    from launcher.submit.submitter import launch as submit  # lazy: keeps submitit out of start-up

    source = payload["source"]
    adopt_source(TreeState(source["commit"], source["changed"], source["diff"]), source["where"])
    runs = [composed(item) for item in payload["runs"]]
    sys.argv = ["launcher", *payload["argv"]]  # the run's record keeps the command as the user typed it
    launched = submit(runs, payload["sweep"])
    return {"records": [asdict(record) for record in launched.records], "sweep_id": launched.sweep_id,
            "note": launched.note}


def incoming(payload: Dict[str, Any]) -> Dict[str, Any]:
    """A new folder in this cluster's run root that a run moved here is copied into (launcher/service/move.py),
    refused where the root has a run of its name."""
    root, name = ensure_root(str(default_root())), run_name(payload["name"])
    if (root / name).exists():
        raise LaunchError(f"the run root {root} there already has a run named {name}")
    return {"path": tempfile.mkdtemp(prefix=INCOMING, dir=root)}


def discard(payload: Dict[str, Any]) -> Dict[str, Any]:
    """The folder ``incoming`` removed, where a move's copy into it did not become a run here (the copy or the
    submission failed); nothing where it is gone. A folder of the run root's that :func:`incoming` made, only."""
    root, folder = default_root(), Path(payload["incoming"])
    if folder.parent != root or not folder.name.startswith(INCOMING) or folder.is_symlink():
        raise LaunchError(f"{folder} is no folder a move copies into in the run root {root} there")
    shutil.rmtree(folder, ignore_errors=True)
    return {}


def run_name(name: Any) -> str:
    """``name`` when it can name a run directory of the run root (a folder of it, not hidden); LaunchError if not."""
    if not isinstance(name, str) or not name or "/" in name or name.startswith("."):
        raise LaunchError(f"{name!r} is not a run's name")
    return name


def adopt(payload: Dict[str, Any]) -> Dict[str, Any]:
    """The run copied into the folder ``incoming`` made a run of this cluster's (its files rewritten for it,
    launcher/submit/relayout.py) and submitted here, as a move's new job; the run's record."""
    from launcher.job.submission import resubmit, watch  # lazy: keeps submitit out of start-up
    from launcher.submit.relayout import rewrite  # lazy: keeps hydra out of start-up

    root, name, moved = default_root(), run_name(payload["name"]), payload["moved"]
    folder, run_dir = Path(payload["incoming"]), root / name
    if folder.parent != root or not folder.name.startswith(INCOMING) or run_dir.exists():
        raise LaunchError(f"cannot take {folder} in as run {name} of the run root {root} there")
    folder.rename(run_dir)
    record = RunRecord(**{**payload["record"], "run_dir": str(run_dir), "rebuilt": None})
    try:
        rewrite(record, composed(payload["run"]))
        index_run(root, name, record.submitted_at)
        record.job_id = resubmit(run_dir, by="move")
    except BaseException:  # not submitted: no run of that name is left here (the move says why)
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    append_event(run_dir, Moved(**{**moved, "job_id": record.job_id, "cluster": record.cluster}))
    watch(run_dir, record.job_id)
    return {"record": asdict(record)}


def partitions(payload: Dict[str, Any]) -> Dict[str, Any]:
    """This cluster's partitions as ``launcher clusters`` lists them (launcher/status/usage.py)."""
    slurm = Slurm(payload.get("slurm_conf"), timeout=10)
    try:
        slurm.ping()
        found = usage(slurm.nodes(timeout=10))
    except SlurmError as err:
        raise LaunchError(str(err)) from None
    return {"partitions": [{key: value for key, value in asdict(part).items() if key != "free_per_node"}
                           for part in found]}


def scripts(payload: Dict[str, Any]) -> Dict[str, Any]:
    """The sbatch scripts of the request's runs as they would be submitted here (a dry run: nothing is written),
    with this cluster's paths (run root, interpreter, secrets store), and each run's data line."""
    from launcher.submit.submitter import scripts as render  # lazy: keeps submitit out of start-up

    runs = [composed(item) for item in payload["runs"]]
    return {"scripts": [asdict(script) for script in render(runs, payload["names"], payload["sweep"])],
            "data": [run.data.line() for run in runs]}


def place(payload: Dict[str, Any]) -> Dict[str, Any]:
    """When the request's one run would start on this cluster (``cluster=auto``, launcher/submit/placement.py): the
    checks a launch makes here and ``sbatch --test-only`` of its script; nothing is written or queued."""
    from launcher.submit.placement import ASK_TIMEOUT_S, ask_here  # lazy: keeps submitit out of start-up

    (item,) = payload["runs"]
    return asdict(ask_here(composed(item), timeout=float(payload.get("timeout") or ASK_TIMEOUT_S)))


def follow(payload: Dict[str, Any]) -> Dict[str, Any]:
    """A run's metrics rows appended since ``metrics_offset`` (as their lines' objects: the answer is JSON) and rank
    ``rank``'s log from ``log_offset``, in one answer: the web console's refresh of a run on this cluster
    (launcher/console/readers.py), one SSH command (a metrics file rewritten shorter is read again from its start,
    and ``again`` says so)."""
    run_dir = Path(payload["run_dir"])
    if not (run_dir / "run.json").is_file():
        raise LaunchError(f"no run directory {run_dir} on this cluster")
    rows, offset = new_rows(run_dir / METRICS, int(payload.get("metrics_offset") or 0))
    again = rows is None
    if again:
        rows, offset = new_rows(run_dir / METRICS, 0)
    log = log_from(rank_log(run_dir, payload.get("job_id"), int(payload.get("rank") or 0)), payload.get("log_offset"))
    return {"metrics": [encode(row) for row in rows], "metrics_offset": offset, "again": again, "log": log}


ACTIONS = {"launch": launch, "partitions": partitions, "scripts": scripts, "follow": follow, "incoming": incoming,
           "adopt": adopt, "discard": discard, "place": place}


def main(argv: List[str]) -> int:
    if len(argv) != 1 or argv[0] not in ACTIONS:
        print(f"usage: python -m launcher.remote.agent {'|'.join(ACTIONS)} < request.json", file=sys.stderr)
        return 2
    try:
        answer = ACTIONS[argv[0]](json.load(sys.stdin))
    except (LaunchError, DamagedRun) as err:
        message = err.message if isinstance(err, LaunchError) else str(err)
        print("error: " + message.replace("\n", "\\n"), file=sys.stderr)
        return 2
    json.dump(answer, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
