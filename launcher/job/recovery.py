"""Inside each Slurm job, around the ranks: record the attempt, and when it fails, find why and go on.

The batch script the launcher submits runs (launcher/slurm/batch.py)::

    python -m launcher.job.recovery begin RUN_DIR          # before srun
    srun --kill-on-bad-exit=1 ... (the ranks)
    python -m launcher.job.recovery end RUN_DIR $?         # after srun, with its exit status

``begin`` records an ``attempt`` event (its number, job id, nodes). ``end`` weighs the attempt's evidence
(:class:`Evidence`: its events, srun's report, its heartbeats, and a probe of its nodes, which finds a dead node
before Slurm marks it down) into a cause (launcher/job/attempts.py) and records ``attempt_ended``. When the
ranks saved on Slurm's time-limit or preemption signal, it requeues the job (launcher/job/requeue.py). For a
failed or stalled attempt it then decides (launcher/job/policy.py, pure: this module gathers its inputs and acts
on its decision): retry from the newest good checkpoint as a new Slurm job that excludes the nodes to blame, up
to ``cluster.max_retries`` (a node's own fault costs none), with exclusions allowed again where they would leave
too few nodes; or give up with the cause, when the failure is the code's own (before the first step of the first
attempt, or the same error at the same step in two attempts that trained) or the retries are spent. A retry that
cannot be submitted is the run's final cause. A run that completed keeps its forecast beside what it measured in
its run root (launcher/core/measured.py), for ``launcher plan`` to learn from. What it asks Slurm is asked in
launcher/slurm/probes.py. The run's record is read through launcher/core/attempt_log.py. Everything happens in
Slurm and the run directory: no process outside the job. Retrying with a new job rather than ``scontrol requeue``
is what lets it exclude a node: Slurm accepts ``ExcNodeList`` only for a pending job, and a requeued job stays
running until this script ends. The design is in docs/recovery.md.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional

from launcher.core.attempt_log import AttemptLog
from launcher.core.measured import record_completed
from launcher.core.heartbeats import Pulse, read_pulses, sweep_local
from launcher.core.events import (EXIT_NOT_OURS, Attempt, AttemptEnded, Cancelled, DuplicateJob, Event, Failed, Fault,
                                   Finished, Outcome, Requeued, Resumed, Retrying, Stalled)
from launcher.core.rundir import EVENTS, append_event, last_step, names_this_job, read_events, read_metrics
from launcher.core.run_index import mend_record
from launcher.job import claim, endings
from launcher.job.attempts import Cause, attribute
from launcher.job.policy import COMPLETED, Decision, decide, schedulable
from launcher.job.requeue import REQUEUED_STATES, requeue, requeue_asked, requeue_cause
from launcher.search.hook import trial_ended
from launcher.slurm import probes
from launcher.slurm.output import srun_lost_nodes, srun_task_ends


@dataclass(frozen=True)
class Settled:
    """An attempt's end that needed no judgement (:func:`without_failure`) and what, if anything, follows it."""

    decision: Optional[Decision] = None


@dataclass(frozen=True)
class Evidence:
    """What an ending attempt left: srun's stderr, its ranks' heartbeats (since it began), its lost nodes, and the
    last step it logged (metrics.jsonl's rows since it began: a heartbeat may be a few steps behind)."""

    stderr: str
    pulses: List[Pulse]
    lost: List[str]
    logged: Optional[int] = None

    @classmethod
    def of(cls, run_dir: Path, attempt: Optional[Attempt], job_id: str) -> "Evidence":
        stderr = ""
        log = batch_log(run_dir, job_id)
        if log.exists():
            with open(log, errors="replace") as f:
                f.seek(attempt.log_offset if attempt else 0)
                stderr = f.read()
        lost = srun_lost_nodes(stderr)
        if attempt and attempt.nodes:
            lost += [node for node in probes.unanswering(job_id, attempt.nodes) if node not in lost]
        since = attempt.time if attempt else 0.0
        logged = max((row.step for row in read_metrics(run_dir) if (row.time or 0) >= since), default=None)
        return cls(stderr, read_pulses(run_dir, since=attempt.time if attempt else None), lost, logged)


def trained(since: List[Event], pulses: List[Pulse]) -> bool:
    """Whether this attempt trained a step: a rank got past the step it started from (a ``resumed`` checkpoint's,
    else 0), by its heartbeat or the step its failure was recorded at."""
    start = next((e.step or 0 for e in since if isinstance(e, Resumed)), 0)
    reached = [p.step for p in pulses] + [e.step for e in since if isinstance(e, (Failed, Stalled))
                                           and isinstance(e.step, int)]
    return max(reached, default=start) > start


def batch_log(run_dir: Path, job_id: str) -> Path:
    """The batch script's stderr, where srun reports the tasks that ended badly (submitit's naming: a job array's
    element ``123_4`` has ``123_4_0_log.err``, whatever its own job id; launcher/slurm/batch.py array_script)."""
    element = [os.environ.get(name) for name in ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")]
    return Path(run_dir) / "submitit" / f"{'_'.join(element) if all(element) else job_id}_0_log.err"


def begin(run_dir: Path) -> Attempt:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    log = AttemptLog(read_events(run_dir))
    previous, since = log.unjudged(), log.this_attempt()[1]
    if previous:
        # Its batch script was ended before it could judge: by a requeue, or with its node.
        requeued = next((e for e in reversed(since) if isinstance(e, Requeued)), None)
        if requeued is not None:
            append_event(run_dir, AttemptEnded(attempt=previous.attempt, job_id=previous.job_id, step=requeued.step,
                                               outcome=Outcome.REQUEUED, short="requeued",
                                               cause=requeue_cause(requeued)))
        else:
            append_event(run_dir, unjudged(run_dir, previous, since))
    number = 1 + log.count
    stderr = batch_log(run_dir, job_id)
    attempt = Attempt(attempt=number, job_id=job_id, nodes=os.environ.get("SLURM_JOB_NODELIST"),
                      restart=int(os.environ.get("SLURM_RESTART_COUNT", 0)),
                      log_offset=stderr.stat().st_size if stderr.exists() else 0)
    append_event(run_dir, attempt)
    return attempt


def unjudged(run_dir: Path, attempt: Attempt, since: List[Event]) -> AttemptEnded:
    """The ``attempt_ended`` fields of an attempt whose batch script never judged it (``since``: its events):
    because Slurm requeued the job itself, LOST when one of its nodes stopped responding (NODE_FAIL; the nodes to
    blame are those Slurm now holds down, and the requeued job runs without them), else REQUEUED from outside the
    run, at the step its ranks saved on Slurm's SIGTERM if they did (launcher/job/endings.py); an attempt of
    another job (its batch step died unwatched) FAILED, cause unknown."""
    nodes = probes.held_down(attempt.nodes)
    pulses = read_pulses(run_dir, since=attempt.time)
    step = max([last_step(Path(run_dir)) or 0, *(p.step for p in pulses)])
    if not names_this_job(run_dir, attempt.job_id, attempt.cluster):  # another job: it ended, nobody requeued it
        return AttemptEnded(attempt=attempt.attempt, job_id=attempt.job_id, step=step, outcome=Outcome.FAILED,
                            fault=Fault.UNKNOWN, short="not judged", cause=f"job {attempt.job_id} ended at step "
                            f"{step} without judging its attempt (its batch step died, and no watcher judged it)")
    if not nodes:
        step, cause = endings.requeued_from_outside(run_dir, since, step)
        return AttemptEnded(attempt=attempt.attempt, job_id=attempt.job_id, step=step,
                            outcome=Outcome.REQUEUED, short="requeued", cause=cause)
    return AttemptEnded(attempt=attempt.attempt, job_id=attempt.job_id, step=step, outcome=Outcome.LOST,
                        node=nodes[0], exclude=nodes, short=f"{nodes[0]} lost",
                        cause=f"node {', '.join(nodes)} lost at step {step}: Slurm holds it down and requeued the job")


def end(run_dir: Path, exit_code: int) -> Optional[Decision]:
    """Record how the attempt ended; requeue it, retry it or give up. Returns the decision (None: nothing to
    decide). A damaged run.json is written whole again first (launcher/core/run_index.py)."""
    mend_record(run_dir)
    events = read_events(run_dir)
    attempt, since = AttemptLog(events).this_attempt()
    job_id = os.environ.get("SLURM_JOB_ID", "")
    queued = None
    asked = requeue_asked(since)
    if asked is not None:
        queued = probes.queue_state(job_id)
        if not queued.startswith("CANCELLED") and queued not in REQUEUED_STATES:
            if requeue(run_dir, job_id, asked, events) is None:
                append_event(run_dir, AttemptEnded(attempt=attempt.attempt if attempt else None, job_id=job_id,
                                                   outcome=Outcome.REQUEUED, step=asked, short="requeued",
                                                   cause=requeue_cause(Requeued(step=asked, by="signal"))))
                return None
            events = read_events(run_dir)  # with the failure just recorded, judged below
            attempt, since = AttemptLog(events).this_attempt()
    number = attempt.attempt if attempt else None
    settled = without_failure(run_dir, since, number, job_id, exit_code, queued)
    if settled is not None:
        return settled.decision
    evidence = Evidence.of(Path(run_dir), attempt, job_id)
    if evidence.lost and probes.queue_state(job_id) in REQUEUED_STATES:  # Slurm marked it down while it was probed
        return None
    cause = attribute(since, srun_task_ends(evidence.stderr), evidence.pulses, exit_code, evidence.lost,
                      logged=evidence.logged)
    began = trained(since, evidence.pulses)
    during_start = not began and cause.outcome not in (Outcome.LOST, Outcome.PREFLIGHT)
    text = f"failed during start-up: {cause.text}" if during_start else cause.text
    room = Room.of(Path(run_dir)) if cause.fault is Fault.DISK_FULL else None
    if cause.fault is Fault.DISK_FULL:
        text = f"disk full: {text}" + (f"; at the attempt's end {room.words}" if room else "")
    append_event(run_dir, AttemptEnded(attempt=number, job_id=job_id, outcome=cause.outcome, cause=text,
                                       short=cause.short, fault=cause.fault, exception=cause.exception,
                                       rank=cause.rank, node=cause.node, step=cause.step,
                                       exit_code=exit_code, trained=began,
                                       nodes=list(cause.nodes) if cause.nodes else None))
    return respond(Path(run_dir), events, attempt, cause, text, began, job_id, claim.this_job(), room)


@dataclass(frozen=True)
class Room:
    """The free space of a run's directory beside what one checkpoint of the run needs (launcher/core/checkpoints.py,
    the rule preflight and ``launcher plan`` use): whether a retry after a full disk could save."""

    free: int
    need: int
    words: str  # "RUN_DIR had 1.2 MB free; a checkpoint needs about 10.5 MB"

    @property
    def enough(self) -> bool:
        return self.free >= self.need

    @classmethod
    def of(cls, run_dir: Path) -> Optional["Room"]:
        """The run directory's room now; None where it cannot be measured."""
        from launcher.core.checkpoints import checkpoint_bytes, human  # lazy: keeps omegaconf out of start-up
        from launcher.core.config import load_run_config  # lazy: keeps omegaconf out of start-up
        from launcher.core.plan import read_plan  # lazy: keeps omegaconf out of start-up

        try:
            cfg, plan = load_run_config(run_dir / "config.yaml"), read_plan(run_dir)
            free = shutil.disk_usage(run_dir).free
        except (OSError, ValueError):
            return None
        need = checkpoint_bytes(cfg.model, plan.params, plan.world_size)
        return cls(free, need, f"{run_dir} had {human(free)} free; a checkpoint needs about {human(need)}")


def without_failure(run_dir: Path, since: List[Event], number: Optional[int], job_id: str, exit_code: int,
                    queued: Optional[str]) -> Optional[Settled]:
    """Record the end of an attempt that did not fail: the run's verdict already given by the ranks, the run
    finished, requeued or cancelled, or Slurm requeued the job itself: then what follows (:class:`Settled`);
    None for a failure, to be judged. ``queued``: Slurm's state of the job, if asked."""
    kinds = {type(e) for e in since}
    if Requeued in kinds and isinstance([e for e in since if isinstance(e, (Requeued, Failed))][-1], Failed):
        kinds.discard(Requeued)  # the signal was heard but Slurm could not requeue: judged as a failure
    verdict = next((e for e in since if isinstance(e, Failed) and e.final), None)
    if verdict:  # the ranks already ended the run (a requeue budget spent): nothing to decide
        append_event(run_dir, AttemptEnded(attempt=number, job_id=job_id, outcome=Outcome.FAILED, fault=verdict.fault,
                                           cause=verdict.error, short=verdict.short, step=verdict.step))
        return Settled()
    if Finished in kinds:  # the final checkpoint is whole: what a rank did after it does not matter
        append_event(run_dir, AttemptEnded(
            attempt=number, job_id=job_id, outcome=Outcome.COMPLETED, exit_code=exit_code or None,
            note=f"a rank ended badly after the run finished (srun {exit_code})" if exit_code else None))
        return Settled(COMPLETED)
    queued = probes.queue_state(job_id) if queued is None else queued
    if queued.startswith("CANCELLED"):  # by the user or an administrator (`launcher stop` records it too)
        kinds.add(Cancelled)
    if endings.stop_asked(since):  # the user asked it to stop: whatever its ranks did, never requeued nor retried
        kinds.add(Cancelled)
        kinds.discard(Requeued)
    if Requeued in kinds:  # preemption or time limit: not a failure
        append_event(run_dir, AttemptEnded(attempt=number, job_id=job_id, outcome=Outcome.REQUEUED))
        return Settled()
    if Cancelled in kinds:  # what the ranks saved first, if they did (launcher/job/endings.py)
        append_event(run_dir, endings.cancelled(run_dir, since, number, job_id))
        return Settled()
    # Slurm requeued the job itself (its node was lost) while this batch script lived on: the next attempt
    # records this one (unjudged()), and a retry from here would run the run twice.
    return Settled() if queued in REQUEUED_STATES else None


def respond(run_dir: Path, events: List[Event], attempt: Optional[Attempt], cause: Cause, text: str,
            began: bool, job_id: str, holder: Optional[str], room: Optional[Room] = None) -> Decision:
    """Retry the failed attempt as a new job without the nodes to blame, or give the run's verdict (a ``failed``
    event that is ``final``); ``text`` is the cause as recorded, ``began`` whether the attempt trained a step,
    ``job_id`` its job's, ``holder`` that job as the run's claim names it (an array's element: ``123_4``), ``room``
    the run directory's free space after a full disk."""
    from launcher.core.config import load_run_config  # lazy: keeps omegaconf out of start-up
    from launcher.core.plan import read_plan  # lazy: keeps omegaconf out of start-up
    from launcher.job.submission import RetryRefused, submit_retry, watch  # lazy: keeps omegaconf out of start-up

    number = attempt.attempt if attempt else None
    cfg = load_run_config(run_dir / "config.yaml")
    held = probes.held_down(attempt.nodes if attempt else None)
    progressed = began or (last_step(run_dir) or 0) > 0
    decision = decide(events, cause, cfg.cluster.max_retries, held, progressed=progressed, trained=began,
                      room=room.enough if room else None)
    if not decision.retry:
        append_event(run_dir, Failed(final=True, job_id=job_id, error=text, short=cause.short, fault=cause.fault,
                                     exception=cause.exception, rank=cause.rank, node=cause.node, step=cause.step,
                                     reason=decision.reason))
        return decision
    decision = schedulable(decision, events, held, probes.partition_nodes(cfg.cluster.partition),
                           read_plan(run_dir).nodes, probes.slurmd_timeout_s())
    try:
        new_job = submit_retry(run_dir, decision.exclude, decision.begin_s, holder=holder)
    except RetryRefused as err:
        append_event(run_dir, Failed(final=True, job_id=job_id, short="retry refused", step=cause.step,
                                     fault=Fault.INFRASTRUCTURE, error=f"{text}; its retry could not be submitted: "
                                     f"{err}", node=cause.node, rank=cause.rank,
                                     reason="the retry could not be submitted"))
        return Decision(False, f"the retry could not be submitted: {err}")
    append_event(run_dir, Retrying(attempt=number, job_id=new_job, previous_job_id=job_id,
                                   exclude=decision.exclude, reason=decision.reason, free=decision.free,
                                   allowed=decision.allowed or None, left_out=probes.held_reasons(decision.exclude)))
    watch(run_dir, new_job)
    return decision


def not_ours(run_dir: Path, refused: claim.ClaimHeld) -> int:
    """Record that this job found the run held by another and ends without training; :data:`EXIT_NOT_OURS`."""
    me = claim.this_job()
    held = claim.current(run_dir)
    cause = f"job {me} did not train: {refused}"
    append_event(run_dir, DuplicateJob(job_id=me, holder=held.job_id if held else None, cause=cause))
    print(f"launcher.job.recovery: {cause}", file=sys.stderr)
    return EXIT_NOT_OURS


def watch(run_dir: Path, job_id: str) -> Optional[Decision]:
    """The watcher's work (launcher/slurm/batch.py ``watcher``, run once job ``job_id`` ended in any state but
    COMPLETED): judge that job's attempt when its batch step died before its end step could, from Slurm's
    account of the batch step, and retry it as the end step would have. Nothing when the attempt was judged, when
    another job holds the run (resumed or retried since), or when the run is gone."""
    held = claim.current(run_dir) if (run_dir / EVENTS).is_file() else None
    if held is None or held.job_id != job_id:
        return None
    mend_record(run_dir)
    events = read_events(run_dir)
    log = AttemptLog(events)
    attempt, since = log.unjudged(), log.this_attempt()[1]
    if attempt is None:
        return None  # its end step ran, or the job never began an attempt (cancelled while pending, say)
    since = [e for e in since if not isinstance(e, Requeued)]  # the job ended for good: no requeue came
    row = probes.job_end(job_id)  # without accounting, squeue's state while it remembers the job
    if attempt.job_id not in (job_id, row and row.unique_id):  # an array element's attempt names its own id
        return None  # an attempt of another job of the run
    holder, job_id = job_id, attempt.job_id  # the claim's name for the job, and the attempt's (the end step's)
    state, exit_code = (row.state, row.exit_code) if row else ("", "")
    number = attempt.attempt
    settled = without_failure(run_dir, since, number, job_id, exit_status(exit_code), state)
    if settled is not None:
        return settled.decision
    node = row.nodes if row and row.nodes else None
    text = f"the job's batch step died: {batch_end(state, exit_code)}{f' on {node}' if node else ''}"
    step = last_step(run_dir)
    cause = Cause(Outcome.FAILED, text, Fault.BATCH_DIED, node=node, step=step, short="batch step died")
    began = trained(since, read_pulses(run_dir, since=attempt.time))
    append_event(run_dir, AttemptEnded(attempt=number, job_id=job_id, outcome=cause.outcome, cause=text,
                                       short=cause.short, fault=cause.fault, node=node, step=step, trained=began))
    return respond(run_dir, events, attempt, cause, text, began, job_id, holder)


def exit_status(exit_code: str) -> int:
    """A shell's exit status from sacct's ``CODE:SIGNAL`` (``0:9`` is 137, as bash reports a SIGKILL)."""
    code, _, sig = exit_code.partition(":")
    return 128 + int(sig) if sig.isdigit() and int(sig) else int(code) if code.isdigit() else 1


def batch_end(state: str, exit_code: str) -> str:
    """How a batch step ended, in words: ``killed by SIGKILL``, ``exit status 3``, ``out of memory``."""
    code, _, sig = exit_code.partition(":")
    if state.startswith("OUT_OF_MEMORY"):
        return "out of memory"
    if sig.isdigit() and int(sig):
        try:
            return f"killed by {signal.Signals(int(sig)).name}"
        except ValueError:
            return f"killed by signal {sig}"
    if code.isdigit() and int(code):
        return f"exit status {code}"
    return state.split()[0].lower() if state else "how, Slurm's accounting does not say"


def main(argv: List[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("begin", "end", "watch") or (argv[0] == "watch" and len(argv) < 3):
        print("usage: python -m launcher.job.recovery begin RUN_DIR | end RUN_DIR EXIT_CODE | watch RUN_DIR JOB_ID",
              file=sys.stderr)
        return 2
    run_dir = Path(argv[1])
    exit_code = int(argv[2]) if len(argv) > 2 and argv[2].lstrip("-").isdigit() else 1
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a job being ended still gets its attempt recorded
    try:
        if argv[0] == "begin":
            refused = claim.enter(run_dir, probes.job_state, claim.this_job() or "")
            if refused is not None:  # before anything of the run's attempts is read or written: they are not ours
                return not_ours(run_dir, refused)
            begin(run_dir)
            waits = probes.kill_wait_s()  # the batch script hands it to the ranks (launcher/slurm/batch.py host_steps)
            print("" if waits is None else waits)
            return 0
        if argv[0] == "watch":
            if watch(run_dir, argv[2]) is COMPLETED:
                record_completed(run_dir)  # its forecast beside what it measured, for `launcher plan` to learn from
            return 0
        sweep_local()  # the ranks of this host are gone: their pulses leave its memory (core/heartbeats.py)
        if end(run_dir, exit_code) is COMPLETED:
            record_completed(run_dir)
            return 0  # the job reads COMPLETED in Slurm too, as the run's record says
    except OSError as err:  # the run directory is gone or unwritable: the job's own exit status stands
        print(f"launcher.job.recovery: cannot record the attempt in {run_dir}: {err.strerror or err}", file=sys.stderr)
    except Exception as err:  # a fault of this step itself: the run's record says so, not only this traceback
        traceback.print_exc()
        first = (str(err).strip().splitlines() or [""])[0]
        append_event(run_dir, Failed(
            final=True, job_id=os.environ.get("SLURM_JOB_ID", ""), short="recovery failed",
            error=f"the batch script's recovery step ({argv[0]}) failed: {type(err).__name__}: {first}",
            reason="the recovery step failed"))
    finally:
        if argv[0] in ("end", "watch"):  # a search's trial whose outcome is now final reports it (search/hook.py)
            trial_ended(run_dir)
    return 0 if argv[0] == "begin" else exit_code

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
