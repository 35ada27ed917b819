"""A run's directory as the launcher and the training tasks share it: its files' names, writes that readers
never see half of, the event log and the metrics (docs/design-contract.md). The run root as an index of
runs (records, listing, lookup) is the launcher's alone: launcher/core/run_index.py.
"""
from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, List, Optional, Sequence

from launcher.core import metrics
from launcher.core.damage import numbered_jsonl, warn_damaged
from launcher.core.events import Event, decode, encode
from launcher.core.privacy import file_mode
from launcher.core.safepath import open_nofollow

RECORD = "run.json"
CONFIG = "config.yaml"
PLAN = "plan.json"
EVENTS = "events.jsonl"
METRICS = "metrics.jsonl"
TENSORBOARD = "tensorboard"  # TensorBoard's event files (launcher/train/tracking.py)
WANDB = "wandb"  # W&B's files: wandb.init(dir=RUN) keeps them in RUN/wandb
CODE = "code"  # the frozen copy of the code the run's tasks import (launcher/submit/freeze.py)
CODE_SOURCE = "source.json"  # in CODE: the copy's checkout, git commit and dirty flag
CODE_DIFF = "diff.patch"  # in CODE: the uncommitted changes of a dirty checkout
# CODE compiled into one archive that every node copies once and its ranks import from (launcher/job/stage.py)
CODE_ARCHIVE = "code.zip"
DEFAULT_ROOT = "~/.launcher/runs"
# The code a run's frozen copy holds (launcher/submit/freeze.py), and what a remote cluster is shipped
# (launcher/remote/ship.py): these folders' .py and .yaml files, from the code's root (a checkout, or
# site-packages for an installed wheel), where this package's source is. Its source as its compiled code names it:
# a rank that imports the run's staged archive (launcher/job/stage.py) has ``__file__`` inside the archive, and its
# code names the frozen copy it was compiled from.
SOURCE_ROOT = Path((lambda: None).__code__.co_filename).resolve().parents[2]
FROZEN = ("launcher", "conf")  # launcher/ holds train/ (the tasks' code) too
SUFFIXES = (".py", ".yaml")
FORECAST = "forecast.json"  # what the planner forecast at the launch, on the run's GPU (launcher/core/measured.py)
TRIAL = "trial.json"  # a search trial's: its search, its number, what it reports while it trains (launcher/search/)
# Under a run root, beside its runs: each sweep's own directory (a grid's job array scripts and what Slurm writes
# for an element before it finds its run; a search's study). Listings skip it, as every name with a dot.
SWEEPS = ".sweeps"
SEARCH = "search.json"  # in a search's sweep directory: its definition (launcher/search/study.py)


def sweep_dir(root: Path, sweep_id: str) -> Path:
    return Path(root) / SWEEPS / sweep_id


def is_search(path: Path) -> bool:
    """Whether a sweep's directory is a search's (a grid sweep's holds only its job arrays' scripts and logs)."""
    return (Path(path) / SEARCH).is_file()


def trial_record(run_dir: Path) -> Optional[dict]:
    """What a search trial's run directory says of it (trial.json, written before its job could start: its search,
    its number, and what its training tells the study); None for a run that is no trial."""
    try:
        return json.loads((Path(run_dir) / TRIAL).read_text())
    except FileNotFoundError:
        return None


def trial_search(run_dir: Path, trial: dict) -> Path:
    """The directory of the search a trial of ``trial_record`` belongs to: beside its run, under the same root."""
    return sweep_dir(Path(run_dir).parent, trial["search"])


def search_ids(root: Path) -> List[str]:
    """The ids of the searches whose studies are in run root ``root``."""
    try:
        return sorted(entry.name for entry in (Path(root) / SWEEPS).iterdir() if is_search(entry))
    except OSError:
        return []


def search_path(roots: Sequence[Path], sweep_id: str) -> Optional[Path]:
    """The directory of search ``sweep_id`` in the first of ``roots`` that has it; None for a grid sweep. Asked
    before anything of a search is imported: a grid sweep's command never loads Optuna or the search's modules."""
    return next((sweep_dir(root, sweep_id) for root in roots if is_search(sweep_dir(root, sweep_id))), None)


def launcher_home(environ: Optional[dict] = None) -> Path:
    """The launcher's own directory: ``$LAUNCHER_HOME``, default ``~/.launcher`` (the secrets store, the list of
    run roots), absolute."""
    environ = os.environ if environ is None else environ
    return Path(os.path.expanduser(environ.get("LAUNCHER_HOME") or "~/.launcher")).absolute()


def frozen_files(root: Path = SOURCE_ROOT) -> Iterator[Path]:
    """The files of the code a run freezes, in a stable order (no __pycache__)."""
    for name in FROZEN:
        for folder, subfolders, files in os.walk(Path(root) / name):
            subfolders[:] = sorted(sub for sub in subfolders if sub != "__pycache__")
            yield from (Path(folder, file) for file in sorted(files) if file.endswith(SUFFIXES))


def code_dir(run_dir: Path) -> Path:
    """Where the run's frozen code lives; the tasks import from it (launcher/slurm/batch.py)."""
    return Path(run_dir).absolute() / CODE


def code_archive(run_dir: Path) -> Path:
    """The run's frozen code compiled into one archive (launcher/job/stage.py)."""
    return Path(run_dir).absolute() / CODE_ARCHIVE


def code_source(run_dir: Path) -> Optional[dict]:
    """Where the run's frozen code came from (commit, dirty, ...), or None for a run without a copy."""
    try:
        return json.loads((code_dir(run_dir) / CODE_SOURCE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never half of one."""
    write_atomic(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write a file so that readers see the old one or the new one, never half of one. It gets the
    permissions of its directory (launcher/core/privacy.py), as the run's other files do. Neither step follows
    a symlink: mkstemp creates its file O_EXCL, and the rename replaces whatever ``path`` is."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode(path.parent))
        with os.fdopen(fd, "wb" if isinstance(text, bytes) else "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def append_jsonl(path: Path, record: dict[str, Any],
                 trusted: Optional[Callable[[os.stat_result], bool]] = None) -> bool:
    """Append one JSON line with a single write on an O_APPEND descriptor, so lines from different
    processes (the launcher, rank 0 of successive requeues) never interleave within a line. A symlink
    there is refused, not followed (launcher/core/safepath.py), and the open never waits on a FIFO planted
    there (O_NONBLOCK); the write blocks as any write to a regular file does. ``trusted``: a check of what
    was opened (its fstat), for a file in a place others share; False and nothing written where it fails."""
    fd = open_nofollow(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK, file_mode(Path(path).parent))
    try:
        if trusted is not None and not trusted(os.fstat(fd)):
            return False
        os.set_blocking(fd, True)
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)
    return True


def append_event(run_dir: Path, event: Event) -> None:
    """Append ``event`` to the run's event log as one line (launcher/core/events.py, docs/design-contract.md). An
    event naming a job but not its cluster is written with the run's cluster (:func:`cluster_of`): job ids repeat
    across clusters."""
    if getattr(event, "job_id", None) is not None and getattr(event, "cluster", "") is None:
        event = dataclasses.replace(event, cluster=cluster_of(run_dir))  # type: ignore[call-arg]
    append_jsonl(Path(run_dir) / EVENTS, encode(event))


_CLUSTER_NAMES: dict[tuple[str, int], Optional[str]] = {}


def cluster_of(run_dir: Path) -> Optional[str]:
    """The cluster the run's config.yaml names, the one its newest job was submitted to (a move rewrites it before
    it submits); None without a readable config. Read once a version of the file in a process: every rank and the
    batch script's steps write events."""
    path = Path(run_dir) / CONFIG
    try:
        key = (str(path), path.stat().st_mtime_ns)
    except OSError:
        return None
    if key not in _CLUSTER_NAMES:
        import yaml  # lazy: ``runs`` and the other status commands load no YAML library

        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            loaded = None
        cluster = loaded.get("cluster") if isinstance(loaded, dict) else None
        name = cluster.get("name") if isinstance(cluster, dict) else None
        _CLUSTER_NAMES[key] = name if isinstance(name, str) else None
    return _CLUSTER_NAMES[key]


def names_this_job(run_dir: Path, job_id: Optional[str], cluster: Optional[str]) -> bool:
    """Whether an event's job ``job_id`` on ``cluster`` is the job this process runs in: its ``SLURM_JOB_ID``, on the
    run's cluster (job ids repeat across clusters; an event of an older launcher names none: the run's)."""
    return job_id == os.environ.get("SLURM_JOB_ID") and cluster in (None, cluster_of(run_dir))


def read_events(run_dir: Path) -> list[Event]:
    """The event log as typed events (launcher/core/events.py), oldest first, skipping damaged lines (an event
    must have a kind and a numeric time)."""
    path, events = os.path.join(run_dir, EVENTS), []
    for number, line in numbered_jsonl(path):
        if isinstance(line.get("event"), str) and isinstance(line.get("time", 0), (int, float)):
            events.append(decode(line))
        else:
            warn_damaged(path, number, "is not an event (it needs a kind and a numeric time)")
    return events


def append_metrics(path: Path, row: metrics.Row) -> None:
    """Append ``row`` to the metrics file at ``path`` as one line (launcher/core/metrics.py,
    docs/design-contract.md)."""
    append_jsonl(path, metrics.encode(row))


def read_metrics(run_dir: Path) -> list[metrics.Row]:
    """The metrics rows as typed rows (launcher/core/metrics.py), oldest first, skipping damaged lines (a row must
    have an integer step, and numbers where numbers go)."""
    path, rows = Path(run_dir) / METRICS, []
    for number, line in numbered_jsonl(path):
        row = metrics.decode(line)
        if row is not None:
            rows.append(row)
        else:
            warn_damaged(path, number, "is not a metrics row (it needs an integer step and numbers)")
    return rows


def last_metrics(run_dir: Path) -> Optional[metrics.Row]:
    """The newest complete row of metrics.jsonl, reading only the file's tail."""
    try:
        with open(os.path.join(run_dir, METRICS), "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    return next((row for row in map(metrics.parse, reversed(tail.splitlines())) if row is not None), None)


def last_step(run_dir: Path) -> Optional[int]:
    """The step of the newest row of metrics.jsonl; None before the first."""
    row = last_metrics(run_dir)
    return row.step if row is not None else None
