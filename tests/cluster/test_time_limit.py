"""A real time limit: a run that needs 4 or more attempts of a 2-minute limit (``time_limited`` in tests/cluster/conftest.py,
started when the session starts because Slurm's limits are whole minutes) completes every step, each
signal costing no step and none trained twice."""
from __future__ import annotations

import json
import time

from support.helpers import PACED_STEPS
from support.helpers import events


def test_a_time_limit_cuts_the_run_into_attempts_and_no_step_is_lost_or_trained_twice(time_limited):
    run_dir, submitted = time_limited.run_dir, time_limited.submitted
    try:
        # 40 minutes from its submission: on a busy machine attempts that start slowly get the early signal (Slurm's
        # 30 s tick) after a step or two (seen: 23 attempts).
        time_limited.cluster.completes(time_limited.job, run_dir, timeout=max(60.0, 2400 - (time.time() - submitted)))
    finally:
        time_limited.checked.touch()  # its cluster may go
    ended = [e for e in events(run_dir) if e["event"] == "attempt_ended"]
    assert len(ended) >= 4 and [e["outcome"] for e in ended] == ["REQUEUED"] * (len(ended) - 1) + ["COMPLETED"]
    requeued = [e for e in events(run_dir) if e["event"] == "requeued"]
    resumed = [e["step"] for e in events(run_dir) if e["event"] == "resumed"]
    assert all(e.get("by") == "signal" for e in requeued), requeued  # every rank saved; not submitit's rank 0
    assert [e["step"] for e in requeued] == resumed  # resumed exactly at the step each signal saved
    assert not any(e["event"] in ("failed", "retrying") for e in events(run_dir))
    trained = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()
               if not json.loads(line).get("final")]
    assert sorted(trained) == list(range(1, PACED_STEPS + 1))  # every step once: none lost, none trained twice
    print(f"{len(ended)} attempts of a 2-minute limit, resumed at steps {resumed}; "
          f"completed {time.time() - submitted:.0f} s after submission")
