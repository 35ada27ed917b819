"""Trackers (launcher/train/tracking.py) continue one curve across attempts: TensorBoard shows every step once, W&B
logs every attempt under the run's name by global step. The scalars are those of metrics.jsonl."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from launcher.compose.composer import compose_runs
from launcher.core.config import TRACKER_PACKAGES, RunConfig, tracker_missing
from launcher.core.metrics import decode
from launcher.errors import LaunchError
from support.helpers import wait_for
from support.tracker_files import tensorboard_scalars, wandb_attempts
from launcher.train.metrics import SCALARS, MetricsLog
from launcher.train.tracking import TRACKERS, open_tracker


def config(backend: str) -> RunConfig:
    """A run's config as composed for ``tracking=BACKEND``, named as the launcher names runs."""
    return compose_runs([f"tracking={backend}", "name=run-a1b2"])[0].config


def record(step: int, attempt: int) -> dict:
    return {"step": step, "loss": 10.0 - step / 10 + attempt, "eval_loss": None, "lr": 1e-3, "grad_norm": 0.5,
            "step_time": 0.01, "tokens_per_s": 1000.0 * attempt, "tokens_per_s_per_gpu": 500.0, "mfu": None,
            "peak_mem_gb": 0.25}


def attempt(cfg: RunConfig, run_dir, start: int, steps, number: int) -> None:
    """One attempt that resumes after ``start`` steps and logs ``steps``, then its final summary."""
    log = MetricsLog(run_dir / "metrics.jsonl", open_tracker(cfg, run_dir, start))
    for step in steps:
        log.write(decode(record(step, number)))
    log.write(decode({**record(steps[-1], number), "final": True, "tokens_per_s": 1.0}))
    log.close()


def test_every_backend_has_a_tracker():
    assert set(TRACKERS) == set(TRACKER_PACKAGES)


def test_tracking_none_writes_metrics_jsonl_alone(tmp_path):
    attempt(config("none"), tmp_path, 0, [10, 20], 1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert len((tmp_path / "metrics.jsonl").read_text().splitlines()) == 3


def test_tensorboard_curve_has_every_step_once_after_a_resume(tmp_path):
    cfg = config("tensorboard")
    attempt(cfg, tmp_path, 0, [10, 20, 30, 40], 1)  # steps 30 and 40 come after its checkpoint of 20
    attempt(cfg, tmp_path, 20, [30, 40, 50, 60], 2)  # resumed from that checkpoint: they are logged again
    curves = tensorboard_scalars(tmp_path / "tensorboard")
    assert set(curves) == {"train/loss", "train/lr", "train/grad_norm", "perf/step_time_s", "perf/tokens_per_s",
                           "perf/tokens_per_s_per_gpu", "system/peak_mem_gb"}  # eval/loss and mfu are None here
    assert sorted(curves["train/loss"]) == [10, 20, 30, 40, 50, 60]
    assert curves["perf/tokens_per_s"] == {10: 1000.0, 20: 1000.0, 30: 2000.0, 40: 2000.0, 50: 2000.0, 60: 2000.0}
    written = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = {r["step"]: r for r in written if not r.get("final")}  # the newest record of each step
    for key, (tag, _) in SCALARS.items():
        if tag in curves:
            assert curves[tag] == pytest.approx({s: r[key] for s, r in last.items()}, rel=1e-6), key


def test_wandb_attempts_share_the_run_id_and_log_by_global_step(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)  # a key from the secrets store: in no file afterwards
    cfg = config("wandb")
    attempt(cfg, tmp_path, 0, [10, 20, 30], 1)
    time.sleep(1.1)  # W&B names an offline run's directory by the second it starts; attempts are further apart
    attempt(cfg, tmp_path, 20, [30, 40], 2)
    # W&B's own service process writes the run files; on a loaded machine it may still be writing a moment after
    # finish() returned (seen in CI: the second file's run record not yet there).
    first, second = wait_for(lambda: (found := wandb_attempts(tmp_path / "wandb")) and len(found) == 2
                             and all(a["ids"] for a in found) and found, 30, "both W&B attempts' run records")
    assert first["ids"] == second["ids"] == {"run-a1b2"}
    assert sorted(first["history"]) == [10, 20, 30] and sorted(second["history"]) == [30, 40]
    assert second["history"][40]["train/loss"] == record(40, 2)["loss"]
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and b"k" * 40 in p.read_bytes()]


def test_a_missing_tracker_package_refuses_the_launch_in_one_line(tmp_path, monkeypatch):
    from launcher.submit.submitter import launch

    monkeypatch.setitem(TRACKER_PACKAGES, "wandb", "wandb_not_installed")
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path))
    with pytest.raises(LaunchError) as err:
        launch(compose_runs(["tracking=wandb"]), sweep=False)
    assert err.value.message == tracker_missing("wandb") and "tracking=wandb needs the wandb_not_installed" \
        in err.value.message and "\n" not in err.value.message
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(RuntimeError, match="tracking=wandb needs"):
        open_tracker(config("wandb"), tmp_path, 0)


def test_training_imports_no_tracker_package():
    code = "import sys, launcher.train.task; print(sorted({'wandb', 'tensorboard'} & set(sys.modules)))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "[]\n"
