"""Hang detection: every rank's pulse on disk, and a watchdog that ends an attempt whose steps stopped.

Slurm sees nothing wrong when a rank hangs (a stopped process, a deadlocked collective): its peers wait in
the collective for as long as its timeout. So every rank runs a watchdog thread that, every few seconds,

- writes its pulse (rank, node, pid, the step it is on, when that step began (``step_since``) and when the
  watchdog last ran (``alive``)) to the node's memory, and the node's lowest live rank copies the node's
  pulses into the node's one heartbeat file in the run directory (launcher/core/heartbeats.py): the shared
  file system sees a write per node per beat, whatever the ranks per node. Where the node's memory takes no
  pulse (full, unwritable), the node's first rank writes the node file from what is known (its own pulse, the
  others' last) and records why once (``heartbeat_failed``), so the run is not taken for stalled;
- checks its own progress: if its step has not advanced for ``stall_timeout_s``, the attempt is stalled.

It also watches the processes of the other ranks of its node (through /proc, their pids from the node's memory):
one seen stopped (state T, a SIGSTOP or a debugger) for a few beats will not run again by itself, so the attempt
is stalled at once rather than after ``stall_timeout_s``. A stalled rank dumps its Python stacks into its log
(faulthandler), reads every rank's pulse to name the culprit, and exits with :data:`EXIT_STALLED`, which ends the
attempt (srun ``--kill-on-bad-exit``). A rank whose ``alive`` stamp is stale is frozen (its process does not run:
stopped, or stuck holding the GIL); the others are waiting for it. The lowest-numbered rank still alive
records one ``stalled`` event naming the frozen ranks, their nodes and steps; the others wait for that event
before they exit. The thread runs while the main thread waits inside a collective, since torch releases the
GIL there.
"""
from __future__ import annotations

import errno
import faulthandler
import json
import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Collection, Iterator, Optional, Sequence, cast

from launcher.core import nodelocal
from launcher.core.heartbeats import (EXIT_STALLED, SLOW_PHASE_S, STALL_FLOOR_S, Pulse, derived_timeout,
                                      encode_node, local_name, node_path, pulse_name, read_local, read_pulses,
                                      sweep_local)
from launcher.core.events import HeartbeatFailed, Stalled
from launcher.core.rundir import append_event, read_events

log = logging.getLogger(__name__)

INTERVAL_S = 2.0


def frozen(pulses: list[Pulse], now: float, stale_s: float, stopped: Collection[int] = ()) -> list[Pulse]:
    """The ranks whose watchdog has not run for ``stale_s`` (their process is not running), and those seen
    ``stopped``."""
    return [p for p in pulses if now - p.alive > stale_s or p.rank in stopped]


def describe_stall(pulses: list[Pulse], now: float, stale_s: float, stopped: Collection[int] = ()) -> str:
    """The stall in words: which ranks are frozen where, or that every rank is waiting."""
    stuck = frozen(pulses, now, stale_s, stopped)
    if stuck:
        waiting = max((p.step for p in pulses if p not in stuck), default=None)
        others = f"; the others wait at step {waiting}" if waiting is not None else ""
        return "; ".join(f"rank {p.rank} on {p.node} froze, last seen at step {p.step} ({_process_state(p)})"
                         for p in stuck) + others
    steps = sorted({p.step for p in pulses})
    return f"every rank is alive but none advanced (steps {', '.join(map(str, steps))}): a collective never completed"


def _state_code(pid: int) -> Optional[str]:
    """A process's state letter from /proc (``T``: stopped), None where it is not a process of this node."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _process_state(pulse: Pulse) -> str:
    """The frozen process's state from /proc where it is on this node (``T (stopped)``), else unknown."""
    code = _state_code(pulse.pid)
    if code is None:
        return "process state unknown from this node"
    names = {"T": "stopped", "t": "stopped by a tracer", "D": "in uninterruptible I/O", "Z": "exited",
             "R": "running", "S": "sleeping"}
    return f"process {pulse.pid} state {code} ({names.get(code, 'other')})"


# A process of this node seen stopped (SIGSTOP, a debugger) at this many beats in a row will not run again by
# itself: its node's other ranks end the attempt then, not after the full stall limit.
STOPPED_BEATS = 2
NEIGHBOUR_SKEW_S = 10.0  # a neighbour's watchdog starts within this of this one's
STALE_BEATS = 4  # a pulse this many beats old is a frozen rank's (a node file lags its ranks by up to a beat)
WRITER_BEATS = 1.5  # the node file's writer whose pulse is this many beats old is replaced by the next rank


class Watchdog:
    """A rank's heartbeat writer and stall detector; call :meth:`step` as training advances."""

    def __init__(self, run_dir: Path, rank: int, node: str, stall_timeout_s: Optional[float],
                 on_stall: Callable[[str, list[Pulse]], None], interval_s: float = INTERVAL_S,
                 exit: Callable[[int], None] = os._exit, neighbours: Sequence[int] = (),
                 job_id: Optional[str] = None, local: Optional[nodelocal.Folder] = None) -> None:
        self.run_dir, self.rank, self.node = Path(run_dir), rank, node
        self.job_id = job_id or os.environ.get("SLURM_JOB_ID", "nojob")
        # This user's node-local folder (the same for the node's ranks: launcher/train/task.py node_local), and in it
        # the folder of this job's pulses on this node, opened by start().
        self._parent, self.local = local, cast(nodelocal.Folder, None)  # both set from start() on
        self.first = min([rank, *neighbours])  # the node's first rank: it says what the node's memory refused
        self._refused: Optional[OSError] = None  # why this rank's pulse last failed to reach the node's memory
        self._said_refused = False  # the log (and, from the node's first rank, the record) says so: once
        self._node_fd: Optional[int] = None  # the node file, held open by this rank while it writes it
        self._known: dict[int, Pulse] = {}  # the newest pulse of each rank of the node, as this rank last read them
        # The other ranks of this node: their processes are watched through /proc (their pids learnt once from their
        # heartbeats), so a stopped one is found in seconds without reading the shared run directory every beat.
        self.neighbours = {r: 0 for r in neighbours if r != rank}  # rank -> beats seen stopped
        self._pids: dict[int, int] = {}
        self._started = time.time()
        self.derive = stall_timeout_s is None  # follow the measured step time (see measured())
        self.stall_timeout_s, self.interval_s = stall_timeout_s or STALL_FLOOR_S, interval_s
        self.on_stall, self.exit = on_stall, exit
        self.pulse = Pulse(rank, node, os.getpid(), step=0, step_since=time.time(), alive=time.time())
        self.limit_s = stall_timeout_s  # how long the current step (or phase) may take
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self, step: int) -> "Watchdog":
        """Beat from now on; the first step (data, model, compile) gets the allowance of a slow phase."""
        sweep_local()  # folders of this user's jobs whose ranks were killed on this node
        self._parent = self._parent or nodelocal.base()
        self.local = self._parent.folder(local_name(self.run_dir, self.job_id, self.node))
        node_path(self.run_dir, self.node).parent.mkdir(parents=True, exist_ok=True)
        self.step(step)
        self._started = time.time()
        self.limit_s = max(self.stall_timeout_s, SLOW_PHASE_S)
        self._write(time.time())
        self._thread = threading.Thread(target=self._run, name="watchdog", daemon=True)
        self._thread.start()
        return self

    def step(self, step: int) -> None:
        """Training reached ``step`` (the main thread; the watchdog writes it at its next beat)."""
        self.pulse.step, self.pulse.step_since, self.limit_s = step, time.time(), self.stall_timeout_s

    def measured(self, step_time: float) -> None:
        """The loop measured its step time: a derived limit follows it."""
        if self.derive:
            self.stall_timeout_s = derived_timeout(step_time)

    @contextmanager
    def phase(self, allowance_s: float) -> Iterator[None]:
        """A phase that may take longer than a step (a checkpoint save, an evaluation): it gets at least
        ``allowance_s`` before it counts as a stall, and the step's clock restarts after it."""
        self.pulse.step_since, self.limit_s = time.time(), max(self.stall_timeout_s, allowance_s)
        try:
            yield
        finally:
            self.pulse.step_since, self.limit_s = time.time(), self.stall_timeout_s

    def stop(self) -> None:
        """Stop beating; this rank's pulse leaves the node's memory (the last rank out removes the folder), and
        the node file keeps the last pulses for the launcher."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._node_fd is not None:
            os.close(self._node_fd)
            self._node_fd = None
        if self.local is not None and self._parent is not None:
            self.local.remove(pulse_name(self.rank))
            self._parent.remove_folder(self.local.path.name)  # kept while another rank's pulse is in it
            self.local.close()
            self._parent.close()
            self._parent = None  # stopped: a second stop does nothing

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            now = time.time()
            self._write(now)
            if now - self.pulse.step_since > self.limit_s:
                self._stalled(now)
                return
            if self._neighbour_stopped():
                self._stalled(now, early=True)
                return

    def _neighbour_stopped(self) -> bool:
        """Whether a rank of this node has been seen stopped for :data:`STOPPED_BEATS` beats in a row."""
        missing = [r for r in self.neighbours if r not in self._pids]
        if missing:
            # This attempt's pulses (the ranks start their watchdogs together, after preflight's all-reduce), not
            # one an earlier attempt left, whose pid is gone or another process's.
            for pulse in read_local(self.local, ranks=missing):
                if pulse.alive >= self._started - NEIGHBOUR_SKEW_S:
                    self._pids[pulse.rank] = pulse.pid
        for rank, pid in self._pids.items():
            self.neighbours[rank] = self.neighbours[rank] + 1 if _state_code(pid) in ("T", "t") else 0
        return any(beats >= STOPPED_BEATS for beats in self.neighbours.values())

    def _write(self, now: float) -> None:
        """This rank's pulse into the node's memory; then, if this is the node's lowest live rank, every pulse of
        the node into the node file, rewritten in place (no create, rename or unlink on the shared file system).
        Where the node's memory refused this rank's pulse, the node's first rank writes the node file from what is
        known: its own pulse and the others' last."""
        self.pulse.alive = now
        try:
            self.local.write(pulse_name(self.rank), json.dumps(asdict(self.pulse)).encode())
            self._refused = None
        except OSError as err:  # a full or unwritable node memory must not kill training, nor hide it
            self._memory_refused(err)
        node = self._known  # every rank of the node seen: one that ended keeps its last pulse in the node file
        node.update({p.rank: p for p in read_local(self.local)})
        node[self.rank] = self.pulse
        live = [rank for rank, p in node.items() if now - p.alive <= WRITER_BEATS * self.interval_s]
        if self.rank != (self.first if self._refused else min(live)):
            return
        try:
            if self._node_fd is None:
                self._node_fd = os.open(node_path(self.run_dir, self.node), os.O_WRONLY | os.O_CREAT, 0o666)
            os.pwrite(self._node_fd, encode_node(self.node, sorted(node.values(), key=lambda p: p.rank), now), 0)
            os.fdatasync(self._node_fd)  # other nodes read it: on NFS, written back now, not at close
        except OSError as err:  # a full or unreachable disk must not kill training by itself
            log.warning("heartbeat not written: %s", err)

    def _memory_refused(self, err: OSError) -> None:
        """Note that the node's memory refused this rank's pulse: in its log, and once in the run's record when this
        is the node's first rank."""
        self._refused = err
        if self._said_refused:
            return
        self._said_refused = True
        log.warning("heartbeat not written to the node's memory (%s): %s; the node's heartbeat file in the run "
                    "directory is written from what is known", self.local.path, err)
        if self.rank == self.first:
            try:
                append_event(self.run_dir, HeartbeatFailed(
                    job_id=self.job_id, node=self.node, rank=self.rank, path=str(self.local.path),
                    error=str(err), errno=errno.errorcode.get(err.errno or 0)))
            except OSError as unrecorded:
                log.warning("heartbeat_failed not recorded: %s", unrecorded)

    def pulses(self) -> list[Pulse]:
        """Every rank's newest pulse: this node's from its memory, the others' from their node files."""
        mine = {p.rank: p for p in read_local(self.local)}
        return sorted([*mine.values(), *(p for p in read_pulses(self.run_dir) if p.rank not in mine)],
                      key=lambda p: p.rank)

    def _stalled(self, now: float, early: bool = False) -> None:
        if early:
            log.error("stalled: rank %s of this node is stopped (state T) at step %d; Python stacks follow",
                      ", ".join(str(r) for r, beats in self.neighbours.items() if beats >= STOPPED_BEATS),
                      self.pulse.step)
        else:
            log.error("stalled: step %d has not advanced for %.0f s (limit %.0f s); Python stacks follow",
                      self.pulse.step, now - self.pulse.step_since, self.limit_s)
        for handler in logging.getLogger().handlers:
            handler.flush()
        for stream in {getattr(h, "stream", None) for h in logging.getLogger().handlers} | {sys.stderr}:
            if stream is not None and hasattr(stream, "fileno"):
                faulthandler.dump_traceback(file=stream, all_threads=True)
        pulses = self.pulses()
        stale = STALE_BEATS * self.interval_s
        live = [p.rank for p in pulses if now - p.alive <= stale
                and (not early or p.rank == self.rank or p.rank in self.neighbours)]
        # One event per stall, from the lowest live rank (of this node, when a stopped process of this node is the
        # evidence: only this node's ranks see it). Another waits for it before exiting: its exit ends the attempt
        # (srun kills every rank), and the lowest's watchdog may fire an interval later. Should none come (that
        # rank died too), it records the stall itself.
        stopped = [rank for rank, beats in self.neighbours.items() if beats >= STOPPED_BEATS]
        live = [rank for rank in live if rank not in stopped]
        if live and self.rank != min(live) and self._recorded_within(stale):
            self.exit(EXIT_STALLED)
            return
        self.on_stall(describe_stall(pulses, now, stale, stopped), frozen(pulses, now, stale, stopped))
        for rank in stopped:  # srun would wait KillWait for it to heed SIGTERM, which a stopped process cannot
            try:
                os.kill(self._pids[rank], signal.SIGKILL)
            except OSError:
                pass
        self.exit(EXIT_STALLED)

    def _recorded_within(self, wait_s: float) -> bool:
        """Whether a ``stalled`` event of this stall (after its step began) appears within ``wait_s``."""
        deadline = time.time() + wait_s
        while True:
            if any(isinstance(e, Stalled) and e.time >= self.pulse.step_since for e in read_events(self.run_dir)):
                return True
            if time.time() >= deadline:
                return False
            time.sleep(min(0.2, self.interval_s))
