"""The job's progress comment, set from the batch host (launcher/job/comment.py): the newest metrics record's
words, rate-limited, the final record at once, and it ends with the batch shell that started it."""
import json
import os
import subprocess
import sys
import time

from omegaconf import OmegaConf

from support.helpers import REPO, wait_for
from launcher.core.config import ModelConfig, RunConfig, TrainConfig
from launcher.job.comment import comment_text


def test_the_comment_says_the_step_the_loss_and_the_speed():
    assert comment_text(None, 120) is None
    assert comment_text({"step": 40, "loss": 3.21449, "tokens_per_s": 5120.4}, 120) == \
        "step 40/120 loss 3.214 tok/s 5120"
    assert comment_text({"step": 40, "loss": 3.2}, 120) == "step 40/120 loss 3.200"
    assert comment_text({"final": True, "step": 120, "loss": 2.75431, "tokens_per_s": 9.0}, 120) == \
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
    calls, env = progress_scene(tmp_path)
    follower = subprocess.Popen([sys.executable, "-m", "launcher.job.comment", str(tmp_path)], env=env,
                                stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    for step in range(1, 31):  # 30 records in 3 s: rate-limited to one send every 5 s
        write(tmp_path, {"step": step, "loss": 3.0, "tokens_per_s": 100.0})
        time.sleep(0.1)
    write(tmp_path, {"final": True, "step": 100, "loss": 2.5})
    assert follower.wait(timeout=15) == 0, follower.stderr.read()  # it ends once the final record is sent
    took = time.monotonic() - started
    sent = calls.read_text().splitlines()
    assert sent[0].startswith("update JobId=77 Comment=step ")
    assert sent[-1] == "update JobId=77 Comment=done 100/100 loss 2.500"
    assert len(sent) <= 2 + took / 5, (sent, took)


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
