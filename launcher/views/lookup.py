"""What the commands share: the run root option's value, run lookup by name or prefix, the check before a
command changes runs, human formatting of times, and how to name the launcher in a hint the user pastes."""
from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import List, Optional, Sequence

from launcher.core.safepath import UnsafePath, check_run_root
from launcher.errors import LaunchError
from launcher.core.run_index import RunRecord, default_root, find_run, known_roots, list_records, unique_prefix


def roots_of(args: argparse.Namespace) -> List[Path]:
    """The run roots a status command looks in: :func:`roots_for` its ``--root``."""
    return roots_for(args.root)


def roots_for(root: Optional[Path]) -> List[Path]:
    """``root``, else ``$LAUNCHER_RUN_ROOT``, else the default root and every other root a launch used (a
    cluster's ``run_root``: launcher/core/run_index.py known_roots)."""
    if root:
        return [root.expanduser()]
    return [default_root()] if os.environ.get("LAUNCHER_RUN_ROOT") else known_roots()


def lookup(roots: Sequence[Path], name: str) -> RunRecord:
    """The run called ``name`` (or the only one starting with it) in the first root that has it."""
    errors = []
    for root in roots:
        try:
            return find_run(root, name)
        except LookupError as err:
            if "ambiguous" in str(err):
                raise LaunchError(str(err)) from None
            errors.append(str(err))
    others = f" (nor in {', '.join(map(str, roots[1:]))})" if len(roots) > 1 else ""
    raise LaunchError(errors[0] + others)


def sweep_runs(roots: Sequence[Path], sweep: str) -> List[RunRecord]:
    """Every run of the sweep whose id is ``sweep`` or starts with it (a unique prefix, as for run names)."""
    records = [rec for root in roots for rec in list_records(root)]
    try:
        sweep_id = unique_prefix(sweep, (rec.sweep for rec in records if rec.sweep), "sweep", roots[0])
    except LookupError as err:
        raise LaunchError(str(err)) from None
    return [rec for rec in records if rec.sweep == sweep_id]


def chosen_runs(roots: Sequence[Path], names: List[str], sweep: Optional[str]) -> List[RunRecord]:
    """The runs named (by name or unique prefix), or every run of a sweep (by id or unique prefix)."""
    if sweep:
        return sweep_runs(roots, sweep)
    if not names:
        raise LaunchError("name at least one run, or --sweep ID")
    return [lookup(roots, name) for name in names]


def changeable(records: Sequence[RunRecord]) -> Sequence[RunRecord]:
    """``records``, once no other user could change the run roots they are in (launcher/core/safepath.py):
    stop, resume and delete write into a run's directory or remove it, and would otherwise act wherever a
    symlink planted in its place leads. LaunchError in one line before anything is done."""
    for root in dict.fromkeys(Path(rec.run_dir).parent for rec in records):
        try:
            check_run_root(root)
        except UnsafePath as err:
            raise LaunchError(str(err)) from None
    return records


def duration(seconds: Optional[float]) -> str:
    """``4.2s``, ``45s``, ``12m03s``, ``3h07m``, ``2d04h``."""
    if seconds is None:
        return ""
    if seconds < 10:
        return f"{max(0.0, seconds):.1f}s"
    s = int(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def slurm_seconds(elapsed: str) -> Optional[float]:
    """Slurm's ``[D-]HH:MM:SS`` / ``MM:SS`` as seconds."""
    if not elapsed:
        return None
    days, _, clock = elapsed.rpartition("-")
    try:
        parts = [int(p) for p in clock.split(":")]
    except ValueError:
        return None
    while len(parts) < 3:
        parts.insert(0, 0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def clock(timestamp: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(timestamp))


def parse_since(text: str) -> float:
    """``30m``, ``2h``, ``3d`` ago, or a date ``2026-11-29[ 14:00]``, as a timestamp."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    if text[:-1].isdigit() and text[-1:] in units:
        return time.time() - int(text[:-1]) * units[text[-1]]
    for fmt in ("%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M", "%Y-%m-%d"):
        try:
            return time.mktime(time.strptime(text, fmt))
        except ValueError:
            continue
    raise LaunchError(f"--since {text!r}: use 30m, 2h, 3d, 1w or a date like 2026-11-29 or '2026-11-29 14:00'")


def invocation() -> str:
    """How this user ran the launcher, for hints meant to be pasted: ``launcher`` when that is the
    console script on PATH, the script's path when it is another one, else ``<python> -m launcher``
    (the interpreter that has the launcher's dependencies)."""
    script = sys.argv[0] if sys.argv else ""
    if os.path.basename(script) == "launcher":
        on_path = shutil.which("launcher")
        if on_path and os.path.realpath(on_path) == os.path.realpath(script):
            return "launcher"
        return shlex.quote(os.path.abspath(script))
    return f"{shlex.quote(sys.executable)} -m launcher"
