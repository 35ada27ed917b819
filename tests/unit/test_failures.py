"""A failure's kind is decided once, by its type and errno (launcher/core/failures.py), and recovery's policy is
a table keyed by that kind: no retry depends on the words of one of our own or Python's exceptions."""
from __future__ import annotations

import errno
import json

import pytest
import torch.distributed as dist

from launcher.core.dataset import DatasetError
from launcher.core.events import Fault
from launcher.core.failures import THIRD_PARTY, classify, failure_event
from launcher.job.entry import NoTorch
from launcher.job.policy import POLICY
from launcher.slurm.output import SlurmError
from launcher.train.checkpoint import CheckpointSaveError
from launcher.train.faults import InjectedFault
from launcher.train.guard import NonFiniteError


@pytest.mark.parametrize("err, fault", [
    (OSError(errno.ENOSPC, "No space left on device"), Fault.DISK_FULL),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), Fault.DISK_FULL),
    (OSError(errno.EIO, "Input/output error"), Fault.INFRASTRUCTURE),
    (OSError(errno.EROFS, "Read-only file system"), Fault.INFRASTRUCTURE),
    (OSError("a library's I/O failed"), Fault.INFRASTRUCTURE),
    (TimeoutError("timed out"), Fault.INFRASTRUCTURE),
    (ConnectionError("the store went away"), Fault.INFRASTRUCTURE),
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), Fault.PEER_LOST),
    (BrokenPipeError(errno.EPIPE, "Broken pipe"), Fault.PEER_LOST),
    (FileNotFoundError(errno.ENOENT, "No such file or directory", "/data/ecc/nccl.bin"), Fault.CODE),
    (PermissionError(errno.EACCES, "Permission denied"), Fault.CODE),
    (dist.DistNetworkError("failed to recv, got 0 bytes"), Fault.PEER_LOST),
    (dist.DistStoreError("wait timeout"), Fault.INFRASTRUCTURE),
    (RuntimeError("CUDA error: an illegal memory access was encountered"), Fault.INFRASTRUCTURE),
    (RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1, unhandled system error"), Fault.INFRASTRUCTURE),
    (RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection reset by peer [127.0.0.1]:4242"), Fault.PEER_LOST),
    (RuntimeError("NCCL communicator was aborted on rank 3"), Fault.PEER_LOST),
    (ValueError("model.d_model must be divisible by model.n_heads"), Fault.CODE),
    (KeyError("newkey"), Fault.CODE),
    (CheckpointSaveError("saving step 40 failed: [Errno 28] No space left on device"), Fault.INFRASTRUCTURE),
    (DatasetError("shard /data/nccl-ecc/tokens_00001.bin has 10 bytes, not 20"), Fault.DATA),
    (NoTorch("/usr/bin/python3"), Fault.NO_TORCH),
    (InjectedFault("fault injected by LAUNCHER_FAULT=raise@5 at step 5: NCCL ECC"), Fault.CODE),
])  # fmt: skip
def test_a_failure_is_classified_by_its_type_and_errno_not_its_words(err, fault):
    assert classify(err) == fault


def test_an_exception_of_our_own_keeps_its_kind_under_another_name():
    renamed = type("SaveFailedSomehow", (CheckpointSaveError,), {})
    assert classify(renamed("I/O error")) == Fault.INFRASTRUCTURE
    assert classify(NonFiniteError("loss", float("nan"), 3)) == Fault.CODE


def test_every_kind_has_a_policy_with_its_reason():
    assert set(POLICY) == set(Fault)
    assert all(reason for _, reason in POLICY.values())
    assert [fault for fault, (retried, _) in POLICY.items() if not retried] == [Fault.CODE, Fault.DATA, Fault.NO_TORCH]


def test_the_third_party_table_says_what_each_entry_is_for():
    assert all(words.pattern and what for words, _, what in THIRD_PARTY)


def test_a_failure_event_carries_the_kind_the_type_and_the_step(monkeypatch, tmp_path):
    monkeypatch.setenv("SLURM_PROCID", "2")
    monkeypatch.setenv("SLURMD_NODENAME", "n3")
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    event = failure_event(OSError(errno.ENOSPC, "No space left on device: hf_secret"), 17, tmp_path, ["HF_TOKEN"])
    assert (event.rank, event.node, event.step, event.fault, event.exception) == (2, "n3", 17, Fault.DISK_FULL,
                                                                                   "OSError")
    assert event.error == "OSError: [Errno 28] No space left on device: ***"
    whole = failure_event(NoTorch("/usr/bin/python3"), None, tmp_path)
    assert whole.error.startswith("the tasks' Python /usr/bin/python3 has no torch") and whole.short == "no torch"


def test_a_failure_before_training_names_no_step_and_one_from_another_rank_names_that_rank(monkeypatch, tmp_path):
    """A rank that fails before its watchdog began has no step of this attempt: an earlier attempt's heartbeat in
    the run directory says nothing of it. A save that failed on rank 0 is rank 0's on every rank, without a node
    (the recording rank's would be wrong)."""
    monkeypatch.setenv("SLURM_PROCID", "1")
    monkeypatch.setenv("SLURMD_NODENAME", "n2")
    (tmp_path / "heartbeats").mkdir()
    (tmp_path / "heartbeats" / "node_n2.json").write_text(json.dumps({"node": "n2", "written": 1.0, "pulses": [
        {"rank": 1, "node": "n2", "pid": 1, "step": 91, "step_since": 1.0, "alive": 1.0}]}))
    assert failure_event(OSError(errno.EIO, "Input/output error"), None, tmp_path).step is None
    full = CheckpointSaveError("saving the checkpoint of step 120 failed: rank 0: [Errno 28] No space left on "
                               "device", rank=0, disk_full=True)
    event = failure_event(full, 120, tmp_path)
    assert (event.rank, event.node, event.step, event.fault) == (0, None, 120, Fault.DISK_FULL)
    own = failure_event(CheckpointSaveError("saving ... failed: [Errno 5] Input/output error", rank=1), 120, tmp_path)
    assert (own.rank, own.node, own.fault) == (1, "n2", Fault.INFRASTRUCTURE)


def test_a_controller_that_did_not_answer_is_told_from_one_that_refused():
    assert SlurmError("sbatch: error: Batch job submission failed: Unable to contact slurm controller").transient
    assert SlurmError("'squeue' did not answer in 15 s", transient=True).transient
    assert not SlurmError("sbatch: error: Batch job submission failed: Invalid account or account/partition").transient
