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
from typing import Any, Iterable, Iterator, Optional

RECORD = "run.json"
EVENTS = "events.jsonl"
METRICS = "metrics.jsonl"
INDEX = ".index"
TENSORBOARD = "tensorboard"  # TensorBoard's event files (train/tracking.py)
WANDB = "wandb"  # W&B's files: wandb.init(dir=RUN) keeps them in RUN/wandb
CODE = "code"  # the frozen copy of the code the run's tasks import (launcher/freeze.py)
CODE_SOURCE = "source.json"  # in CODE: the copy's checkout, git commit and dirty flag
CODE_DIFF = "diff.patch"  # in CODE: the uncommitted changes of a dirty checkout
DEFAULT_ROOT = "~/.launcher/runs"


def default_root() -> Path:
    """Where runs live unless a command says otherwise: $LAUNCHER_RUN_ROOT or ~/.launcher/runs."""
    return Path(os.path.expanduser(os.environ.get("LAUNCHER_RUN_ROOT", DEFAULT_ROOT)))


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


def code_dir(run_dir: Path) -> Path:
    """Where the run's frozen code lives; the tasks import from it (launcher/sbatch.py)."""
    return Path(run_dir).absolute() / CODE


def code_source(run_dir: Path) -> Optional[dict]:
    """Where the run's frozen code came from (commit, dirty, ...), or None for a run without a copy."""
    try:
        return json.loads((code_dir(run_dir) / CODE_SOURCE).read_text())
    except (OSError, json.JSONDecodeError):
        return None


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


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one JSON line with a single write on an O_APPEND descriptor, so lines from different
    processes (the launcher, rank 0 of successive requeues) never interleave within a line."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (json.dumps(record, sort_keys=True) + "\n").encode())
    finally:
        os.close(fd)


def append_event(run_dir: Path, event: str, **fields: Any) -> None:
    """Append ``{"time": ..., "event": event, ...}`` to the run's event log (docs/design-contract.md)."""
    append_jsonl(Path(run_dir) / EVENTS, {"time": time.time(), "event": event, **fields})


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
    """Write the run's record (once, at submit time) and index it."""
    run_dir = Path(record.run_dir)
    write_json_atomic(run_dir / RECORD, asdict(record))
    index_run(run_dir.parent, record.name, record.submitted_at)


def load_record(run_dir: Path) -> Optional[RunRecord]:
    """The run's record, or None for a directory that is not (or not yet) a run."""
    try:
        data = json.loads((run_dir / RECORD).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    known = RunRecord.__dataclass_fields__
    return RunRecord(**{k: v for k, v in data.items() if k in known})


def record_paths(root: Path) -> list[tuple[float, Path]]:
    """(submit time, run dir) of every run, newest first.

    The index (``root/.index``, one ``<submitted_at> <name>`` line appended per run at submit time) makes
    this one read instead of a stat per run. It is only a cache of the directories: a name it lacks is
    looked up (run.json's mtime is its submit time, as it is written once) and added; a name whose
    directory is gone is dropped. Deleting the index, or a run directory, by hand breaks nothing.
    """
    try:
        names = {name for name in os.listdir(root) if not name.startswith(".")}
    except FileNotFoundError:
        return []
    submitted: dict[str, float] = {}
    try:
        with open(root / INDEX) as f:
            for line in f:
                stamp, _, name = line.rstrip("\n").partition(" ")
                if name in names:
                    try:
                        submitted[name] = float(stamp)
                    except ValueError:  # a torn line
                        continue
    except FileNotFoundError:
        pass
    for name in names - submitted.keys():
        try:
            submitted[name] = os.stat(root / name / RECORD).st_mtime
        except OSError:  # not a run (yet)
            continue
        index_run(root, name, submitted[name])
    return sorted(((t, root / name) for name, t in submitted.items()), key=lambda item: item[0], reverse=True)


def index_run(root: Path, name: str, submitted_at: float) -> None:
    """Append the run to the root's index: one write of one line, so concurrent appends never mix."""
    try:
        fd = os.open(root / INDEX, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:  # a root this user may read but not write: the index stays a cache
        return
    try:
        os.write(fd, f"{submitted_at:.6f} {name}\n".encode())
    finally:
        os.close(fd)


def list_records(root: Path, limit: Optional[int] = None) -> list[RunRecord]:
    """Records of the newest ``limit`` runs (all with None), newest first."""
    paths = record_paths(root)
    records = (load_record(path) for _, path in (paths if limit is None else paths[:limit]))
    return [rec for rec in records if rec is not None]


def find_run(root: Path, name: str) -> RunRecord:
    """The run called ``name``, or the only one whose name starts with it.

    Raises LookupError with the closest names when there is no such run or the prefix is ambiguous.
    """
    exact = load_record(root / name) if name and "/" not in name else None
    if exact is not None:
        return exact
    names = [path.name for _, path in record_paths(root)]
    return load_record(root / unique_prefix(name, names, "run named", root))  # type: ignore[return-value]


def unique_prefix(text: str, candidates: Iterable[str], what: str, root: Path) -> str:
    """The candidate equal to ``text``, or the only one starting with it: how run names and sweep ids
    are typed. Raises LookupError naming the matches (ambiguous) or the closest candidates (unknown)."""
    candidates = sorted(set(candidates))
    if text in candidates:
        return text
    matches = [c for c in candidates if c.startswith(text)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise LookupError(f"{what} '{text}' is ambiguous: {', '.join(matches[:5])}"
                          + (f" (and {len(matches) - 5} more)" if len(matches) > 5 else ""))
    import difflib

    close = difflib.get_close_matches(text, candidates, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise LookupError(f"no {what} '{text}' in {root}{hint}")


def last_metrics(run_dir: Path) -> Optional[dict]:
    """The newest complete record of metrics.jsonl, reading only the file's tail."""
    try:
        with open(run_dir / METRICS, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 8192))
            tail = f.read().decode(errors="replace")
    except FileNotFoundError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return None
