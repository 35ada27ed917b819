"""Heartbeats at scale (launcher/core/heartbeats.py): the ranks of a node share their pulses through the node's
memory, and the shared run directory holds one file per node, rewritten in place by the node's lowest live rank.
Watchdogs of four ranks on two nodes beat here as threads of this process, as fast as a test allows."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from launcher.core.heartbeats import read_local, read_pulses
from launcher.core.nodelocal import Folder
from launcher.train.watchdog import Watchdog
from support.helpers import wait_for

BEAT_S = 0.05


@pytest.fixture
def ranks(tmp_path):
    """Ranks 0-1 on node n1 and 2-3 on n2, each with its watchdog beating (stall limit far away)."""
    dogs = {rank: Watchdog(tmp_path, rank, "n1" if rank < 2 else "n2", 600.0, lambda *_: None, interval_s=BEAT_S,
                           job_id=f"t{os.getpid()}", neighbours=range(rank - rank % 2, rank - rank % 2 + 2))
            for rank in range(4)}
    for rank, dog in dogs.items():
        dog.start(0)
        dog.step(10 + rank)
    yield dogs
    for dog in dogs.values():
        dog.stop()


def test_the_run_directory_holds_one_heartbeat_file_per_node_rewritten_in_place(tmp_path, ranks):
    wait_for(lambda: {p.rank: p.step for p in read_pulses(tmp_path)} == {0: 10, 1: 11, 2: 12, 3: 13}, 10,
             "every rank's step in the node files")
    folder = tmp_path / "heartbeats"
    assert sorted(p.name for p in folder.iterdir()) == ["node_n1.json", "node_n2.json"]
    inodes = {p.name: p.stat().st_ino for p in folder.iterdir()}
    before = {p.rank: p.alive for p in read_pulses(tmp_path)}
    wait_for(lambda: all(p.alive > before[p.rank] for p in read_pulses(tmp_path)), 10, "later beats")
    assert {p.name: p.stat().st_ino for p in folder.iterdir()} == inodes  # rewritten, never replaced
    assert sorted(p.rank for p in read_local(ranks[0].local)) == [0, 1]  # the node's own, in its memory
    local = ranks[0].local.path
    assert local.parent == Path(f"/dev/shm/launcher-{os.geteuid()}") and local != ranks[2].local.path
    assert [oct(path.stat().st_mode & 0o777) for path in (local, local.parent)] == ["0o700", "0o700"]


def test_a_frozen_writer_is_replaced_by_the_next_rank_and_stays_named_as_frozen(tmp_path, ranks):
    """Rank 0 writes node n1's file; once its watchdog stops beating (a frozen process), rank 1 takes over, and
    the file goes on showing rank 0's last pulse, now stale, which is how another node names it."""
    wait_for(lambda: len(read_pulses(tmp_path)) == 4, 10, "every rank's pulse")
    ranks[0]._stop.set()  # its thread stops beating; its pulse stays in the node's memory, as a frozen rank's would
    ranks[0]._thread.join()
    frozen_at = time.time()
    wait_for(lambda: next(p for p in read_pulses(tmp_path) if p.rank == 1).alive > frozen_at + 4 * BEAT_S, 10,
             "rank 1 writing node n1's file")
    pulses = {p.rank: p for p in read_pulses(tmp_path)}
    assert pulses[0].alive <= frozen_at and pulses[0].step == 10
    assert ranks[1].pulses()[0].alive == pulses[0].alive  # the stall's view: rank 0 frozen


def test_the_node_folder_goes_with_its_last_rank_and_a_killed_jobs_folder_is_swept(tmp_path, ranks):
    wait_for(lambda: len(read_pulses(tmp_path)) == 4, 10, "every rank's pulse")
    local = ranks[0].local.path
    ranks[0].stop()
    with Folder.open(local, create=False) as folder:
        assert [p.rank for p in read_local(folder)] == [1]
    ranks[1].stop()
    assert not local.exists()
    assert len(read_pulses(tmp_path)) == 4  # the node files keep the last pulses for the launcher
    # A folder whose ranks were killed (pids gone) is swept by the next watchdog to start on the node.
    orphan = local.with_name(local.name.replace(f"t{os.getpid()}", "killed"))
    orphan.mkdir(mode=0o700)
    (orphan / "rank_00000.json").write_text('{"rank": 0, "node": "n1", "pid": 999999999, "step": 3, '
                                            '"step_since": 1.0, "alive": 1.0}')
    Watchdog(tmp_path, 0, "n1", 600.0, lambda *_: None, interval_s=BEAT_S, job_id="next").start(0).stop()
    assert not orphan.exists()


def test_a_folder_swept_by_another_rank_while_it_is_read_reads_as_empty(tmp_path):
    """Every rank sweeps the node's dead folders as it starts: one rank may read a folder that another has just
    removed. It is read through a descriptor, which then lists nothing."""
    folder = Folder.open(tmp_path / "launcher-0-dead")
    (tmp_path / "launcher-0-dead").rmdir()
    with folder:
        assert read_local(folder) == [] and folder.names() == []
