"""Hang detection: a rank that stops (SIGSTOP, as a hung process does) is named by the watchdog of the
ranks left waiting for it, with its node, step and process state, and the attempt ends."""
import contextlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest
import torch.multiprocessing as mp

from support import train_workers
from launcher.core.heartbeats import EXIT_STALLED, Pulse, read_pulses
from launcher.train.watchdog import describe_stall
from support.helpers import events as read_events
from support.helpers import wait_for
from support.train_harness import launch_forked

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm

TIMEOUT_S = 4.0


def gone(pid: int) -> bool:
    """Whether process ``pid`` has exited (gone, or a zombie not yet reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1].startswith("Z")
    except OSError:
        return True


def sigterm_pending(pid: int) -> bool:
    """Whether process ``pid`` holds a SIGTERM it has not handled (a stopped process cannot)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    pending = [int(line.split()[1], 16) for line in status.splitlines() if line.startswith(("SigPnd:", "ShdPnd:"))]
    return any(mask & (1 << (signal.SIGTERM - 1)) for mask in pending)


def kill_when_stalled(run_dir, rank):
    """Once the stall is recorded, the other ranks have exited (their watchdogs) and the harness, having taken the
    first exit as the attempt's, has asked the stopped rank to terminate, SIGKILL it (this test's own process), as
    srun's --kill-on-bad-exit would; a stopped process ignores SIGTERM, and torch's harness would wait 30 s. Killed
    before the harness has chosen, its exit could be the one reported: torch reports the lowest rank among those
    found gone together."""
    recorded = run_dir / "events.jsonl"
    try:  # a line being written is not yet JSON: the text is searched
        wait_for(lambda: recorded.exists() and "stalled" in recorded.read_text(), 60, "stall", interval=0.2)
        others = [p.pid for p in read_pulses(run_dir) if p.rank != rank]
        wait_for(lambda: all(gone(pid) for pid in others), 60, "the watchdogs' exits", interval=0.1)
        stopped = [p.pid for p in read_pulses(run_dir) if p.rank == rank]
        wait_for(lambda: all(gone(pid) or sigterm_pending(pid) for pid in stopped), 60, "the harness's SIGTERM", interval=0.1)
    except AssertionError:
        pass  # the test itself says what is missing
    for pulse in read_pulses(run_dir):
        if pulse.rank == rank:
            with contextlib.suppress(ProcessLookupError):  # its node's watchdog may have killed it already
                os.kill(pulse.pid, signal.SIGKILL)


@pytest.mark.parametrize("trial", range(10))
def test_a_stopped_rank_is_named_and_the_attempt_ends(tmp_path, trial):
    """Ten times, each rank in turn the stopped one (rank 0 too: then rank 1 records), with a 4 s stall limit:
    the stall is recorded, naming the stopped rank, before any rank exits (the harness, like srun, ends the
    others at the first exit)."""
    stopped = trial % 3
    start = time.time()
    threading.Thread(target=kill_when_stalled, args=(tmp_path, stopped), daemon=True).start()
    with pytest.raises(mp.ProcessExitedException, match=f"exit code {EXIT_STALLED}"):
        launch_forked(train_workers.allreduce_with_watchdog, (tmp_path, stopped, 5, TIMEOUT_S), world_size=3)
    events = read_events(tmp_path)
    assert events, "no stall was recorded in events.jsonl"
    print(f"the stall was recorded {events[0]['time'] - start:.1f} s after the start (timeout {TIMEOUT_S} s)")
    assert [e["event"] for e in events] == ["stalled"], events  # one event, from the lowest live rank
    assert events[0]["ranks"] == [stopped]
    assert f"rank {stopped} on " in events[0]["cause"] and "froze, last seen at step 5" in events[0]["cause"]
    assert "state T (stopped)" in events[0]["cause"]
    recorder = 1 if stopped == 0 else 0
    log = (tmp_path / "logs" / f"rank_{recorder}.log").read_text()
    assert "stalled: step 5 has not advanced" in log and "Thread 0x" in log  # its Python stacks
    pulses = {p.rank: p for p in read_pulses(tmp_path)}
    assert sorted(pulses) == [0, 1, 2] and pulses[stopped].step == 5


def test_a_stopped_process_of_the_node_ends_the_attempt_well_before_the_stall_limit(tmp_path):
    """With a 60 s limit: the other ranks of the node see the process stopped (state T) and end the attempt in
    seconds, naming it."""
    threading.Thread(target=kill_when_stalled, args=(tmp_path, 2), daemon=True).start()
    start = time.time()
    # The recorder SIGKILLs the stopped process (srun would wait KillWait for it) and exits, and the third rank then
    # loses its peers (gloo's words): whichever of the three ends first is what the harness raises.
    ended = f"exit code {EXIT_STALLED}|process 2 terminated with signal SIGKILL|Connection closed by peer"
    with pytest.raises((mp.ProcessExitedException, mp.ProcessRaisedException), match=ended):
        launch_forked(train_workers.allreduce_with_watchdog, (tmp_path, 2, 5, 60.0, True), world_size=3)
    events = read_events(tmp_path)
    assert [e["event"] for e in events] == ["stalled"] and events[0]["ranks"] == [2], events
    assert "state T (stopped)" in events[0]["cause"]
    assert events[0]["time"] - start < 30, events[0]["time"] - start  # 60 s without the neighbours' watch
    assert "rank 2 of this node is stopped (state T) at step 5" in (tmp_path / "logs" / "rank_0.log").read_text()


def test_a_stall_with_every_rank_alive_blames_the_collective():
    now = 1000.0
    pulses = [Pulse(rank=r, node="n1", pid=1, step=7, step_since=900.0, alive=now - 1) for r in range(2)]
    assert describe_stall(pulses, now, stale_s=6) == (
        "every rank is alive but none advanced (steps 7): a collective never completed")
