"""The state of a run's Slurm job, from the best source available, never guessed.

1. ``sacct`` when the cluster has accounting: it remembers every job.
2. ``squeue --states=all`` otherwise: it knows queued and running jobs, and finished ones for
   ``MinJobAge`` (300 s by default).
3. The run directory: a final metrics record, or a ``finished``/``failed``/``cancelled`` event.

A job that none of these knows is UNKNOWN, with the reason, not RUNNING, unless Slurm could not be asked and the
run's ranks were heard from: then it is what was last known, dated (``RUNNING``, "as of 12:04:31 by its own
heartbeats and metrics"), as is a state the console's shared answers kept from before Slurm stopped answering ("as of
12:04:31; Slurm not answering for 40 s"). Each source is asked once for all the jobs of a listing, directly (never
through submitit's 600 s cache), with a timeout.
"""
from __future__ import annotations

import dataclasses
import functools
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional

from launcher.core.attempt_log import SUBMITTING, AttemptLog
from launcher.core.damage import DamagedRun, read_json_object
from launcher.core.events import Cancelled, Failed, Finished, Retrying
from launcher.core.heartbeats import read_pulses, stalled_for
from launcher.core.rundir import write_json_atomic
from launcher.core.safepath import is_safe_root
from launcher.core.run_index import RunRecord
from launcher.status.pending import Queue, in_words
from launcher.status.run_files import RunFiles
from launcher.slurm.client import JobRow, Node, Slurm, SlurmError, Stale, as_of, user_name

# A run whose record cannot be read (launcher/core/damage.py): no job to ask Slurm about.
DAMAGED = "DAMAGED"
STATES = ("PENDING", "RECOVERING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "REQUEUED",
          "UNKNOWN", DAMAGED)
ACTIVE = {"PENDING", "RECOVERING", "RUNNING", "REQUEUED"}
# Final for good: TIMEOUT and PREEMPTED are not, since submitit requeues such jobs.
SETTLED = {"COMPLETED", "FAILED", "CANCELLED"}
SETTLED_FILE = "slurm_state.json"
# Short enough that a listing with one cluster down still answers within 10 s.
STATUS_TIMEOUT_S = 6

# Slurm's many job states, folded into ours (with a reason where the fold loses information).
_FOLD = {
    "CONFIGURING": ("PENDING", "configuring nodes"),
    "SUSPENDED": ("PENDING", "suspended"),
    "REQUEUE_HOLD": ("REQUEUED", "held after requeue"),
    "REQUEUE_FED": ("REQUEUED", ""),
    "RESV_DEL_HOLD": ("PENDING", "reservation deleted"),
    "COMPLETING": ("RUNNING", "completing"),
    "STAGE_OUT": ("RUNNING", "staging out"),
    "RESIZING": ("RUNNING", "resizing"),
    "SIGNALING": ("RUNNING", "signaling"),
    "STOPPED": ("RUNNING", "stopped"),
    "NODE_FAIL": ("FAILED", "node failure"),
    "BOOT_FAIL": ("FAILED", "node boot failure"),
    "OUT_OF_MEMORY": ("FAILED", "out of memory"),
    "DEADLINE": ("TIMEOUT", "deadline reached"),
    "SPECIAL_EXIT": ("FAILED", "special exit"),
    "REVOKED": ("CANCELLED", "revoked"),
}


@dataclass
class JobState:
    """What is known of one job: our state name, a reason, and where the answer came from. ``files``: what was
    read of the run's directory to tell it (None where nothing was), for the listing's other readers."""

    state: str
    reason: str = ""
    source: str = ""
    nodes: str = ""
    start: str = ""
    end: str = ""
    elapsed: str = ""
    exit_code: str = ""
    as_of: Optional[float] = None  # a last known state, not Slurm's answer now: when it was known (wall-clock)
    files: Optional[RunFiles] = field(default=None, repr=False, compare=False)

    @property
    def active(self) -> bool:
        return self.state in ACTIVE

    @property
    def ending(self) -> bool:
        """Slurm is ending it (COMPLETING, STAGE_OUT): its end is known, its processes are still being killed."""
        return self.state == "RUNNING" and self.reason in ("completing", "staging out")

    def answer(self) -> Dict[str, str]:
        """Slurm's answer as kept in ``slurm_state.json``: every field but ``files``."""
        return {name: getattr(self, name) for name in ANSWER_FIELDS}


ANSWER_FIELDS = [name for name in JobState.__dataclass_fields__ if name != "files"]


def fold(slurm_state: str, reason: str = "") -> tuple[str, str]:
    """Slurm's state (``CANCELLED by 0`` included) as one of STATES, plus a reason."""
    word = slurm_state.split()[0].rstrip("+") if slurm_state.strip() else ""
    if word in STATES:
        return word, reason
    if word in _FOLD:
        state, why = _FOLD[word]
        return state, ", ".join(r for r in (why, reason) if r)
    return "UNKNOWN", f"Slurm state {slurm_state!r}"


def _clean(reason: str) -> str:
    return "" if reason in ("None", "(null)") else reason


def job_state(row: JobRow) -> JobState:
    """A job row from sacct or squeue as our state."""
    # Slurm's reason is why a job waits: a job that ran keeps its last one (JobHeldUser of a job long released)
    waiting = row.state.split()[0].rstrip("+") in ("PENDING", "REQUEUED", "REQUEUE_HOLD") if row.state else False
    state, why = fold(row.state, _clean(row.reason) if waiting else "")
    if state == "FAILED" and row.exit_code not in ("", "0:0"):
        why = ", ".join(r for r in (why, f"exit code {row.exit_code}") if r)
    nodes = "" if row.nodes in ("None assigned", "(null)", "None") else row.nodes  # sacct's words for none yet
    return JobState(state, why, row.source, nodes, _clean_time(row.start), _clean_time(row.end), row.elapsed,
                    row.exit_code)


def _clean_time(value: str) -> str:
    return "" if value in ("Unknown", "N/A", "None") else value


def from_run_dir(run_dir: Path, files: Optional[RunFiles] = None) -> Optional[JobState]:
    """What the run itself recorded when it ended (the newest ending event wins). A rank's failure inside an
    attempt that launcher/job/recovery.py judges is not the run's end; its verdict (a final ``failed``, or a
    ``retrying``) is. ``files``: the run directory as already read, if it was."""
    files = files or RunFiles(run_dir)
    ending = files.attempts.ending()
    if ending is None:
        return None
    if isinstance(ending, Finished):
        return JobState("COMPLETED", finished_early(ending), "run directory", files=files)
    if isinstance(ending, Failed):
        return JobState("FAILED", in_a_word(ending), "run directory", files=files)
    if isinstance(ending, Cancelled):
        return JobState("CANCELLED", "stopped by the user", "run directory", files=files)
    return JobState("CANCELLED", ending.short or "stopped by the user", "run directory", files=files)


def finished_early(finished: Finished) -> str:
    """Why a run that finished ended before its last step, or "": a search trial its study pruned (it completed
    as asked: launcher/train/trial.py)."""
    return f"pruned at step {finished.step}" if finished.pruned else ""


def in_a_word(failure: Failed) -> str:
    """A ``failed`` event as `runs` shows it beside FAILED: its short words ("loss nan", "rank 2 killed"),
    else its exception's name ("FileNotFoundError"), never Slurm's bare exit code."""
    error = failure.error or ""
    head = error.split(":", 1)[0]
    return failure.short or (head if head.isidentifier() else error)


def in_its_words(state: JobState, run_dir: Path, files: Optional[RunFiles] = None,
                 jobs: Optional[Dict[str, JobState]] = None, job_id: Optional[str] = None) -> JobState:
    """Slurm's view of a job, told with what the run recorded: a pending retry is RECOVERING, and so is a failed
    attempt until its retry or verdict is recorded (:func:`recovering`) or once recorded (:func:`retried`); a
    failure carries its cause ("rank 2 killed", "OSError") instead of an exit code, even when the attempt's end was
    never judged (its batch script died before it could be). ``files``: the run directory as already read, if it
    was; the answer carries it. ``jobs``: what Slurm said of the listing's jobs and of this user's others alive in
    the queue, by job id. ``job_id``: the job Slurm's state is of, as the run's record named it."""
    files = files or RunFiles(run_dir)
    state = dataclasses.replace(state, files=files)
    attempts = files.attempts
    waiting = retried(state, attempts, job_id) or recovering(state, attempts, jobs or {})
    if waiting is not None:
        return waiting
    last = attempts.standing()
    if state.state == "PENDING" and isinstance(last, Retrying):
        ended = attempts.last_ended()
        number = (ended.attempt or 0) + 1 if ended else 1
        why = f"attempt {number} after {(ended and ended.short) or 'a failure'}"
        return dataclasses.replace(state, state="RECOVERING", reason=", ".join(r for r in (why, state.reason) if r))
    if state.state == "FAILED" and isinstance(last, Failed):  # the verdict, or a rank's own if none came
        return dataclasses.replace(state, reason=in_a_word(last))
    if state.state == "FAILED" and state.exit_code.split(":")[0] in NOT_EXECUTED:
        # The shell or slurmstepd could not run the tasks' Python: no step of the launcher's ran to record why.
        said = cannot_execute(run_dir)
        return dataclasses.replace(state, reason=f"{state.reason}: {said}" if said else state.reason)
    if state.state == "COMPLETED" and isinstance(last, Finished) and finished_early(last):
        return dataclasses.replace(state, reason=finished_early(last))
    stopped = attempts.stopped()
    if state.state in ("COMPLETED", "CANCELLED") and stopped is not None:
        # A stop its ranks saved for ends the job itself (COMPLETED in Slurm); the run was stopped all the same.
        return dataclasses.replace(state, state="CANCELLED", reason=stopped.short or state.reason)
    if state.state in ("RUNNING", "PENDING") and attempts.ended_complete():
        # The run recorded its end, but the controller lost track of it (a crash that cost it its latest state).
        return dataclasses.replace(state, state="COMPLETED", reason="the run ended; Slurm still lists its job")
    if state.state == "RUNNING":
        step_time = files.last_metrics.step_time if files.last_metrics else None
        idle = stalled_for(run_dir, _stall_limit(run_dir), step_time, time.time())
        if idle is not None:
            return dataclasses.replace(state, reason=f"stalled? no step for {idle:.0f} s")
    return state


def retried(state: JobState, attempts: AttemptLog, job_id: Optional[str]) -> Optional[JobState]:
    """RECOVERING where Slurm's state is of a job the run has retried already (None otherwise): the record read
    before the retry's submission rewrote it, the events after, so Slurm was asked about the failed job, not the
    retry's."""
    newest = attempts.newest(*SUBMITTING)
    if job_id is None or not isinstance(newest, Retrying) or newest.job_id in (None, job_id):
        return None
    ended = attempts.last_ended()
    why = f"attempt {(newest.attempt or 0) + 1} submitted as job {newest.job_id} after " \
          f"{(ended and ended.short) or 'a failure'} (job {job_id})"
    return dataclasses.replace(state, state="RECOVERING", reason=why)


def recovering(state: JobState, attempts: AttemptLog, jobs: Dict[str, JobState]) -> Optional[JobState]:
    """The run between a failed attempt and its retry, as RECOVERING (None otherwise): its job still running while
    its end step decides (the attempt's end recorded, neither its retry nor a verdict yet), or ended while the job
    that watches it (launcher/job/recovery.py ``watch``) is alive in the queue (``jobs``: Slurm's states by job id)
    to judge an attempt whose batch step died first."""
    ended = attempts.awaiting_retry()
    if state.state in ("RUNNING", "PENDING") and ended is not None:
        why = f"attempt {ended.attempt or '?'} ended ({ended.short or ended.outcome}); its retry is being decided"
        return dataclasses.replace(state, state="RECOVERING", reason=why)
    judged = attempts.unjudged() or ended
    watching = attempts.watching() if state.state == "FAILED" and judged is not None else None
    watcher = watching.watcher if watching is not None else None
    if watcher is None or watcher not in jobs or not jobs[watcher].active:
        return None
    why = f"job {judged.job_id} ended ({state.reason or 'failed'}) before its retry; job {watcher} judges attempt " \
          f"{judged.attempt or '?'}"
    return dataclasses.replace(state, state="RECOVERING", reason=why)


# A shell's and slurmstepd's exit statuses for a command it could not execute (126) or find (127).
NOT_EXECUTED = ("126", "127")
# How they say which, in the job's output: ``slurmstepd: error: execve(): /x/python: Permission denied``, and
# ``.../slurm_script: line 20: /x/python: Permission denied`` (or ``No such file or directory``, ``not found``).
_EXEC_FAILURE = re.compile(r"execve\(\): (?P<execve>.+)|: line \d+: (?P<shell>.+: (?:Permission denied|No such file or "
                           r"directory|command not found|cannot execute.*))$")


def cannot_execute(run_dir: Path) -> Optional[str]:
    """What the job's output says could not be executed (the newest such line of its submitit logs), or None."""
    logs = sorted((run_dir / "submitit").glob("*_log.*"), key=lambda p: p.stat().st_mtime, reverse=True)
    for path in logs:
        try:
            lines = path.read_text(errors="replace").splitlines()[-200:]
        except OSError:
            continue
        for line in reversed(lines):
            match = _EXEC_FAILURE.search(line.strip())
            if match:
                return f"cannot execute {match['execve'] or match['shell']}"
    return None


def _stall_limit(run_dir: Path) -> Optional[float]:
    """``train.stall_timeout_s`` of the run (read with PyYAML: a listing must not pay for OmegaConf)."""
    import yaml  # lazy: keeps yaml out of start-up

    try:
        limit = (yaml.safe_load((run_dir / "config.yaml").read_text()) or {}).get("train", {}).get("stall_timeout_s")
    except (OSError, yaml.YAMLError, AttributeError):
        return None
    return float(limit) if isinstance(limit, (int, float)) else None


def job_states(records: Iterable[RunRecord]) -> Dict[str, JobState]:
    """The state of every record's job, keyed by run name, asking each cluster once per source.

    A job Slurm has reported COMPLETED, FAILED or CANCELLED is not asked about in accounting again: that
    answer is kept in the run directory (``slurm_state.json``), so listings stay fast and ``runs --watch``
    does not poll accounting for history. Only the queue, which is cheap, is still asked: a job requeued
    by hand (``scontrol requeue``) lives again under the same id, and then the kept answer is dropped.

    Each state carries what was read of its run's directory to tell it (``JobState.files``), so that the
    listing's other readers read no file twice.
    """
    result: Dict[str, JobState] = {}
    by_conf: Dict[Optional[str], List[RunRecord]] = {}
    settled_by_conf: Dict[Optional[str], List[RunRecord]] = {}
    files: Dict[str, RunFiles] = {}
    for rec in records:
        files[rec.name] = RunFiles(rec.run_dir)
        settled = settled_state(rec, files[rec.name])
        if settled is not None:
            result[rec.name] = settled
            settled_by_conf.setdefault(rec.slurm_conf, []).append(rec)
        else:
            by_conf.setdefault(rec.slurm_conf, []).append(rec)
    answers: Dict[Optional[str], Dict[str, JobState]] = {}

    def ask(conf: Optional[str]) -> None:
        slurm = Slurm(conf, timeout=STATUS_TIMEOUT_S)
        answers[conf] = _states_on_cluster(slurm, files, by_conf.get(conf, []), settled_by_conf.get(conf, []))

    _in_threads(ask, list({**by_conf, **settled_by_conf}))
    for conf, states in answers.items():
        for rec in by_conf.get(conf, []) + settled_by_conf.get(conf, []):
            if rec.name not in states:
                continue
            if states[rec.name].state in SETTLED and states[rec.name].source in ("sacct", "squeue"):
                if states[rec.name].as_of is None:  # Slurm's answer now, not a last known one with its date
                    _keep(rec, states[rec.name])
            elif rec.name in result:  # kept as settled, but the queue has it alive again
                (Path(rec.run_dir) / SETTLED_FILE).unlink(missing_ok=True)
        result.update(states)
    return result


def _keep(rec: RunRecord, state: JobState) -> None:
    """Cache the settled state in the run directory, where no other user could have swapped that directory
    for a symlink (a status command reads any root, but writes only into a safe one: launcher/core/safepath.py)."""
    if not is_safe_root(Path(rec.run_dir).parent):
        return
    try:
        write_json_atomic(Path(rec.run_dir) / SETTLED_FILE, {"job_id": rec.job_id, **state.answer()})
    except OSError:  # someone else's run directory, or removed meanwhile: just not cached
        pass


def settled_state(rec: RunRecord, files: Optional[RunFiles] = None) -> Optional[JobState]:
    """The final state Slurm reported for this run's job earlier, if any (carrying ``files``)."""
    try:
        data = read_json_object(rec.run_dir, SETTLED_FILE)
    except DamagedRun:  # none kept yet, or a damaged one: Slurm is asked again
        return None
    if data.pop("job_id", None) != rec.job_id:
        return None
    return JobState(**{k: v for k, v in data.items() if k in ANSWER_FIELDS}, files=files)


def _in_threads(fn: Callable[[Any], None], items: List[Any]) -> None:
    """``fn(item)`` for every item at once (Slurm's answers are the slow part of a listing)."""
    threads = [threading.Thread(target=fn, args=(item,)) for item in items]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def _ask_slurm(slurm: Slurm, job_ids: List[str], queued_ids: List[str] = ()) -> tuple[Dict[str, JobState], List[str]]:
    """Ask sacct about ``job_ids`` and squeue about them and ``queued_ids`` at the same time. Where both know a job,
    sacct wins once it has the job ended (the queue keeps a job COMPLETING while its processes are killed) and the
    queue while accounting still has it alive (accounting learns of a start, or of a requeue, seconds after the
    queue: a job just started still reads PENDING there); squeue covers a job accounting has not seen yet or a
    cluster without accounting. The states also hold this user's other jobs alive in the queue: a job that watches a
    run's job to judge its attempt (launcher/job/recovery.py ``watch``) tells a failed attempt waiting for it."""
    answers: Dict[str, List[JobRow]] = {}
    failures: List[str] = []
    sources = {"squeue": slurm.squeue, **({"sacct": lambda: slurm.sacct(job_ids)} if job_ids else {})}

    def ask(name: str) -> None:
        try:
            answers[name] = sources[name]()
        except SlurmError as err:
            failures.append(str(err))

    wanted = set(job_ids) | set(queued_ids)
    if not wanted:
        return {}, []
    _in_threads(ask, list(sources))
    queued = {row.job_id: job_state(row) for row in answers.get("squeue", []) if row.job_id in wanted}
    accounted = {row.job_id: job_state(row) for row in answers.get("sacct", []) if row.job_id in wanted}
    states = {**queued, **{job: state for job, state in accounted.items() if not (state.active and job in queued)}}
    queue = Queue(answers.get("squeue", []), nodes=_once(slurm))
    for row in queue.rows:  # a waiting job's reason in words, from the queue's row (sacct's has no user or GPUs)
        if row.job_id in wanted and states[row.job_id].state == "PENDING":
            states[row.job_id] = dataclasses.replace(states[row.job_id], reason=in_words(row, queue))
    me = user_name()
    mine = {row.job_id: job_state(row) for row in queue.rows if row.user == me and row.job_id not in states}
    return {**states, **{job: state for job, state in mine.items() if state.active}}, failures


def _once(slurm: Slurm) -> Callable[[], Optional[List[Node]]]:
    """The cluster's nodes (one sinfo) the first time a waiting job's reason needs them, and None if Slurm does not
    answer: the reason is then told without them."""
    @functools.cache
    def nodes() -> Optional[List[Node]]:
        try:
            return slurm.nodes(timeout=STATUS_TIMEOUT_S)
        except SlurmError:
            return None
    return nodes


def _states_on_cluster(slurm: Slurm, files: Dict[str, RunFiles], records: List[RunRecord],
                       settled: List[RunRecord] = ()) -> Dict[str, JobState]:
    """The states of ``records``, and of those ``settled`` records whose job the queue has alive again
    (``files``: each run's directory, by run name); a state from answers kept from before Slurm stopped answering
    is dated (:func:`dated`)."""
    down = slurm.unreachable()  # a cluster that is down says so at once; sacct and squeue would wait
    if down:
        return _unknown_or_recorded(records, files, [down, down])
    known, failures = _ask_slurm(slurm, [rec.job_id for rec in records if rec.job_id],
                                 [rec.job_id for rec in settled if rec.job_id])
    # A settled job still in the queue is alive again (requeued by hand) unless Slurm is only ending it: a job
    # sacct has FAILED stays COMPLETING in squeue while its processes are killed (seconds, longer under load).
    states = {rec.name: in_its_words(known[rec.job_id], Path(rec.run_dir), files[rec.name], known, rec.job_id)
              for rec in settled if rec.job_id in known and known[rec.job_id].active and not known[rec.job_id].ending}
    return dated({**_unknown_or_recorded(records, files, failures, known), **states}, slurm.stale)


def dated(states: Dict[str, JobState], stale: Optional[Stale]) -> Dict[str, JobState]:
    """``states``, where Slurm's answers were last known ones (``stale``), each of Slurm's said as of when."""
    if stale is None:
        return states
    now = time.time()
    return {name: dataclasses.replace(state, as_of=stale.as_of, reason="; ".join(filter(None, [
        state.reason, stale.words(now)]))) if state.source in ("sacct", "squeue") else state
        for name, state in states.items()}


def _unknown_or_recorded(records: List[RunRecord], files: Dict[str, RunFiles], failures: List[str],
                         known: Optional[Dict[str, JobState]] = None) -> Dict[str, JobState]:
    known = known or {}
    states: Dict[str, JobState] = {}
    for rec in records:
        state = known.get(rec.job_id or "")
        run_dir, read = Path(rec.run_dir), files[rec.name]
        state = in_its_words(state, run_dir, read, known, rec.job_id) if state else from_run_dir(run_dir, read)
        if state is None:
            if len(failures) == 2:  # neither sacct nor squeue answered
                why = f"Slurm could not be reached on cluster {rec.cluster} ({failures[-1]})"
                state = last_heard(run_dir, read, why)
            else:
                why = f"Slurm no longer knows job {rec.job_id}"
                why += f" ({'; '.join(failures)})" if failures else " (not in accounting or the queue)"
        states[rec.name] = state or JobState("UNKNOWN", why + "; the run left no final record", "none", files=read)
    return states


def last_heard(run_dir: Path, files: RunFiles, why: str) -> Optional[JobState]:
    """What the run's current attempt last said of itself where Slurm could not be asked (``why``): RUNNING as of its
    ranks' newest heartbeat or metrics row; None when its current attempt left neither."""
    attempt = files.attempts.unjudged()
    if attempt is None:
        return None
    row = files.last_metrics
    heard = [pulse.alive for pulse in read_pulses(run_dir, since=attempt.time)]
    heard += [row.time] if row is not None and row.time is not None and row.time >= attempt.time else []
    if not heard:
        return None
    return JobState("RUNNING", f"{as_of(max(heard))} by its own heartbeats and metrics; {why}", "heartbeats",
                    as_of=max(heard), files=files)
