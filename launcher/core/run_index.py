"""The run root as an index of runs: each run's record (``run.json``), making a run's directory, and
listing and finding runs by name, prefix or sweep.

The directories are the source of truth. A run exists once ``mkdir`` of its directory succeeded (atomic,
so concurrent launches can never take the same name), and it is listed once its ``run.json`` was written
(atomically, by rename). Removing a directory by hand removes the run; nothing else needs updating.
Only the launcher reads and writes these (the training tasks never do); they live in the core, beside the
run directory's contract (launcher/core/rundir.py), so that the launch, a job's retry and the status commands
share one writer and one reader.
"""
from __future__ import annotations

import difflib
import os
import tempfile
import secrets
from dataclasses import asdict, dataclass, field
from operator import itemgetter
from pathlib import Path
from typing import Iterable, Optional

from launcher.core.damage import DamagedRun, read_json_object, read_yaml_mapping
from launcher.core.events import Resubmitted, Retrying, Submitted
from launcher.core.privacy import file_mode
from launcher.core.rundir import (CONFIG, DEFAULT_ROOT, EVENTS, PLAN, RECORD, launcher_home, read_events, sweep_dir,
                                  write_json_atomic)
from launcher.core.safepath import RUN_ROOT, check_run_root, ensure_home, is_safe_root, open_nofollow, private_dir

INDEX = ".index"
def ensure_sweep_dir(root: Path, sweep_id: str) -> Path:
    """The sweep's directory, created 0700 if missing (and ``.sweeps`` with it), never through a symlink."""
    path = sweep_dir(root, sweep_id)
    private_dir(path.parent, "sweeps directory", RUN_ROOT)
    private_dir(path, "sweep directory", RUN_ROOT)
    return path


def default_root() -> Path:
    """Where runs live unless a command says otherwise: $LAUNCHER_RUN_ROOT or ~/.launcher/runs."""
    return Path(os.path.expanduser(os.environ.get("LAUNCHER_RUN_ROOT", DEFAULT_ROOT)))


def builtin_root() -> Path:
    """The root of a user who chose none: ~/.launcher/runs."""
    return Path(os.path.expanduser(DEFAULT_ROOT))


# In the launcher's home: every run root a launch used besides the built-in one ($LAUNCHER_RUN_ROOT, a cluster's
# run_root on its scratch, a run_root= override, a run file's), one per line, so that status commands in a shell
# without that variable find those runs too.
ROOTS = "roots"


def _listed_roots() -> list[Path]:
    try:
        with os.fdopen(open_nofollow(launcher_home() / ROOTS)) as f:
            return [Path(line.rstrip("\n")) for line in f if line.strip()]
    except OSError:
        return []


def known_roots() -> list[Path]:
    """The default root, then every other root a launch used that still exists."""
    roots = [default_root()]
    for root in _listed_roots():
        if root not in roots and os.path.isdir(root):
            roots.append(root)
    return roots


def remember_root(root: Path) -> None:
    """Add a run root to the launcher's list, once (one O_APPEND write; a root it cannot list is only not
    found by ``runs`` without ``--root``), in a launcher home no other user can change."""
    root = Path(root).absolute()
    if root == builtin_root() or root in _listed_roots():
        return
    try:
        home = ensure_home(launcher_home())
        fd = open_nofollow(home / ROOTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, f"{root}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass


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
    # Set only on a record rebuilt from the run's own files because run.json is damaged (:func:`rebuilt`): how it
    # is damaged. Never written: the record a writer saves is whole again.
    rebuilt: Optional[str] = None

    def to_json(self) -> dict:
        """run.json's object."""
        return {key: value for key, value in asdict(self).items() if key != "rebuilt"}


def ensure_root(root: str, share_group: Optional[str] = None) -> Path:
    """The run root, created if needed; a one-line error if it cannot be written, or if another user could
    change it (launcher/core/safepath.py), checked before anything is created and again after."""
    path = Path(os.path.expanduser(root))
    check_run_root(path, share_group)  # UnsafePath, as its own type
    problem = root_problem(root, share_group)  # in the words a dry run says it
    if problem:
        raise PermissionError(problem)
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)  # a new root is private (launcher/core/privacy.py)
    except OSError as err:
        raise PermissionError(f"run root {path} cannot be created ({err.strerror})") from None
    check_run_root(path, share_group)  # what was created took the umask: 0777 under umask 0
    return path


def root_problem(root: str, share_group: Optional[str] = None) -> Optional[str]:
    """Why :func:`ensure_root` would refuse the run root, found without leaving anything behind (a dry run, a
    plan, and the launch itself before it creates the root); None if it would pass. Whether the root, or the
    nearest directory above it that exists, can be written is tried (a directory made and removed at once):
    ``os.access`` answers yes to root wherever the file system itself refuses (``/proc``, a read-only mount)."""
    path = Path(os.path.expanduser(root))
    try:
        check_run_root(path, share_group)
    except (PermissionError, ValueError) as err:
        return str(err)
    existing = next(p for p in (path, *path.parents) if p.exists())
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".launcher-probe-", dir=existing))
    except OSError as err:
        if existing == path:
            return f"run root {path} is not writable ({err.strerror}); set run_root=... or LAUNCHER_RUN_ROOT"
        return f"run root {path} cannot be created ({existing} cannot be written: {err.strerror})"
    return None


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
    write_json_atomic(run_dir / RECORD, record.to_json())
    index_run(run_dir.parent, record.name, record.submitted_at)


# The JSON types each RunRecord field may hold (the dataclass's annotations, which are strings here).
_RECORD_TYPES = {"str": (str,), "int": (int,), "float": (int, float), "Optional[str]": (str, type(None)),
                 "list[str]": (list,)}
_FIELD_TYPES = {name: (_RECORD_TYPES[f.type], f.type) for name, f in RunRecord.__dataclass_fields__.items()}
_REQUIRED = [name for name, f in RunRecord.__dataclass_fields__.items() if f.default is f.default_factory]


def load_record(run_dir: Path) -> RunRecord:
    """The run's record; DamagedRun when run.json is missing, unreadable, or lacks or mistypes a field."""
    data = read_json_object(run_dir, RECORD)
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise DamagedRun(run_dir, RECORD, f"lacks {', '.join(missing)}")
    for name, (types, type_name) in _FIELD_TYPES.items():
        if name in data and (not isinstance(data[name], types) or isinstance(data[name], bool)):
            raise DamagedRun(run_dir, RECORD, f"has {name}={data[name]!r}, not a {type_name}")
    record = RunRecord(**{k: v for k, v in data.items() if k in _FIELD_TYPES})
    if os.path.realpath(record.run_dir) != os.path.realpath(run_dir):
        # Copied or moved: its job, checkpoints and name are another directory's. Acting on it as the record
        # says would stop, resume or delete that one; it is listed as damaged instead, and only deleted itself.
        raise DamagedRun(run_dir, RECORD, f"is a copy of run {record.name} (it names {record.run_dir}): the "
                         "launcher acts on neither through it; remove the copy yourself")
    return record


def check_run(run_dir: Path) -> None:
    """DamagedRun when the run's plan is there but cannot be read. Listings check this much for every run
    (JSON is cheap; parsing every config.yaml would multiply a listing's time): what the config and plan
    must hold, the commands that read them check."""
    if os.path.exists(os.path.join(run_dir, PLAN)):
        read_json_object(run_dir, PLAN)


def is_run(run_dir: Path) -> bool:
    """Whether a directory of the run root is a run: its record was written, or its event log (begun just
    after the record) was, so a run whose run.json was lost still counts (as damaged)."""
    return (run_dir / RECORD).exists() or (run_dir / EVENTS).exists()


def record_names(root: Path) -> list[tuple[float, str]]:
    """(submit time, run name) of every run, newest first (names, not paths: a listing that stops at
    ``--limit`` makes the paths of only the runs it shows).

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
        with os.fdopen(open_nofollow(root / INDEX)) as f:
            for line in f:
                stamp, _, name = line.rstrip("\n").partition(" ")
                if name in names:
                    try:
                        submitted[name] = float(stamp)
                    except ValueError:  # a torn line
                        continue
    except OSError:  # none yet, or a symlink: the directories say it all
        pass
    for name in names - submitted.keys():
        for file in (RECORD, EVENTS):  # a run that lost its run.json is still one
            try:
                submitted[name] = os.stat(root / name / file).st_mtime
                break
            except OSError:  # not a run (yet)
                continue
        else:
            continue
        index_run(root, name, submitted[name])
    return [(t, name) for name, t in sorted(submitted.items(), key=itemgetter(1), reverse=True)]


def index_run(root: Path, name: str, submitted_at: float) -> None:
    """Append the run to the root's index: one write of one line, so concurrent appends never mix. Only in
    a root no other user can change (a status command reads any root, but writes only into those)."""
    if not is_safe_root(root):
        return
    try:
        fd = open_nofollow(root / INDEX, os.O_WRONLY | os.O_APPEND | os.O_CREAT, file_mode(root))
    except OSError:  # a root this user may read but not write, or a symlink planted: the index stays a cache
        return
    try:
        os.write(fd, f"{submitted_at:.6f} {name}\n".encode())
    finally:
        os.close(fd)


def load_or_damage(run_dir: Path) -> RunRecord | DamagedRun:
    """The run's record (rebuilt from the run's own files when only run.json is damaged), or why it or its plan
    cannot be read."""
    try:
        check_run(run_dir)
    except DamagedRun as damage:
        return damage
    try:
        return load_record(run_dir)
    except DamagedRun as damage:
        return rebuilt(run_dir, damage)


def rebuilt(run_dir: Path, damage: DamagedRun) -> RunRecord | DamagedRun:
    """The record of a run whose run.json is there but damaged (cut short, emptied, garbled), rebuilt from what
    the launch and the job wrote beside it: plan.json and config.yaml (model, GPUs, steps, cluster), events.jsonl
    (when it was submitted, its newest job). Marked with the damage; ``damage`` itself when run.json is missing
    (a launch still writing it, or not a run), a copy of another run's, or the other files cannot say. What
    Slurm's configuration the launch resolved is not kept elsewhere: Slurm's default is asked about it."""
    if damage.file != RECORD or damage.how == "is missing" or damage.how.startswith("is a copy"):
        return damage
    try:
        plan, config = read_json_object(run_dir, PLAN), read_yaml_mapping(run_dir, CONFIG)
        events = read_events(run_dir)
        jobs = [e.job_id for e in events if isinstance(e, (Submitted, Retrying, Resubmitted)) and e.job_id]
        submitted = next((e.time for e in events if isinstance(e, Submitted)), os.path.getmtime(run_dir))
        return RunRecord(name=Path(run_dir).name, run_dir=str(run_dir), model=str(plan["model"]),
                         gpus=int(plan["gpus"]), nodes=int(plan["nodes"]),
                         gpus_per_node=int(plan["gpus"]) // max(1, int(plan["nodes"])),
                         steps=int(config["train"]["steps"]), cluster=str(config["cluster"]["name"]),
                         submitted_at=submitted, job_id=jobs[-1] if jobs else None, rebuilt=damage.reason)
    except (DamagedRun, OSError, KeyError, TypeError, ValueError):
        return damage


def mend_record(run_dir: Path) -> None:
    """Write a whole run.json again over a damaged one (:func:`rebuilt`); the writers of a run's record call it
    (the job's end, a resubmission). Nothing when run.json is whole or cannot be rebuilt."""
    record = load_or_damage(run_dir)
    if isinstance(record, RunRecord) and record.rebuilt:
        write_json_atomic(Path(run_dir) / RECORD, record.to_json())


def list_records(root: Path, limit: Optional[int] = None) -> list[RunRecord]:
    """Records of the newest ``limit`` runs (all with None) that can be read, newest first."""
    names = record_names(root)
    runs = (load_or_damage(root / name) for _, name in (names if limit is None else names[:limit]))
    return [run for run in runs if isinstance(run, RunRecord)]


def find_run(root: Path, name: str) -> RunRecord:
    """The run called ``name``, or the only one whose name starts with it.

    Raises LookupError with the closest names when there is no such run or the prefix is ambiguous, and
    DamagedRun when it is listed as damaged (its record or plan cannot be read).
    """
    if not (name and "/" not in name and name not in (".", "..") and is_run(root / name)):
        name = unique_prefix(name, [name for _, name in record_names(root)], "run named", root)
    run = load_or_damage(root / name)
    if isinstance(run, DamagedRun):
        raise run
    return run


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

    close = difflib.get_close_matches(text, candidates, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise LookupError(f"no {what} '{text}' in {root}{hint}")
