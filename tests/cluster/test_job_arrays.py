"""A grid sweep as one Slurm job array on the local cluster: every element is its run's own job (its directory,
logs, record and status), and stop and delete act on one element or on the whole sweep."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import yaml

from support.helpers import (UNTIL_STOPPED, batch_shell_pid, events, paced, preempt_after_a_checkpoint, rank_pids, runs_json,
                             wait_for, wait_status)
from support.helpers import events as read_events

TINY = ("model=gpt_tiny", "gpus=1")


def sweep_records(root: Path) -> list[dict]:
    return sorted((json.loads(p.read_text()) for p in root.glob("*/run.json")), key=lambda r: r["job_id"])


def test_an_array_grid_of_four_points_completes_with_four_run_directories(slurm, tmp_path):
    res = slurm.launcher("-m", *TINY, "train.steps=3", "train.log_every=1", "train.lr=1e-3,2e-3,3e-3,4e-3",
                         "sweep.parallel=2", root=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    records = sweep_records(tmp_path)
    array = records[0]["job_id"].split("_")[0]
    assert [r["job_id"] for r in records] == [f"{array}_{index}" for index in range(4)], records
    assert len({r["sweep"] for r in records}) == 1 and len({r["run_dir"] for r in records}) == 4
    assert "#SBATCH --array=0-3%2" in (tmp_path / records[0]["name"] / "sbatch.sh").read_text()
    for rec in records:
        assert rec["name"] in res.stdout and rec["job_id"] in res.stdout
        row = wait_status(slurm, tmp_path, rec["name"], {"COMPLETED", "FAILED", "CANCELLED"}, timeout=300)
        assert row["status"] == "COMPLETED", (row, (Path(rec["run_dir"]) / "events.jsonl").read_text())
    lrs = set()
    for index, rec in enumerate(records):
        run_dir = Path(rec["run_dir"])
        final = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
        assert final.get("final") and final["step"] == 3, final
        assert (run_dir / "logs" / "rank_0.log").is_file()
        assert (run_dir / "submitit" / f"{array}_{index}_0_log.err").is_file()  # the element's own batch log
        attempts = [e for e in read_events(run_dir)
                    if e["event"] == "attempt_ended"]
        assert [e["outcome"] for e in attempts] == ["COMPLETED"], attempts
        lrs.add(yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["lr"])
    assert lrs == {1e-3, 2e-3, 3e-3, 4e-3}  # each element ran its own point
    assert (tmp_path / ".sweeps" / records[0]["sweep"] / f"{array}_submission.sh").is_file()
    assert set(runs_json(slurm, tmp_path)) == {rec["name"] for rec in records}  # the sweep's folder is no run


def test_stop_of_one_element_leaves_the_others_running_and_the_sweep_stops_whole(slurm, tmp_path):
    res = slurm.launcher("-m", *TINY, "train.steps=100000", "train.lr=1e-3,2e-3,3e-3", "sweep.parallel=2",
                         root=tmp_path, timeout=120, env=UNTIL_STOPPED)
    assert res.returncode == 0, res.stderr
    first, second, third = sweep_records(tmp_path)
    for rec in (first, second):
        wait_status(slurm, tmp_path, rec["name"], {"RUNNING"}, timeout=120)
    assert runs_json(slurm, tmp_path)[third["name"]]["status"] == "PENDING"  # sweep.parallel=2

    stopped = slurm.launcher("stop", first["name"], root=tmp_path)
    assert f"Stopped {first['name']} (job {first['job_id']}) at step " in stopped.stdout, stopped.stderr
    assert wait_status(slurm, tmp_path, first["name"], {"CANCELLED", "FAILED"})["status"] == "CANCELLED"
    wait_status(slurm, tmp_path, third["name"], {"RUNNING"}, timeout=120)  # its turn, now that one is stopped
    assert runs_json(slurm, tmp_path)[second["name"]]["status"] == "RUNNING"

    stopped = slurm.launcher("stop", "--sweep", first["sweep"], root=tmp_path)
    assert stopped.returncode == 0, stopped.stderr
    for rec in (second, third):
        assert wait_status(slurm, tmp_path, rec["name"], {"CANCELLED", "FAILED"})["status"] == "CANCELLED"
    deleted = slurm.launcher("delete", "--yes", "--sweep", first["sweep"], root=tmp_path, timeout=120)
    assert deleted.returncode == 0, deleted.stderr
    assert runs_json(slurm, tmp_path) == {}


def test_a_killed_rank_of_one_element_is_retried_as_a_plain_job_of_that_run(slurm, tmp_path):
    """The element's attempt is judged from its own batch log (srun names the killed rank there), its retry is a
    job of its own that the run's record follows, and the other element is not touched."""
    res = slurm.launcher("-m", "model=gpt_tiny", "gpus=2", "train.steps=100", "train.log_every=10",
                         "train.checkpoint_every=10", "train.lr=1e-3,2e-3", root=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    victim, other = sweep_records(tmp_path)
    run_dir = Path(victim["run_dir"])
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    queue = slurm.run("squeue", "-h", "-O", "JobArrayID:|,JobID:|").stdout.splitlines()
    own = next(line.split("|")[1] for line in queue if line.split("|")[0] == victim["job_id"])
    os.kill(wait_for(lambda: rank_pids(run_dir, own).get(1), 30, "rank 1"), signal.SIGKILL)

    ended = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"], 60, "attempt end")[0]
    assert (ended["outcome"], ended["rank"], ended["short"]) == ("FAILED", 1, "rank 1 killed"), ended
    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 30, "retry")[0]
    assert "_" not in retry["job_id"] and json.loads((run_dir / "run.json").read_text())["job_id"] == retry["job_id"]
    slurm.completes(retry["job_id"], run_dir, timeout=400)
    for rec in (victim, other):
        assert wait_status(slurm, tmp_path, rec["name"], {"COMPLETED", "FAILED"}, timeout=300)["status"] == "COMPLETED"
    assert [e["event"] for e in events(Path(other["run_dir"]))].count("attempt") == 1


def test_an_elements_batch_shell_killed_is_judged_by_the_arrays_watcher_once_the_array_ended(slurm, tmp_path):
    """One watcher for the array (every element's record names it): with one element's batch shell SIGKILLed, Slurm
    starts it once the other element has completed, and it records the dead one's cause and retries it."""
    res = slurm.launcher("-m", *TINY, "train.steps=60", "train.log_every=5", "train.checkpoint_every=10",
                         "train.lr=1e-3,2e-3", root=tmp_path, timeout=120, env=paced(0.15))
    # paced so that the kill, after the first checkpoint (step 10), lands well before the run's end (step 60): at
    # 0.05 s a step a loaded machine let the run finish first
    assert res.returncode == 0, res.stderr
    victim, other = sweep_records(tmp_path)
    watching = [[e for e in events(Path(rec["run_dir"])) if e["event"] == "watching"] for rec in (victim, other)]
    assert [[(e["job_id"], e["refused"]) for e in seen] for seen in watching] == [
        [(victim["job_id"], None)], [(other["job_id"], None)]] and watching[0][0]["watcher"] == watching[1][0]["watcher"]
    run_dir = Path(victim["run_dir"])
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    queue = slurm.run("squeue", "-h", "-O", "JobArrayID:|,JobID:|").stdout.splitlines()
    own = next(line.split("|")[1] for line in queue if line.split("|")[0] == victim["job_id"])
    os.kill(batch_shell_pid(run_dir, own), signal.SIGKILL)
    seen = []  # what `runs --json` says of the element from the kill until after its retry: never a final state

    def retried():
        done = any(e["event"] == "retrying" for e in events(run_dir))  # before the reading: one reading after it
        row = runs_json(slurm, tmp_path)[run_dir.name]
        seen.append((row["status"], row.get("reason")))
        return done
    wait_for(retried, 240, "the retry, seen by `runs`", interval=1, patient=True)
    statuses = {status for status, _ in seen}
    assert statuses <= {"RUNNING", "RECOVERING"} and "RECOVERING" in statuses, seen

    ended = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"], 240, "attempt end")[0]
    assert (ended["job_id"], ended["fault"]) == (own, "batch step died"), ended  # the element's own job id
    assert ended["cause"].startswith("the job's batch step died: killed by SIGKILL"), ended
    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 60, "retry")[0]
    slurm.completes(retry["job_id"], run_dir, timeout=300)
    assert [e["outcome"] for e in events(Path(other["run_dir"])) if e["event"] == "attempt_ended"] == ["COMPLETED"]


def test_a_preempted_element_is_requeued_as_itself_and_resumes(slurm, tmp_path):
    """Slurm's USR2 to element 0: its ranks save, its batch shell requeues it (by its own job id, found in the
    queue as the element it is), and it resumes under the same element name to completion."""
    res = slurm.launcher("-m", *TINY, "train.steps=100", "train.log_every=10", "train.checkpoint_every=10",
                         "train.lr=1e-3,2e-3", root=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    preempted, other = sweep_records(tmp_path)
    run_dir = Path(preempted["run_dir"])
    preempt_after_a_checkpoint(slurm, (run_dir, preempted["job_id"]))
    for rec in (preempted, other):
        assert wait_status(slurm, tmp_path, rec["name"], {"COMPLETED", "FAILED"}, timeout=300)["status"] == "COMPLETED"
    outcomes = [e["outcome"] for e in events(run_dir) if e["event"] == "attempt_ended"]
    assert outcomes == ["REQUEUED", "COMPLETED"], outcomes
    assert json.loads((run_dir / "run.json").read_text())["job_id"] == preempted["job_id"]  # the same element
