"""The Slurm job comment: rank 0 only, never blocks the loop, sends the latest text, rate-limited."""
import os
import stat
import time

from train.progress import JobComment, job_comment


def fake_scontrol(tmp_path, monkeypatch, delay_s):
    """An scontrol that takes ``delay_s`` and logs its arguments, one call per line."""
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    script.write_text(f'#!/bin/sh\nsleep {delay_s}\necho "$@" >> {calls}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    return calls


def test_updates_never_wait_and_the_last_one_wins(tmp_path, monkeypatch):
    calls = fake_scontrol(tmp_path, monkeypatch, delay_s=0.3)
    comment = JobComment("4242", min_interval_s=0.5)
    start = time.monotonic()
    for step in range(1, 101):
        comment.update(f"step {step}/100 loss 3.21 tok/s 1234")
        time.sleep(0.01)
    assert time.monotonic() - start < 1.5 + 0.5  # 100 updates, each returning at once
    comment.close()
    sent = calls.read_text().splitlines()
    assert sent[0].startswith("update JobId=4242 Comment=step ")
    assert sent[-1] == "update JobId=4242 Comment=step 100/100 loss 3.21 tok/s 1234"
    assert 2 <= len(sent) <= 5  # rate-limited: ~1.5 s of updates at most every 0.5 s, plus the last


def test_only_rank_0_of_a_slurm_job(tmp_path, monkeypatch):
    calls = fake_scontrol(tmp_path, monkeypatch, delay_s=0)
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    other = job_comment(is_main=False)
    other.update("step 1/2")
    other.close()
    monkeypatch.delenv("SLURM_JOB_ID")
    outside = job_comment(is_main=True)
    outside.update("step 1/2")
    outside.close()
    assert not calls.exists()
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    main = job_comment(is_main=True)
    main.update("step 2/2")
    main.close()
    assert calls.read_text() == "update JobId=7 Comment=step 2/2\n"
