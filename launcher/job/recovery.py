"""Inside each Slurm job, around the ranks: record the attempt, and when it fails, find why and go on.

The batch script the launcher submits runs (launcher/slurm/batch.py)::

    python -m launcher.job.recovery begin RUN_DIR          # before srun
    srun --kill-on-bad-exit=1 ... (the ranks)
    python -m launcher.job.recovery end RUN_DIR $?         # after srun, with its exit status

``begin`` records an ``attempt`` event (its number, job id, nodes). ``end`` weighs the attempt's evidence
(launcher/job/attempts.py: events, srun's report, heartbeats) into a cause and records ``attempt_ended``. When
the ranks saved on Slurm's time-limit or preemption signal, it requeues the job (:func:`requeue`). For a
failed or stalled attempt it then decides (:func:`decide`): retry from the newest good checkpoint as a new
Slurm job that excludes the node to blame, up to ``cluster.max_retries``; or give up with the cause, when the
failure is the code's own (before the first step of the first attempt, or the same error at the same step
twice) or the retries are spent. Everything happens in Slurm and the run directory: no process outside
the job. Retrying with a new job rather than ``scontrol requeue`` is what lets it exclude a node: Slurm
accepts ``ExcNodeList`` only for a pending job, and a requeued job stays running until this script ends.
The design is in docs/recovery.md.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

from launcher.job.attempts import NO_TORCH, Cause, attribute, srun_task_ends
from launcher.core.heartbeats import steps_by_rank
from launcher.core.rundir import append_event, last_metrics, read_events
from launcher.status.attempt_log import AttemptLog


# Exceptions that may pass on another try or another node: I/O, network, device and collective errors.
INFRASTRUCTURE = re.compile(r"^(OSError|IOError|ConnectionError|ConnectionResetError|BrokenPipeError|TimeoutError|"
                            r"CheckpointSaveError|DistBackendError|DistNetworkError|DistStoreError)\b|"
                            r"CUDA error|NCCL|ECC|Input/output error|No space left", re.IGNORECASE)


@dataclass(frozen=True)
class Decision:
    retry: bool
    reason: str
    exclude: List[str] = field(default_factory=list)
    preflight: bool = False  # a node failed its preflight: the retry is not counted against max_retries


def batch_log(run_dir: Path, job_id: str) -> Path:
    """The batch script's stderr, where srun reports the tasks that ended badly (submitit's naming)."""
    return Path(run_dir) / "submitit" / f"{job_id}_0_log.err"


def begin(run_dir: Path) -> dict:
    job_id = os.environ.get("SLURM_JOB_ID", "")
    log = AttemptLog(read_events(run_dir))
    previous, since = log.this_attempt()
    if previous and not any(e.get("event") == "attempt_ended" for e in since):
        # Its batch script was ended before it could judge: by a requeue, or with its node.
        if any(e.get("event") == "requeued" for e in since):
            append_event(run_dir, "attempt_ended", attempt=previous.get("attempt"), job_id=previous.get("job_id"),
                         outcome="REQUEUED", cause="")
        else:
            append_event(run_dir, "attempt_ended", **unjudged(run_dir, previous))
    number = 1 + log.count
    stderr = batch_log(run_dir, job_id)
    fields = {"attempt": number, "job_id": job_id, "nodes": os.environ.get("SLURM_JOB_NODELIST"),
              "restart": int(os.environ.get("SLURM_RESTART_COUNT", 0)),
              "log_offset": stderr.stat().st_size if stderr.exists() else 0}
    append_event(run_dir, "attempt", **fields)
    return fields


def unjudged(run_dir: Path, attempt: dict) -> dict:
    """The ``attempt_ended`` fields of an attempt whose batch script never judged it because Slurm requeued
    the job itself: LOST when one of its nodes stopped responding (NODE_FAIL; the nodes to blame are those
    Slurm now holds down, and the requeued job runs without them), else REQUEUED from outside the run."""
    nodes = sick_nodes(attempt.get("nodes"))
    step = max([(last_metrics(Path(run_dir)) or {}).get("step", 0), *steps_by_rank(run_dir).values()])
    fields = {"attempt": attempt.get("attempt"), "job_id": attempt.get("job_id"), "step": step}
    if not nodes:
        return {**fields, "outcome": "REQUEUED", "short": "requeued",
                "cause": f"requeued from outside the run at step {step} (scontrol requeue, or a node that came back)"}
    return {**fields, "outcome": "LOST", "node": nodes[0], "exclude": nodes, "short": f"{nodes[0]} lost",
            "cause": f"node {', '.join(nodes)} lost at step {step}: Slurm holds it down and requeued the job"}


def end(run_dir: Path, exit_code: int) -> Optional[Decision]:
    """Record how the attempt ended; requeue it, retry it or give up. Returns the decision (None: nothing to
    decide)."""
    events = read_events(run_dir)
    attempt, since = AttemptLog(events).this_attempt()
    job_id = os.environ.get("SLURM_JOB_ID", "")
    queued = None
    asked = requeue_asked(since)
    if asked is not None:
        queued = queue_state(job_id)
        if not queued.startswith("CANCELLED") and queued not in REQUEUED_STATES:
            if requeue(run_dir, job_id, asked, events) is None:
                append_event(run_dir, "attempt_ended", attempt=attempt.get("attempt") if attempt else None,
                             job_id=job_id, outcome="REQUEUED")
                return None
            events = read_events(run_dir)  # with the failure just recorded, judged below
            attempt, since = AttemptLog(events).this_attempt()
    kinds = {e.get("event") for e in since}
    if "requeued" in kinds and [e for e in since if e.get("event") in ("requeued", "failed")][-1]["event"] == "failed":
        kinds.discard("requeued")  # the signal was heard but Slurm could not requeue: judged as a failure
    number = attempt.get("attempt") if attempt else None
    verdict = next((e for e in since if e.get("event") == "failed" and e.get("final")), None)
    if verdict:  # the ranks already ended the run (a requeue budget spent): nothing to decide
        append_event(run_dir, "attempt_ended", attempt=number, job_id=job_id, outcome="FAILED",
                     cause=verdict.get("error"), short=verdict.get("short"), step=verdict.get("step"))
        return None
    if "finished" in kinds:  # the final checkpoint is whole: what a rank did after it does not matter
        late = {"exit_code": exit_code, "note": f"a rank ended badly after the run finished (srun {exit_code})"} \
            if exit_code else {}
        append_event(run_dir, "attempt_ended", attempt=number, job_id=job_id, outcome="COMPLETED", **late)
        return COMPLETED
    queued = queue_state(job_id) if queued is None else queued
    if queued.startswith("CANCELLED"):  # by the user or an administrator (`launcher stop` records it too)
        kinds.add("cancelled")
    if "requeued" in kinds or "cancelled" in kinds:  # preemption, time limit, or the user: not a failure
        append_event(run_dir, "attempt_ended", attempt=number, job_id=job_id,
                     outcome="REQUEUED" if "requeued" in kinds else "CANCELLED")
        return None
    if queued in REQUEUED_STATES:
        # Slurm requeued the job itself (its node was lost) while this batch script lived on: the next attempt
        # records this one (unjudged()), and a retry from here would run the run twice.
        return None
    log = batch_log(run_dir, job_id)
    stderr = ""
    if log.exists():
        with open(log, errors="replace") as f:
            f.seek(attempt.get("log_offset", 0) if attempt else 0)
            stderr = f.read()
    cause = attribute(since, srun_task_ends(stderr), steps_by_rank(run_dir), exit_code)
    append_event(run_dir, "attempt_ended", attempt=number, job_id=job_id, outcome=cause.outcome, cause=cause.text,
                 short=cause.short, rank=cause.rank, node=cause.node, step=cause.step, exit_code=exit_code)
    from launcher.core.config import load_run_config

    unwell = sick_nodes(attempt.get("nodes") if attempt else None)
    reached = max([(last_metrics(Path(run_dir)) or {}).get("step", 0), cause.step or 0,
                   *steps_by_rank(run_dir).values()])
    decision = decide(events, cause, load_run_config(Path(run_dir) / "config.yaml").cluster.max_retries, unwell,
                      progressed=reached > 0)
    if decision.retry:
        from launcher.job.submission import resubmit

        new_job = resubmit(Path(run_dir), exclude=decision.exclude)
        append_event(run_dir, "retrying", attempt=number, job_id=new_job, previous_job_id=job_id,
                     exclude=decision.exclude, reason=decision.reason, preflight=decision.preflight)
    else:
        append_event(run_dir, "failed", final=True, job_id=job_id, error=cause.text, short=cause.short,
                     rank=cause.rank, node=cause.node, step=cause.step, reason=decision.reason)
    return decision


COMPLETED = Decision(False, "the run completed")

# A job that Slurm has put back in the queue while the old batch script may still be running.
REQUEUED_STATES = {"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"}


def requeue_asked(since: List[dict]) -> Optional[int]:
    """The step saved for a requeue the ranks asked for in this attempt (``requeued`` by the signal, nothing
    failed after it), or None."""
    last = next((e for e in reversed(since) if e.get("event") in ("requeued", "failed")), None)
    return last.get("step") if last and last["event"] == "requeued" and last.get("by") == "signal" else None


def requeue(run_dir: Path, job_id: str, step: int, events: List[dict]) -> Optional[dict]:
    """Requeue this job (same job id, a new attempt) after its ranks saved ``step`` on Slurm's signal.

    Here, in the batch shell on the host, not in a rank: ranks may run in a container without Slurm's client or
    munge. Returns None when Slurm requeued the job; else the ``failed`` event recorded: final when
    ``cluster.max_requeues`` requeues in a row made no progress (a long run cut into many time-limited attempts
    is never stopped by a fixed cap, while one that can no longer train a step within its limit is), or the
    controller's refusal, which the attempt's judgement then retries as a new job from the step just saved."""
    from launcher.core.config import load_run_config
    from launcher.slurm.client import Slurm
    from launcher.slurm.output import SlurmError

    cluster = load_run_config(Path(run_dir) / "config.yaml").cluster
    earlier = [e.get("step") for e in events if e.get("event") == "requeued" and e.get("by") == "signal"][:-1]
    stuck = next((n for n, seen in enumerate(reversed(earlier)) if seen != step), len(earlier))
    node = os.environ.get("SLURMD_NODENAME")
    if stuck >= cluster.max_requeues:
        fields = {"final": True, "short": "no progress", "step": step,
                  "error": f"{stuck + 1} attempts in a row ended at step {step} without training a step",
                  "reason": f"cluster.max_requeues={cluster.max_requeues} requeues without progress"}
    else:
        # Until shortly before the time limit: the signal came at least signal_delay_s before it.
        deadline = time.monotonic() + max(5, cluster.signal_delay_s - 15)
        while True:
            try:
                Slurm(None, timeout=30).requeue(job_id)
                return None
            except SlurmError as err:
                error = str(err)
            if time.monotonic() > deadline:
                break
            time.sleep(3)
        fields = {"short": "requeue failed", "step": step, "node": node,
                  "error": f"ConnectionError: scontrol requeue {job_id} failed: {error}"}
    append_event(run_dir, "failed", job_id=job_id, **fields)
    return fields


def queue_state(job_id: str) -> str:
    """Slurm's state of this job in its queue ("" where the queue cannot be asked)."""
    from launcher.slurm.client import Slurm, SlurmError

    try:
        return next((row.state for row in Slurm(None, timeout=15).squeue() if row.job_id == job_id), "")
    except SlurmError:
        return ""


def sick_nodes(nodelist: Optional[str]) -> List[str]:
    """The attempt's nodes that Slurm now holds down, drained or not responding."""
    if not nodelist:
        return []
    from launcher.slurm.client import Slurm, SlurmError
    from launcher.slurm.output import unusable

    try:
        states = Slurm(None, timeout=15).node_states(nodelist)
    except SlurmError:
        return []
    return sorted(node for node, state in states.items() if unusable(state))


def decide(events: List[dict], cause: Cause, max_retries: int, sick: Sequence[str] = (),
           progressed: bool = True) -> Decision:
    """Retry or not, and which nodes the next attempt must avoid (``events`` hold every attempt so far,
    the ending one's ``attempt_ended`` not yet among them).

    Retried: what may pass on another try or another node (a rank killed by a signal, a hang, a lost node,
    I/O, network and device errors). The next attempt avoids the node of a hung rank and every node Slurm
    holds down or drained (``sick``); a rank killed by a signal (often the kernel's out-of-memory killer) does
    not make its node suspect. Not retried: tasks whose Python has no torch, an error of the code's own (any
    other exception), a failure before the first step of the first attempt, the same error at the same step
    twice, or a run whose ``cluster.max_retries`` are spent. ``progressed``: the run has trained a step (metrics or
    heartbeats)."""
    excluded = {node for e in events if e.get("event") in ("retrying", "attempt_ended")
                for node in e.get("exclude") or []}
    if cause.outcome == "PREFLIGHT":  # the node's fault, found before training: costs no retry of the run's
        return Decision(True, f"{cause.node} failed its preflight check: retried without it",
                        sorted(excluded | {cause.node} | set(sick)), preflight=True)
    if cause.outcome == "FAILED" and cause.short == NO_TORCH:
        return Decision(False, "the tasks' Python has no torch: the same on every node and every try, not retried")
    first = not any(e.get("event") == "attempt_ended" for e in events)
    if first and not progressed:
        return Decision(False, "it failed before its first step: a problem of the code, config or data, not retried")
    if cause.outcome == "FAILED" and cause.error and not INFRASTRUCTURE.search(cause.error):
        return Decision(False, "an error of the code's own, not retried")
    ended = [e for e in events if e.get("event") == "attempt_ended" and e.get("outcome") in ("FAILED", "STALLED")]
    if ended and (ended[-1].get("short"), ended[-1].get("step")) == (cause.short, cause.step):
        return Decision(False, f"the same failure at step {cause.step} twice, not retried again")
    retries = sum(e.get("event") == "retrying" and not e.get("preflight") for e in events)
    if retries >= max_retries:
        return Decision(False, f"all cluster.max_retries={max_retries} retries spent")
    blamed = {cause.node} if cause.node and cause.outcome == "STALLED" else set()
    return Decision(True, f"retry {retries + 1} of {max_retries} from the newest good checkpoint",
                    sorted(excluded | blamed | set(sick)))


def main(argv: List[str]) -> int:
    if len(argv) < 2 or argv[0] not in ("begin", "end"):
        print("usage: python -m launcher.job.recovery begin RUN_DIR | end RUN_DIR EXIT_CODE", file=sys.stderr)
        return 2
    run_dir = Path(argv[1])
    exit_code = int(argv[2]) if len(argv) > 2 and argv[2].lstrip("-").isdigit() else 1
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a job being ended still gets its attempt recorded
    try:
        if argv[0] == "begin":
            begin(run_dir)
            return 0
        if end(run_dir, exit_code) is COMPLETED:
            return 0  # the job reads COMPLETED in Slurm too, as the run's record says
    except OSError as err:  # the run directory is gone or unwritable: the job's own exit status stands
        print(f"launcher.job.recovery: cannot record the attempt in {run_dir}: {err.strerror or err}", file=sys.stderr)
    return 0 if argv[0] == "begin" else exit_code


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
