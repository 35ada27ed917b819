"""A search trial as its training sees it: each evaluation told to the trial's Optuna study, and the study's
pruner asked whether the trial is worth going on with (``search.pruner=median``, docs/search.md).

The study is Optuna's journal file in the sweep's directory, which launcher/search/study.py makes; its storage is
opened here (:func:`storage`), the one place both share, since training may import only launcher/core. Only the
main rank speaks to the study; the loop shares its word with every rank (launcher/train/loop.py). Nothing here
imports torch, and a study that cannot be read or written costs the trial its pruning, never its training.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from launcher.core.metrics import Row
from launcher.core.rundir import trial_record, trial_search

log = logging.getLogger(__name__)

JOURNAL = "journal.log"  # in the sweep's directory: the study, in Optuna's journal file storage


def storage(path: Path) -> Any:
    """Optuna's journal file storage of the study in ``path``, locked without symlinks (a lock file created
    ``O_EXCL``: it plants none and follows none, the run root's rule)."""
    import optuna  # lazy: keeps optuna, numpy out of start-up
    from optuna.storages import JournalStorage  # lazy: keeps optuna, numpy out of start-up
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock  # lazy: keeps optuna out of start-up

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # the launch's output and the batch log are the run's
    journal = str(Path(path) / JOURNAL)
    return JournalStorage(JournalFileBackend(journal, lock_obj=JournalFileOpenLock(journal)))


@dataclass
class Pruning:
    """The open study of a trial that may be pruned: ``metric`` is told at each evaluation's step; a trial
    numbered below ``startup`` is never pruned."""

    trial: Any  # optuna.trial.Trial; None on the other ranks
    number: int
    metric: str
    startup: int

    @classmethod
    def of(cls, run_dir: Path, main: bool) -> Optional["Pruning"]:
        """The pruning of the trial in ``run_dir`` (on the main rank; elsewhere a stand-in that never tells the
        study), or None when there is none to do: no trial, a search without a pruner, or a study that cannot be
        opened (logged; the trial trains on unpruned). Every rank gets the same kind of answer, so that every
        rank joins the loop's broadcast of the study's word, or none does."""
        trial = trial_record(run_dir) or {}
        prune = trial.get("prune")
        if not prune:
            return None
        number, metric, startup = int(trial["trial"]), prune["metric"], int(prune["startup_trials"])
        if not main:
            return cls(None, number, metric, startup)
        try:
            import optuna  # lazy: keeps optuna, numpy out of start-up

            pruner = optuna.pruners.MedianPruner(n_startup_trials=startup, n_warmup_steps=0)
            study = optuna.load_study(study_name=trial["search"], pruner=pruner,
                                      storage=storage(trial_search(run_dir, trial)))
            frozen = study.get_trials(deepcopy=False)[number]
            return cls(optuna.trial.Trial(study, frozen._trial_id), number, metric, startup)
        except Exception as err:  # noqa: BLE001 (pruning is an optimisation of the search, not the run)
            log.warning("this trial is not pruned: its study could not be opened (%s: %s)", type(err).__name__, err)
            return cls(None, number, metric, startup)

    def pruned(self, step: int, row: Row) -> bool:
        """Tell the study this evaluation's metric at ``step`` (from its metrics row); whether its pruner says
        to stop here."""
        value = row.value(self.metric)
        if self.trial is None or not isinstance(value, (int, float)) or isinstance(value, bool) or value != value:
            return False
        try:
            self.trial.report(float(value), step)
            return self.number >= self.startup and bool(self.trial.should_prune())
        except Exception as err:  # noqa: BLE001
            log.warning("step %d was not told to the study (%s: %s)", step, type(err).__name__, err)
            return False
