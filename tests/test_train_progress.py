"""The Slurm job comment: rank 0 only, never blocks the loop, sends the latest text, rate-limited."""
import os
import stat
import time

from launcher.train.progress import JobComment, job_comment


def fake_scontrol(tmp_path, monkeypatch, delay_s, until=None):
    """An scontrol that takes ``delay_s`` (or, given ``until``, waits until that file exists, 30 s at most)
    and then logs its arguments, one call per line."""
    calls = tmp_path / "calls"
    script = tmp_path / "bin" / "scontrol"
    script.parent.mkdir()
    wait = f"for i in $(seq 300); do [ -e {until} ] && break; sleep 0.1; done\n" if until else ""
    script.write_text(f'#!/bin/sh\n{wait}sleep {delay_s}\necho "$@" >> {calls}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{script.parent}:{os.environ['PATH']}")
    return calls


def test_updates_never_wait_for_scontrol(tmp_path, monkeypatch):
    release = tmp_path / "release"
    calls = fake_scontrol(tmp_path, monkeypatch, delay_s=0, until=release)
    comment = JobComment("4242", min_interval_s=0.5)
    start = time.monotonic()
    for step in range(1, 101):
        comment.update(f"step {step}/100 loss 3.21 tok/s 1234")
    took = time.monotonic() - start
    assert not calls.exists()  # 100 updates returned while the first scontrol was still waiting
    release.touch()
    comment.close()
    assert calls.read_text().splitlines()[-1] == "update JobId=4242 Comment=step 100/100 loss 3.21 tok/s 1234"
    print(f"100 updates with scontrol blocked: {took * 1000:.1f} ms")


def test_updates_are_rate_limited_and_the_last_one_wins(tmp_path, monkeypatch):
    calls = fake_scontrol(tmp_path, monkeypatch, delay_s=0.3)
    comment = JobComment("4242", min_interval_s=0.5)
    start = time.monotonic()
    for step in range(1, 101):
        comment.update(f"step {step}/100 loss 3.21 tok/s 1234")
        time.sleep(0.01)  # the pace of a training loop's steps: the rate limit is over time
    took = time.monotonic() - start
    comment.close()
    sent = calls.read_text().splitlines()
    assert sent[0].startswith("update JobId=4242 Comment=step ")
    assert sent[-1] == "update JobId=4242 Comment=step 100/100 loss 3.21 tok/s 1234"
    # Rate-limited: at most one send every 0.5 s of the updates, plus the first and the last.
    assert 2 <= len(sent) <= 2 + took / 0.5, (len(sent), took)
    print(f"{len(sent)} sends for 100 updates over {took:.2f} s")


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
