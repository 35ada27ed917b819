"""A search's directory, ``RUN_ROOT/.sweeps/ID/``: its definition and its Optuna study, on the shared file system.

``search.json`` is written once at the launch: the search space, the overrides every trial shares, the
settings and the environment trials are composed in (:class:`Search`). ``journal.log`` is Optuna's journal file
storage (no database server: any process that sees the run root can open the study). Optuna's
``JournalFileOpenLock`` guards each write of the journal with a lock file created ``O_EXCL``, which plants no
symlink and follows none (the run root's rule,
launcher/core/safepath.py); :func:`locked` takes a second lock of the same kind around a whole report (tell the
study, count, ask the trials owed), which Optuna's per-write lock cannot make atomic. The directory starts with a
dot, as ``.index`` does, so the run listing never takes it for a run.
"""
from __future__ import annotations

import json
import shutil
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from launcher.core.config import SearchConfig
from launcher.core.rundir import SEARCH, trial_record, trial_search, write_json_atomic
from launcher.core.run_index import ensure_sweep_dir
from launcher.train.trial import storage
from launcher.search.space import Space, from_dict, to_dict

DEFINITION = SEARCH
TRIALS_LOCK = "trials"  # the lock file is trials.lock while a report holds it
# A report holding the lock longer than this (composing and submitting the trials owed takes seconds) has died
# with it; the next reporter then takes it, rather than every trial waiting forever.
LOCK_GRACE_S = 300


@dataclass(frozen=True)
class Search:
    """What every trial of a search composes from, fixed at its launch."""

    id: str
    root: str  # the run root of its trials and of this directory
    space: Space
    settings: SearchConfig
    created_at: float
    environment: Dict[str, str]  # what every trial is composed in, as the launch was (launcher/search/start.py)

    def to_dict(self) -> Dict[str, Any]:
        return {"id": self.id, "root": self.root, "space": to_dict(self.space), "settings": asdict(self.settings),
                "created_at": self.created_at, "environment": self.environment}

    @classmethod
    def from_dict(cls, data: Dict[str, Any]) -> "Search":
        return cls(data["id"], data["root"], from_dict(data["space"]), SearchConfig(**data["settings"]),
                   data["created_at"], data["environment"])


def create(search: Search) -> Path:
    """Make the search's directory with its definition and a study holding only the points to try first (waiting);
    nothing of it is left on a failure."""
    path = ensure_sweep_dir(Path(search.root), search.id)
    try:
        write_json_atomic(path / DEFINITION, search.to_dict())
        import optuna  # lazy: keeps optuna, numpy out of start-up

        study = optuna.create_study(storage=storage(path), study_name=search.id,
                                    direction=search.settings.direction)
        for point in search.settings.enqueue:  # asked for first, in order; Optuna draws the parameters left out
            study.enqueue_trial(dict(point))
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return path


def load(path: Path) -> Search:
    return Search.from_dict(json.loads((Path(path) / DEFINITION).read_text()))


@dataclass(frozen=True)
class TrialRef:
    """Where a trial's run stands in its search: the search's directory and the trial's number."""

    path: Path
    number: int


def trial_of(run_dir: Path) -> Optional[TrialRef]:
    """The search and number of the trial whose run is in ``run_dir`` (its trial.json, written before its job could
    start); None for a run that is no trial."""
    trial = trial_record(run_dir)
    return TrialRef(trial_search(run_dir, trial), int(trial["trial"])) if trial else None


def open_study(path: Path, search: Search) -> Any:
    """The study, with a TPE sampler that lets trials in flight count (``constant_liar``), so that trials asked
    while others run are not drawn at the same point."""
    import optuna  # lazy: keeps optuna, numpy out of start-up

    sampler = optuna.samplers.TPESampler(constant_liar=True)
    return optuna.load_study(study_name=search.id, storage=storage(path), sampler=sampler)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the search's report lock: one process at a time tells, counts and asks."""
    from optuna.storages.journal import JournalFileOpenLock  # lazy: keeps optuna, numpy out of start-up

    lock = JournalFileOpenLock(str(Path(path) / TRIALS_LOCK), grace_period=LOCK_GRACE_S)
    lock.acquire()
    try:
        yield
    finally:
        lock.release()
