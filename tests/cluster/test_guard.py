"""On the real cluster: a run whose loss turns non-finite on the node (a learning rate of 1e30: a value
composition allows, since only training can tell whether it diverges) fails in one attempt, not retried,
and `runs` says why in two words."""
from __future__ import annotations

import json

import pytest

from support.helpers import job_id_of
from support.helpers import events as read_events

pytestmark = pytest.mark.slurm


def test_a_diverging_run_fails_once_and_runs_says_loss_nan(slurm, tmp_path):
    res = slurm.launcher("model=gpt_tiny", "gpus=2", "train.steps=30", "train.lr=1e30", "name=diverge", root=tmp_path)
    assert res.returncode == 0, res.stderr
    job = job_id_of(res.stdout)
    assert slurm.wait(job, timeout=240) == "FAILED"

    (row,) = json.loads(slurm.launcher("runs", "--json", root=tmp_path).stdout)
    assert (row["status"], row["reason"], row["attempts"]) == ("FAILED", "loss nan", 1)
    assert "FAILED (loss nan)" in slurm.launcher("runs", root=tmp_path).stdout
    events = read_events(tmp_path / "diverge")
    assert [e["event"] for e in events].count("attempt") == 1 and not any(e["event"] == "retrying" for e in events)
    (verdict,) = [e for e in events if e["event"] == "failed" and e.get("final")]
    assert "NonFiniteError: loss is nan at step 1" in verdict["error"]
    assert verdict["reason"] == "an error of the code's own, not retried"
    assert not (tmp_path / "diverge" / "metrics.jsonl").exists()  # nothing of the poisoned step was written
