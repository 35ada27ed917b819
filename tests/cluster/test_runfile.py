"""``launcher -f RUN_DIR/run.yaml`` on the local cluster runs a run again exactly; overrides win over it."""
from __future__ import annotations

import json

import yaml

from support.helpers import job_id_of


def submitted(res) -> str:
    assert res.returncode == 0, res.stderr
    return job_id_of(res.stdout)


def losses(run_dir):
    return [(r["step"], r["loss"]) for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
            if not r.get("final")]


def test_a_run_file_runs_the_run_again(slurm, tmp_path):
    first = slurm.launcher("model=gpt_tiny", "gpus=2", "train.steps=4", "train.log_every=1", "train.lr=0.002",
                           "name=first", root=tmp_path)
    assert slurm.wait(submitted(first), timeout=300) == "COMPLETED"
    run_file = tmp_path / "first" / "run.yaml"
    assert yaml.safe_load(run_file.read_text()) == {
        "model": "gpt_tiny", "gpus": 2, "cluster": "local", "tracking": "none",
        "train": {"steps": 4, "log_every": 1, "lr": 0.002}}
    assert f"-f {run_file}" in first.stdout  # the hint to run it again

    again = slurm.launcher("-f", str(run_file), "name=again", root=tmp_path)
    assert slurm.wait(submitted(again), timeout=300) == "COMPLETED"
    plans = [json.loads((tmp_path / name / "plan.json").read_text()) for name in ("first", "again")]
    assert [{k: v for k, v in plan.items() if k != "name"} for plan in plans] == [plans[0]] * 2
    assert losses(tmp_path / "again") == losses(tmp_path / "first") and len(losses(tmp_path / "first")) == 4
    assert (tmp_path / "again" / "run.yaml").read_text() == run_file.read_text()

    scaled = slurm.launcher("-f", str(run_file), "gpus=1", "train.steps=3", "dry_run=json", root=tmp_path)
    assert scaled.returncode == 0, scaled.stderr
    plan = json.loads(scaled.stdout)
    assert (plan["gpus"], plan["model"]) == (1, "gpt_tiny") and "train.steps=3" in plan["overrides"]
