"""On the local cluster: a job runs the code it was submitted with. A run launched from a checkout (a copy of
this repository, never the real tree) whose code is then broken keeps training, through a requeue, with the
frozen copy; describe names the commit and the dirty tree it came from."""
from __future__ import annotations

import json
import shutil

from support.helpers import REPO, events, git, job_id_of, run_launcher, wait_for

BROKEN = 'raise RuntimeError("edited after submission")\n'


def test_a_requeued_job_trains_with_the_code_it_was_submitted_with(slurm, tmp_path):
    repo, root = tmp_path / "checkout", tmp_path / "runs"
    for name in ("launcher", "conf"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-qm", "submitted")
    commit = git(repo, "rev-parse", "HEAD").strip()
    with open(repo / "launcher" / "train" / "task.py", "a") as f:
        f.write("# an uncommitted edit\n")
    env = {**slurm.env, "PYTHONPATH": str(repo), "LAUNCHER_RUN_ROOT": str(root)}
    launched = run_launcher("model=gpt_tiny", "gpus=2", "train.steps=300", "train.log_every=20",
                            "train.checkpoint_every=20", "name=frozen", cwd=repo, env=env)
    assert launched.returncode == 0, launched.stderr
    assert f"uncommitted changes since {commit[:12]} (launcher/train/task.py)" in launched.stdout
    job = job_id_of(launched.stdout)
    run_dir = root / "frozen"

    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 120, "checkpoint", interval=0.2)
    for module in ("launcher/train/loop.py", "launcher/job/entry.py", "launcher/job/recovery.py"):  # training would break now
        (repo / module).write_text(BROKEN + (repo / module).read_text())
    slurm.run("scontrol", "requeue", job)
    slurm.completes(job, run_dir, timeout=300)

    started = [e for e in events(run_dir) if e["event"] == "started"]
    assert len(started) == 2 and {e["code"] for e in started} == {str(run_dir / "code")}
    assert any(e["event"] == "resumed" for e in events(run_dir))
    assert "edited after submission" not in json.dumps(events(run_dir))
    final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    assert final["final"] and final["step"] == 300
    assert "an uncommitted edit" in (run_dir / "code" / "diff.patch").read_text()

    described = slurm.launcher("describe", "frozen", root=root).stdout
    assert f"Code: {run_dir / 'code'} from {repo} at commit {commit} (dirty: 1 file(s) changed" in described

