"""The job's progress comment, set from the batch host (launcher/job/comment.py): the newest metrics record's
words, rate-limited, the final record at once, and it ends with the batch shell that started it."""
import json
import os
import subprocess
import sys

from omegaconf import OmegaConf

from support.helpers import REPO, wait_for
from launcher.core.config import ModelConfig, RunConfig, TrainConfig
from launcher.core.metrics import decode
from launcher.job.comment import EVERY_S, comment_text, follow


def test_the_comment_says_the_step_the_loss_and_the_speed():
    assert comment_text(None, 120) is None
    assert comment_text(decode({"step": 40, "loss": 3.21449, "tokens_per_s": 5120.4}), 120) == \
        "step 40/120 loss 3.214 tok/s 5120"
    assert comment_text(decode({"step": 40, "loss": 3.2}), 120) == "step 40/120 loss 3.200"
    assert comment_text(decode({"final": True, "step": 120, "loss": 2.75431, "tokens_per_s": 9.0}), 120) == \
        "done 120/120 loss 2.754"


def progress_scene(tmp_path):
    """A run directory (config and no metrics yet), an scontrol on PATH that logs its arguments, and the
    environment of a job's batch shell."""
    cfg = RunConfig(model=ModelConfig(name="gpt_tiny", d_model=64, n_heads=2, n_layers=2, seq_len=32), name="shown",
                    train=TrainConfig(steps=100))
    OmegaConf.save(OmegaConf.structured(cfg), tmp_path / "config.yaml", resolve=True)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77", "PYTHONPATH": str(REPO)}
    return calls, env


def write(run_dir, record):
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write(json.dumps(record) + "\n")


def test_the_comment_follows_the_metrics_and_sends_the_final_record_at_once(tmp_path):
    """The real follower (scontrol on PATH, the job's SLURM_JOB_ID): the first record at once (the attempt
    started), nothing more within the minute however many records come, then the final one, after which it ends."""
    calls, env = progress_scene(tmp_path)
    write(tmp_path, {"step": 1, "loss": 3.0, "tokens_per_s": 100.0})
    follower = subprocess.Popen([sys.executable, "-m", "launcher.job.comment", str(tmp_path)], env=env,
                                stderr=subprocess.PIPE, text=True)
    wait_for(lambda: calls.exists(), 30, "the first comment")
    for step in range(2, 31):
        write(tmp_path, {"step": step, "loss": 3.0, "tokens_per_s": 100.0})
    write(tmp_path, {"final": True, "step": 100, "loss": 2.5})
    assert follower.wait(timeout=30) == 0, follower.stderr.read()  # it ends once the final record is sent
    assert calls.read_text().splitlines() == ["update JobId=77 Comment=step 1/100 loss 3.000 tok/s 100",
                                              "update JobId=77 Comment=done 100/100 loss 2.500"]


def test_the_comment_keeper_ends_with_the_batch_shell(tmp_path):
    calls, env = progress_scene(tmp_path)
    write(tmp_path, {"step": 7, "loss": 3.0})
    shell = subprocess.run(["sh", "-c", f"{sys.executable} -m launcher.job.comment {tmp_path} & echo $!; sleep 2"],
                           env=env, capture_output=True, text=True, timeout=30)
    pid = int(shell.stdout.split()[0])
    wait_for(lambda: not os.path.exists(f"/proc/{pid}") or " Z " in open(f"/proc/{pid}/stat").read(), 10,
             "the comment keeper gone after its shell")
    assert calls.read_text() == "update JobId=77 Comment=step 7/100 loss 3.000\n"


def test_a_controller_that_refuses_costs_one_warning_and_no_failure(tmp_path):
    _, env = progress_scene(tmp_path)
    (tmp_path / "bin" / "scontrol").write_text(
        '#!/bin/sh\necho "scontrol: error: Unable to contact slurm controller" >&2\nexit 1\n')
    write(tmp_path, {"step": 7, "loss": 3.0})
    shell = subprocess.run(["sh", "-c", f"{sys.executable} -m launcher.job.comment {tmp_path} & sleep 3"],
                           env=env, capture_output=True, text=True, timeout=30)  # returns when the keeper has ended
    assert shell.returncode == 0
    assert shell.stderr.splitlines() == ["launcher.job.comment: cannot set the job's comment: scontrol: error: Unable "
                                         "to contact slurm controller"]


def test_in_steady_state_a_job_updates_its_comment_once_a_minute_and_at_once_when_it_ends(tmp_path):
    """Ten minutes of a record a second, on a fake clock: the first record at once (started), then one update a
    minute, and the final record at once (finished); each update is an RPC holding slurmctld's job write lock."""
    now, sent = [0.0], []

    def sleep(seconds):  # training goes on while the follower sleeps: a record each second
        for _ in range(int(seconds)):
            now[0] += 1
            step = int(now[0])
            write(tmp_path, {"step": step, "loss": 3.0} if step < 600 else {"final": True, "step": 600, "loss": 2.5})

    write(tmp_path, {"step": 0, "loss": 3.0})
    follow(tmp_path, "77", 600, send=lambda job, text: sent.append((now[0], text)), clock=lambda: now[0],
           sleep=sleep)
    times = [t for t, _ in sent]
    assert sent[0] == (0.0, "step 0/600 loss 3.000") and sent[-1][1] == "done 600/600 loss 2.500"
    assert all(b - a >= EVERY_S for a, b in zip(times[:-1], times[1:-1])), times  # none sooner than a minute
    assert len(sent) == 2 + 600 // 60 - 1, sent  # started, one a minute, finished (at 600 s, not a minute later)
