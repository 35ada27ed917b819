"""Run records: one directory per run under the run root.

The directories are the source of truth. A run exists once ``mkdir`` of its directory succeeded (atomic,
so concurrent launches can never take the same name), and it is listed once its ``run.json`` was written
(atomically, by rename). Removing a directory by hand removes the run; nothing else needs updating.
"""
from __future__ import annotations

import json
import os
import secrets
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

RECORD = "run.json"
EVENTS = "events.jsonl"


@dataclass
class RunRecord:
    """What was submitted, written once at submit time (job_id is filled in after sbatch answers)."""

    name: str
    run_dir: str
    model: str
    gpus: int
    nodes: int
    gpus_per_node: int
    steps: int
    cluster: str
    submitted_at: float
    job_id: Optional[str] = None
    sweep: Optional[str] = None
    slurm_conf: Optional[str] = None
    argv: list[str] = field(default_factory=list)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON so that readers see the old file or the new one, never half of one."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    """Append one line to the run's event log (single small appends are atomic on POSIX)."""
    line = json.dumps({"time": time.time(), "event": event, **fields}, sort_keys=True)
    with open(run_dir / EVENTS, "a") as f:
        f.write(line + "\n")


def read_events(run_dir: Path) -> list[dict]:
    """The event log, skipping a torn last line."""
    return list(read_jsonl(run_dir / EVENTS))


def read_jsonl(path: Path) -> Iterator[dict]:
    """Records of a JSON-lines file; a line cut short by a crash is skipped."""
    try:
        with open(path) as f:
            for line in f:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        return


def ensure_root(root: str) -> Path:
    """The run root, created if needed; a one-line error if it cannot be written."""
    path = Path(os.path.expanduser(root))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise PermissionError(f"run root {path} cannot be created ({err.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(f"run root {path} is not writable; set run_root=... or LAUNCHER_RUN_ROOT")
    return path


def base_name(model: str, gpus: int) -> str:
    """A readable name stem, e.g. ``gpt-1b-16g``; a launch adds a random suffix."""
    return f"{model.replace('_', '-')}-{gpus}g"


def create_run_dir(root: Path, base: str, explicit: bool) -> Path:
    """Make the run's directory. An explicit name must be new; a generated one gets a random suffix."""
    if explicit:
        path = root / base
        try:
            path.mkdir()
        except FileExistsError:
            raise FileExistsError(f"a run named '{base}' already exists in {root}; choose another name=") from None
        return path
    while True:
        path = root / f"{base}-{secrets.token_hex(2)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def save_record(record: RunRecord) -> None:
    write_json_atomic(Path(record.run_dir) / RECORD, asdict(record))


def load_record(run_dir: Path) -> Optional[RunRecord]:
    """The run's record, or None for a directory that is not (or not yet) a run."""
    try:
        data = json.loads((run_dir / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    known = RunRecord.__dataclass_fields__
    return RunRecord(**{k: v for k, v in data.items() if k in known})
