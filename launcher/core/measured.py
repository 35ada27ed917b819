"""What the planner forecast for a run beside what the run measured, kept per cluster in its run root.

The launch writes the run's forecast (:class:`Forecast`, ``forecast.json``: step time, memory per GPU and tokens/s
on its cluster's GPU, launcher/forecast/learned.py) into the run directory. When the run completes, its job's end
step (launcher/job/recovery.py) appends one line to ``<run_root>/.measured-<cluster>.jsonl``: that forecast beside
the final row of its metrics (:class:`Measured`). ``launcher plan`` corrects its forecast with the lines of similar
runs and ``launcher plan --accuracy`` reads them all, one file per cluster, never a run directory.

The file is shared by every run of the root, so it is appended to as a run's event log is (launcher/core/rundir.py
``append_jsonl``: one ``O_APPEND`` write of one line, opened without following a symlink), in a root no other user
can change, and it is appended to and read only when it is a regular file of this user's, root's, or the share
group's of a shared root (launcher/core/safepath.py ``trusted_file``). A damaged line (a disk that filled up, a
hand edit) is skipped (launcher/core/damage.py).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from launcher.core.gpus import GIB
from launcher.core.damage import DamagedRun, numbered_lines, read_json_object, warn_damaged
from launcher.core.metrics import FinalRow
from launcher.core.rundir import FORECAST, append_jsonl, last_metrics
from launcher.core.safepath import is_safe_root, open_nofollow, trusted_file

MEASURED = ".measured-{cluster}.jsonl"


@dataclass(frozen=True)
class Forecast:
    """What the planner said of a run at its launch, on its cluster's GPU (``forecast.json``): the GPU it is of
    (``gpu``: its type, or the local cluster's ``H100 stand-in``, whose ranks run on CPUs), the model's size, and
    step time, memory per GPU and tokens/s (the step time and tokens/s None where the GPU's speed is unknown)."""

    cluster: str
    gpu: str
    stand_in: bool
    model: str
    params: int
    gpus: int
    step_time_s: Optional[float]
    mem_per_gpu_gib: float
    tokens_per_s: Optional[float]

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Forecast:
        """The forecast of a JSON object; ValueError naming what is missing or mistyped."""
        return cls(**_decoded(cls, data))


@dataclass(frozen=True)
class Measured:
    """One completed run's line: its forecast beside what its last attempt's final row measured (step time, rank
    0's peak memory in GiB, tokens/s over all ranks), and when it finished."""

    run: str
    finished: float
    forecast: Forecast
    step_time_s: Optional[float]
    peak_mem_gib: Optional[float]
    tokens_per_s: Optional[float]

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Measured:
        """The line's record; ValueError naming what is missing or mistyped."""
        return cls(**_decoded(cls, data))


_PLAIN = (str, bool, int, float, type(None))


@functools.lru_cache(maxsize=None)
def _schema(cls: type) -> Dict[str, Any]:
    """Each field of a dataclass a line holds and what its annotation (resolved by ``typing.get_type_hints``)
    lets its JSON value be: a dataclass, read the same way, or a tuple of plain types (one, or an Optional's). Any
    other annotation is a TypeError when this module is imported, so that no field is left unchecked."""
    schema: Dict[str, Any] = {}
    for name, hint in typing.get_type_hints(cls).items():
        if dataclasses.is_dataclass(hint):
            _schema(hint)  # its fields checked with its container's
            schema[name] = hint
            continue
        parts = typing.get_args(hint) if typing.get_origin(hint) is Union else (hint,)
        if not all(part in _PLAIN for part in parts):
            raise TypeError(f"{cls.__name__}.{name}: a JSON line's value is not checked against {hint}")
        schema[name] = parts
    return schema


def _decoded(cls: type, data: Any) -> Dict[str, Any]:
    """The fields of ``cls`` in a JSON object, each of its annotated type (a float field takes an int too, as a
    hand edit writes one; a number never takes a bool); ValueError naming what is missing or mistyped."""
    if not isinstance(data, dict):
        raise ValueError("is not an object")
    values: Dict[str, Any] = {}
    for name, kind in _schema(cls).items():
        value = data.get(name)
        if isinstance(kind, type):
            values[name] = kind(**_decoded(kind, value))
        elif name in data and any(_is(value, part) for part in kind):
            values[name] = value
        else:
            words = " or ".join("None" if part is type(None) else part.__name__ for part in kind)
            raise ValueError(f"has {name}={value!r}, not {words}")
    return values


def _is(value: Any, plain: type) -> bool:
    if isinstance(value, bool):
        return plain is bool
    return isinstance(value, (int, float) if plain is float else plain)


_schema(Measured)  # every annotation of a line checked once, at import


def measured_path(root: Path, cluster: str) -> Optional[Path]:
    """The root's file of a cluster's completed runs; None for a cluster name that is no plain file name."""
    if not cluster or "/" in cluster or cluster.startswith("."):
        return None
    return Path(root) / MEASURED.format(cluster=cluster)


def read_forecast(run_dir: Path) -> Optional[Forecast]:
    """The forecast the run was launched with; None where it has none (a run of an older launcher) or it is
    damaged."""
    try:
        return Forecast.from_dict(read_json_object(Path(run_dir), FORECAST))
    except (DamagedRun, ValueError):
        return None


def record_completed(run_dir: Path) -> Optional[Measured]:
    """Append the completed run's forecast beside its measurement to its root's file of its cluster (the job's end
    step calls it once, when the run completes); None and nothing written without a forecast or a final row, in
    a root another user could change, or where the file cannot be written (the run's own record stands)."""
    run_dir = Path(run_dir)
    forecast, row = read_forecast(run_dir), last_metrics(run_dir)
    path = measured_path(run_dir.parent, forecast.cluster) if forecast else None
    if forecast is None or path is None or not isinstance(row, FinalRow) or not is_safe_root(run_dir.parent):
        return None
    line = Measured(run=run_dir.name, finished=time.time(), forecast=forecast, step_time_s=row.step_time,
                    peak_mem_gib=row.peak_mem_gb * 1e9 / GIB if row.peak_mem_gb is not None else None,
                    tokens_per_s=row.tokens_per_s)
    try:
        written = append_jsonl(path, line.to_dict(), trusted=lambda info: trusted_file(info, run_dir.parent))
    except OSError:  # a symlink planted, a root this user may not write, a full disk: the run's own record stands
        return None
    return line if written else None


def read_measured(root: Path, cluster: str) -> List[Measured]:
    """The cluster's completed runs of ``root``, in the order they finished, the newest line of a run that
    completed twice (resumed past its end); damaged lines skipped with a warning; none where the file is missing,
    a symlink, no regular file, or of a user the root does not trust."""
    path = measured_path(root, cluster)
    if path is None:
        return []
    try:
        fd = open_nofollow(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, errors="replace") as f:
        if not trusted_file(os.fstat(fd), Path(root)):
            return []
        runs: Dict[str, Measured] = {}
        for number, line in numbered_lines(f, path):
            try:
                record = Measured.from_dict(line)
            except ValueError as err:
                warn_damaged(path, number, f"is no completed run's line ({err})")
                continue
            runs[record.run] = record
    return sorted(runs.values(), key=lambda m: m.finished)


def measured_clusters(root: Path) -> List[str]:
    """The clusters the root has a file of completed runs for."""
    prefix, suffix = MEASURED.split("{cluster}")
    try:
        names = os.listdir(root)
    except OSError:
        return []
    return sorted(n[len(prefix):-len(suffix)] for n in names if n.startswith(prefix) and n.endswith(suffix)
                  and len(n) > len(prefix) + len(suffix))
