"""Checkpoints that can be trusted: damage is found before a resume uses it, and a failed save leaves the
earlier checkpoints intact with nothing partial behind.

The reference is an uninterrupted 2-rank run of 6 steps with checkpoints at steps 3 and 6. Each test damages
a copy of it, or runs it on a full disk, and checks what the resumed (or failed) run did.
"""
import json
import os
import shutil

import pytest

from support import train_workers
from launcher.train import manifest
from support.helpers import events, losses
from support.train_harness import launch_forked, launch_ranks, make_run_dir

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm

EVERY = 3  # the reference run checkpoints every 3 steps (tests/cluster/training/conftest.py)



def resume_after(damage, reference_run, tmp_path):
    """A copy of the finished reference whose step-6 checkpoint ``damage`` spoils and whose metrics stop at
    step 3, resumed on 2 ranks; returns its directory."""
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    records = (run_dir / "metrics.jsonl").read_text().splitlines()
    (run_dir / "metrics.jsonl").write_text("\n".join(records[:EVERY]) + "\n")
    damage(run_dir / "checkpoints" / "step_00000006")
    launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    return run_dir


def check_fell_back(run_dir, reference_run, words):
    damaged = [e for e in events(run_dir) if e["event"] == "checkpoint_damaged"]
    assert len(damaged) == 1 and damaged[0]["step"] == 6 and words in damaged[0]["damage"], damaged
    resumed = [e for e in events(run_dir) if e["event"] == "resumed"]
    assert [e["step"] for e in resumed] == [EVERY]
    assert losses(run_dir) == losses(reference_run)  # steps 4-6 trained again, exactly as before
    ckpts = run_dir / "checkpoints"
    assert (ckpts / "step_00000006.damaged").is_dir()  # set aside, never tried again
    assert manifest.damage(ckpts / "step_00000006", 2) == []  # and the step saved again, whole


def test_every_checkpoint_lists_its_files_with_sizes_and_checksums(reference_run):
    step = reference_run / "checkpoints" / "step_00000006"
    listed, problems = manifest.entries(step, 2)
    assert problems == [] and manifest.damage(step, 2) == []
    names = {name for name, _ in listed}
    assert {"__0_0.distcp", "__1_0.distcp", ".metadata", "meta.json", "rng_rank_00000.pt", "rng_rank_00001.pt"} <= names
    for name, expected in listed:
        assert expected["bytes"] == (step / name).stat().st_size
    meta = json.loads((step / "meta.json").read_text())
    assert meta["loss"] == losses(reference_run)[6] and meta["grad_norm"] > 0


def test_truncated_shard_is_skipped_and_the_previous_checkpoint_used(reference_run, tmp_path):
    def truncate(step):
        shard = step / "__1_0.distcp"
        os.truncate(shard, shard.stat().st_size // 2)

    run_dir = resume_after(truncate, reference_run, tmp_path)
    check_fell_back(run_dir, reference_run, "__1_0.distcp has")


def test_overwritten_values_are_found_by_their_checksum(reference_run, tmp_path):
    def overwrite(step):
        shard = step / "__0_0.distcp"
        with open(shard, "r+b") as f:  # 1e30 as float32, where DCP's framing does not notice
            f.seek(shard.stat().st_size // 2)
            f.write(bytes.fromhex("cbd94a71") * 4)

    run_dir = resume_after(overwrite, reference_run, tmp_path)
    check_fell_back(run_dir, reference_run, "__0_0.distcp has the right size but a wrong checksum")


@pytest.fixture
def small_disk(tmpfs):
    """A 1 MiB tmpfs: room for one checkpoint of the test model (~0.7 MB), not two."""
    return tmpfs("1m")


def test_full_disk_fails_the_save_clearly_and_keeps_the_earlier_checkpoint(reference_config, small_disk):
    """A save that finds the disk full fails on every rank as a full disk; the next attempt's preflight finds no
    room for a checkpoint: the disk's fault, said by every rank in the words of the rank that found it, never a
    node's (no ``preflight_failed``)."""
    run_dir = make_run_dir(small_disk / "run", reference_config, world_size=2, micro_batch=2)
    with pytest.raises(Exception, match="saving the checkpoint of step 6 failed: .*No space left on device"):
        launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    ckpts = run_dir / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["step_00000003"]  # nothing partial left behind
    assert manifest.damage(ckpts / "step_00000003", 2) == []
    assert "No space left on device" in (run_dir / "logs" / "rank_0.log").read_text()
    assert {e["fault"] for e in events(run_dir) if e["event"] == "failed"} == {"disk full"}
    with pytest.raises(Exception, match=f"the run directory {run_dir} has 0.\\d MB free; a checkpoint needs about"):
        launch_forked(train_workers.train_run, (run_dir,), world_size=2)
    again = [e for e in events(run_dir) if e["event"] in ("failed", "preflight_failed")][2:]
    assert [(e["event"], e["rank"], e["fault"], e["short"]) for e in again] == [("failed", 0, "disk full",
                                                                                 "disk full")] * 2, again


def test_a_save_cut_by_a_lost_rank_is_a_lost_peer_not_the_saves_own_failure(reference_config, tmp_path):
    """A rank killed during a save leaves its peers' save failing with gloo's words for a peer that went: that
    rank's ``failed`` event is a lost peer, so the attempt's cause is the rank that went (the SIGKILLed rank 1, not
    rank 0's failed save)."""
    run_dir = make_run_dir(tmp_path / "run", reference_config, world_size=2, micro_batch=2)
    body = f"from support import train_workers; train_workers.train_run_peer_lost_in_save({str(run_dir)!r}, 6)"
    results = launch_ranks(["-c", f"import sys; sys.path.insert(0, 'tests'); {body}"], world_size=2, timeout=120)
    assert [r.returncode for r in results] == [1, 9], [r.stdout[-2000:] for r in results]
    (failed,) = [e for e in events(run_dir) if e["event"] == "failed"]
    assert (failed["exception"], failed["fault"]) == ("SaveLostPeer", "peer lost"), failed  # rank 0's, the only one
    assert failed["error"].startswith("SaveLostPeer: saving the checkpoint of step 6 failed: "), failed
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["step_00000003"]
