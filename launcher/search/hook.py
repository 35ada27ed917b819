"""A trial's last step: when its run's outcome is final, tell the study and submit the trials now owed.

launcher/job/recovery.py's ``end`` runs in the batch script on the host after srun and decides what the attempt
was; it calls :func:`trial_ended` afterwards for every run. For a run that is no trial (no trial.json) it costs
one stat. A trial retried or requeued by the fault loop is not over: only a final outcome is reported, so a
trial is one trial however many attempts it took.

There the code is the trial's frozen copy (launcher/submit/freeze.py, first on the job's PYTHONPATH): the next
trials freeze that same code again, recorded as coming from where the first trial's came (:func:`adopt_frozen_source`).
"""
from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import List, Optional

from launcher.core.attempt_log import AttemptLog
from launcher.core.events import Event, Failed, Finished, Outcome, SearchFailed, TrialReported
from launcher.core.rundir import TRIAL
from launcher.core.rundir import CODE_DIFF, SOURCE_ROOT, append_event, code_dir, code_source, read_events, read_metrics


def final_outcome(events: List[Event]) -> Optional[str]:
    """``COMPLETED``, ``PRUNED at step N``, or why the run failed or was stopped, when its current attempt ended
    it; None while it may go on (a retry or requeue is on its way)."""
    from launcher.search.trials import PRUNED  # lazy: keeps omegaconf out of start-up

    log = AttemptLog(events)
    verdict = log.verdict()
    if verdict is None:
        return None
    if isinstance(verdict, Failed):
        return f"failed: {verdict.error or verdict.short or 'no cause recorded'}"
    if verdict.outcome == Outcome.COMPLETED:
        pruned = [e for e in log.this_attempt()[1] if isinstance(e, Finished) and e.pruned]
        return f"{PRUNED} at step {pruned[-1].step}" if pruned else "COMPLETED"
    return "stopped: its job was cancelled"


def trial_ended(run_dir: Path) -> None:
    """Report the trial in ``run_dir`` if its run has ended for good, and submit the trials owed. Never raises:
    a fault here is printed to the batch log and recorded as the run's ``search_failed`` event, and leaves the
    run's own outcome as it is."""
    run_dir = Path(run_dir)
    if not (run_dir / TRIAL).exists():
        return

    try:
        outcome = final_outcome(read_events(run_dir))
        if outcome is None:
            return
        from launcher.search.study import load, trial_of  # lazy: keeps omegaconf out of start-up
        from launcher.search.submission import submit_trial  # lazy: keeps omegaconf out of start-up
        from launcher.search.trials import report, result_of  # lazy: keeps omegaconf out of start-up

        trial = trial_of(run_dir)
        result = result_of(read_metrics(run_dir), load(trial.path).settings.metric, outcome)
        adopt_frozen_source(run_dir)
        submitted = report(trial.path, trial.number, result, submit_trial)
        append_event(run_dir, TrialReported(value=result.value, cause=result.cause, submitted=submitted))
    except Exception as err:  # noqa: BLE001 (the run's outcome stands; the search's fault is recorded beside it)
        traceback.print_exc()
        first = (str(err).strip().splitlines() or [""])[0]
        print(f"launcher.search.hook: reporting the trial failed: {type(err).__name__}: {first}", file=sys.stderr)
        try:
            append_event(run_dir, SearchFailed(error=f"{type(err).__name__}: {first}"))
        except OSError:
            pass


def adopt_frozen_source(run_dir: Path) -> None:
    """Freeze the next trials' code as coming from where this run's frozen code came (its commit, changes and
    diff), not from the copy they are frozen from, which is outside git."""
    from launcher.submit.freeze import adopt_source  # lazy: keeps launcher.submit out of start-up
    from launcher.submit.git import TreeState  # lazy: keeps launcher.submit, launcher.submit.git out of start-up

    source = code_source(run_dir)
    if source is None or Path(SOURCE_ROOT).resolve() != code_dir(run_dir).resolve():
        return  # not running from the run's frozen copy: the code's own checkout answers for itself
    diff = code_dir(run_dir) / CODE_DIFF
    state = TreeState(source.get("commit"), list(source.get("changed") or []),
                      diff.read_text() if diff.exists() else "")
    adopt_source(state, source.get("source") or str(SOURCE_ROOT))
