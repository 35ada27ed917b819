"""A run as a sequence of attempts, and the cause of an attempt's end in the user's words.

An attempt is one start of the run's Slurm job: the first submission, or a requeue of it (preemption, time
limit, automatic recovery). When ranks fail, most of them fail *because* another one did: a SIGKILLed rank
leaves no trace of its own while its peers report gloo's "Connection reset by peer", and a hung rank is found
by its peers' watchdogs, which then exit. So the cause is chosen from all the evidence an attempt leaves, in
this order:

0. a ``preflight_failed`` event (a node failed its checks before training);
1. a lost node: srun could not reach it, or it did not answer a probe after the ranks ended;
2. a ``stalled`` event (the watchdog named the frozen ranks);
3. a ``failed`` event whose error is the rank's own, not a lost peer (the earliest such);
4. a rank that exited with the watchdog's status and no ``stalled`` event: a stall, blamed on the rank whose
   heartbeat stopped first, never on the peer whose watchdog fired;
5. srun's report of the ranks that died without an error of their own (``srun: error: NODE: task N: Killed``):
   every rank killed by a signal is named, and the first otherwise;
6. a peer-loss error, when nothing better is known; else srun's exit status.

The evidence is this attempt's only: its events, and heartbeats written since it began. Everything here is
pure (evidence in, words out), so the teardown step of the batch script and the tests share it. The event log
read as attempts (which is this one, the attempts table) is launcher/core/attempt_log.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

from launcher.core.events import AttemptEnded, Event, Failed, Fault, Outcome, PreflightFailed, Stalled
from launcher.core.heartbeats import EXIT_STALLED, Pulse
from launcher.slurm.output import TaskEnd


@dataclass(frozen=True)
class Cause:
    """Why an attempt ended: its outcome, the rank and node to blame, the step, and one line."""

    outcome: Outcome  # FAILED, STALLED, LOST or PREFLIGHT
    text: str
    fault: Fault = Fault.UNKNOWN  # the kind, what recovery's policy is keyed by
    rank: Optional[int] = None
    node: Optional[str] = None
    step: Optional[int] = None
    short: str = ""  # a word or two for `runs`: "rank 2 killed", "stalled", "OSError"
    error: str = ""  # the rank's own exception ("OSError: ..."), where the cause is one
    nodes: Tuple[str, ...] = ()  # every node to blame (LOST: each lost node), ``node`` first
    exception: Optional[str] = None  # the type of the rank's own exception, where the cause is one

    def repeats(self, ended: AttemptEnded) -> bool:
        """Whether this is the failure that ended an earlier attempt (``ended``) again: of the same kind, at
        the same step, by the same exception (or, without one, on the same rank)."""
        return (self.fault, self.step, self.exception or self.rank) == (ended.fault, ended.step,
                                                                        ended.exception or ended.rank)


def attribute(events: List[Event], task_ends: List[TaskEnd], pulses: Sequence[Pulse],
              exit_code: Optional[int] = None, lost: Sequence[str] = (), logged: Optional[int] = None) -> Cause:
    """The cause of an attempt's end from its events, srun's reports, its ranks' heartbeats and the nodes found
    lost (all of this attempt's only). A rank's step is its heartbeat's, or the last step the attempt logged
    (``logged``) where that is later (or where the rank left no heartbeat): the ranks step together, and a
    heartbeat lags by up to its interval."""
    heard = {p.rank: max(p.step, logged or 0) for p in pulses}

    def steps(rank: Optional[int]) -> Optional[int]:
        return heard.get(rank, logged) if rank is not None else logged

    for event in events:
        if isinstance(event, PreflightFailed):
            node = event.node
            return Cause(Outcome.PREFLIGHT, f"node {node} failed its preflight check: {event.problem}",
                         Fault.NODE_UNFIT, rank=event.rank, node=node, short=f"{node} failed preflight",
                         nodes=(node,))
    if lost:
        step = max(heard.values(), default=logged)
        at = f" at step {step}" if step is not None else " during start-up"
        return Cause(Outcome.LOST, f"node {', '.join(lost)} lost{at}: Slurm could not reach it", Fault.NODE_LOST,
                     node=lost[0], step=step, short=f"{lost[0]} lost", nodes=tuple(lost))
    for event in events:
        if isinstance(event, Stalled):
            ranks, nodes = event.ranks or [], event.nodes or []
            return Cause(Outcome.STALLED, f"stalled: {event.cause or 'no step advanced'}", Fault.HUNG,
                         rank=ranks[0] if ranks else None, node=nodes[0] if nodes else None, step=event.step,
                         short=f"rank {ranks[0]} hung" if ranks else "hung", nodes=tuple(dict.fromkeys(nodes)))
    failures = [e for e in events if isinstance(e, Failed)]
    own = [e for e in failures if e.fault != Fault.PEER_LOST]
    if own:
        first = min(own, key=lambda e: e.time)
        rank = first.rank
        error = first.error or "unknown error"
        fault = first.fault or Fault.CODE
        short = first.short or ("disk full" if fault is Fault.DISK_FULL else error.split(":")[0])
        return Cause(Outcome.FAILED, _where(rank, first.node, first.step) + error, fault, rank=rank, node=first.node,
                     step=first.step, short=short, error=error, exception=first.exception)
    watchdogs = [r for end in task_ends if end.how == f"Exited with exit code {EXIT_STALLED}" for r in end.ranks]
    if watchdogs and pulses:
        hung = min(pulses, key=lambda p: p.alive)  # its heartbeat stopped first: the others waited for it
        fired = ", ".join(map(str, sorted(watchdogs)))
        return Cause(Outcome.STALLED, f"stalled: rank {hung.rank} on {hung.node} stopped first, at step "
                     f"{steps(hung.rank)} (the watchdog of rank {fired} ended the attempt)", Fault.HUNG, rank=hung.rank,
                     node=hung.node, step=steps(hung.rank), short=f"rank {hung.rank} hung", nodes=(hung.node,))
    return _from_srun(failures, task_ends, watchdogs, steps, exit_code)


def _from_srun(failures: List[Failed], task_ends: List[TaskEnd], watchdogs: List[int],
               steps: Callable[[Optional[int]], Optional[int]], exit_code: Optional[int]) -> Cause:
    """The cause when no rank's own error, stall or lost node explains the end: srun's report of the ranks
    that died without an error of their own, else a lost peer, else srun's exit status (5 and 6 above)."""
    reported = {e.rank for e in failures}
    silent = [(rank, end) for end in task_ends for rank in end.ranks
              if rank not in reported and rank not in watchdogs]
    killed = [(rank, end.node) for rank, end in silent if end.how == "Killed" and not end.after_end]
    if killed:  # killed from outside (the kernel's OOM killer, an administrator): each one is named
        rank, node = killed[0]
        if len(killed) == 1:
            return Cause(Outcome.FAILED, _where(rank, node, steps(rank)) + "killed by a signal (SIGKILL)",
                         Fault.KILLED, rank=rank, node=node, step=steps(rank), short=f"rank {rank} killed")
        where = "; ".join(f"rank {r} on {n}" + ("" if steps(r) is None else f" at step {steps(r)}") for r, n in killed)
        return Cause(Outcome.FAILED, f"{len(killed)} ranks killed by a signal (SIGKILL): {where}", Fault.KILLED,
                     rank=rank, node=node, step=steps(rank),
                     short=f"ranks {','.join(str(r) for r, _ in killed)} killed",
                     nodes=tuple(dict.fromkeys(n for _, n in killed)))
    if silent:
        rank, end = silent[0]
        return Cause(Outcome.FAILED, _where(rank, end.node, steps(rank)) + end.how.lower(), Fault.DIED, rank=rank,
                     node=end.node, step=steps(rank), short=f"rank {rank} died")
    if failures:
        first = min(failures, key=lambda e: e.time)
        rank = first.rank
        return Cause(Outcome.FAILED, _where(rank, first.node, first.step) + str(first.error), Fault.PEER_LOST,
                     rank=rank, node=first.node, step=first.step, short="lost a peer")
    return Cause(Outcome.FAILED, f"srun exited with status {exit_code}" if exit_code else "ended without a record",
                 Fault.UNKNOWN, short=f"exit {exit_code}" if exit_code else "no record")


def _where(rank: Optional[int], node: Optional[str], step: Optional[int]) -> str:
    parts = [f"rank {rank}" if rank is not None else "", f"on {node}" if node else "",
             f"at step {step}" if step is not None else ""]
    text = " ".join(p for p in parts if p)
    return f"{text}: " if text else ""

