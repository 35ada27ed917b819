"""One job of a run at a time (launcher/job/claim.py), on the real cluster: two ``launcher resume`` at the same
moment give one job, a job that finds another job of its run alive ends without training, and the claim of a
killed job does not block the next resume."""
from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor

from support.helpers import events, job_id_of, losses, paced, wait_for

RUN = ("model=gpt_tiny", "gpus=2", "train.steps=60", "train.checkpoint_every=10", "train.log_every=5")


def resume_at_once(slurm, root, name: str, count: int) -> list[subprocess.CompletedProcess]:
    """``count`` ``launcher resume NAME`` started together, as a script or a button clicked twice would."""
    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(lambda _: slurm.launcher("resume", name, root=root), range(count)))


def test_two_resumes_at_once_give_one_job_and_a_second_job_of_the_run_does_not_train(slurm, tmp_path):
    res = slurm.launcher(*RUN, "name=twice", root=tmp_path, env={"LAUNCHER_FAULT": "raise@25"})
    first = job_id_of(res.stdout)
    assert slurm.wait(first, timeout=120) == "FAILED"
    run_dir = tmp_path / "twice"
    wait_for(lambda: [e for e in events(run_dir) if e["event"] == "failed" and e.get("final")], 30, "verdict")

    results = resume_at_once(slurm, tmp_path, "twice", 2)
    won = [r for r in results if r.returncode == 0]
    lost = [r for r in results if r.returncode != 0]
    assert len(won) == 1 and len(lost) == 1, [(r.returncode, r.stdout, r.stderr) for r in results]
    job = job_id_of(won[0].stdout)
    refusal = lost[0].stderr.strip().splitlines()
    assert len(refusal) == 1 and "twice already has" in refusal[0] and "one job of a run at a time" in refusal[0], \
        refusal
    assert f"job {job}" in refusal[0] or "a submission by resume" in refusal[0], refusal

    # The run's own job script submitted again by hand while the run's job is alive: its begin step finds the
    # claim held and the job ends before srun, neither training nor judging an attempt.
    wait_for(lambda: slurm.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING", 60, "running")
    script = run_dir / "submitit" / f"{job}_submission.sh"
    duplicate = slurm.run("sbatch", "--parsable", str(script)).stdout.strip().split(";")[0]
    assert slurm.wait(duplicate, timeout=120) == "FAILED"
    assert slurm.run("sacct", "-n", "-X", "-P", "-o", "ExitCode", "-j", duplicate).stdout.split() == ["3:0"]
    slurm.completes(job, run_dir, timeout=300)
    refused = [e for e in events(run_dir) if e["event"] == "duplicate_job"]
    assert [(e["job_id"], e["holder"]) for e in refused] == [(duplicate, job)], refused
    assert f"job {duplicate} did not train: twice already has job {job} (RUNNING)" in refused[0]["cause"]
    attempts = [e["job_id"] for e in events(run_dir) if e["event"] == "attempt"]
    assert attempts == [first, job]  # the duplicate recorded no attempt and judged none
    assert [e["job_id"] for e in events(run_dir) if e["event"] == "resubmitted"] == [job]
    assert max(losses(run_dir)) == 60


def test_the_claim_of_a_cancelled_job_does_not_block_the_next_resume(slurm, tmp_path):
    res = slurm.launcher(*RUN, "name=stale", root=tmp_path, env=paced(0.2))
    job = job_id_of(res.stdout)
    run_dir = tmp_path / "stale"
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    busy = slurm.launcher("resume", "stale", root=tmp_path)
    assert busy.returncode != 0 and "stale is RUNNING" in busy.stderr, busy.stderr
    slurm.run("scancel", "-s", "KILL", job)  # the job dies without a word of its own
    assert slurm.wait(job, timeout=60) == "CANCELLED"
    resumed = slurm.launcher("resume", "stale", root=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    slurm.completes(job_id_of(resumed.stdout), run_dir, timeout=300)
    assert max(losses(run_dir)) == 60
