"""The status commands against real jobs on the local cluster (and a second one without accounting)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from support.helpers import (UNTIL_STOPPED, cluster_port, events, launch, paced, run_down, run_name, run_up, runs_json,
                             wait_for, wait_status)


def submit(slurm, root, *args, env=None):
    """Launch a gpt_tiny run; return its (generated) name and job id."""
    job = launch(slurm, root, "model=gpt_tiny", *args, env=env)
    return run_name(root, job), job


def cmd(slurm, root, *args, env=None, timeout=60):
    res = slurm.launcher(*args, root=root, env=env, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return res.stdout


def test_run_goes_through_states_and_matches_its_metrics(slurm, tmp_path):
    name, _ = submit(slurm, tmp_path, "gpus=4", "train.steps=20", "train.log_every=5")
    first = runs_json(slurm, tmp_path)[name]
    assert first["status"] in ("PENDING", "RUNNING")
    row = wait_status(slurm, tmp_path, name, {"COMPLETED", "FAILED"})
    assert row["status"] == "COMPLETED", row
    records = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    last = records[-1]
    assert (row["step"], row["steps"], row["loss"]) == (last["step"], 20, last["loss"])
    table = cmd(slurm, tmp_path, "runs")
    line = next(line for line in table.splitlines() if line.startswith(name))
    assert "COMPLETED" in line and "20/20 (100%)" in line and f"{last['loss']:.4f}" in line and "2x2" in line

    # logs --rank 3 shows rank 3's lines, and only those, under the heading of the attempt they began in.
    logs = cmd(slurm, tmp_path, "logs", name, "--rank", "3").strip().splitlines()
    assert logs[0].startswith("==== attempt 1 (job ") and all(" rank3 " in line for line in logs[1:])
    assert any("rank 3/4" in line for line in logs)

    described = cmd(slurm, tmp_path, "describe", name[:12])
    assert f"Run {name}: Slurm job" in described and "finished" in described and "step_00000020" in described


def test_watch_into_a_pipe_follows_a_run_to_its_end_in_plain_text(slurm, tmp_path):
    name, _ = submit(slurm, tmp_path, "gpus=1", "train.steps=20", "train.log_every=5")
    out = cmd(slurm, tmp_path, "runs", "--watch", "--interval", "1", timeout=300)  # returns by itself
    assert "\x1b" not in out
    frames = out.strip().split("\n\n")
    assert len(frames) >= 2 and "1 of 1 runs active" in frames[0]
    assert re.search(rf"^{name} .* (PENDING|RUNNING) ", frames[0], re.M)
    assert "no run active: final table" in frames[-1] and re.search(rf"^{name} .* COMPLETED .* 20/20", frames[-1], re.M)


def local_partitions(slurm, tmp_path) -> list:
    """The partitions ``clusters --json`` lists for the local cluster."""
    clusters = json.loads(cmd(slurm, tmp_path, "clusters", "--json"))
    return next(c["partitions"] for c in clusters if c["cluster"] == "local")


def test_stop_cancels_frees_gpus_and_delete_removes(own_cluster, tmp_path):
    clusters = local_partitions(own_cluster, tmp_path)
    assert [(c["name"], c["nodes_idle"] + c["nodes_allocated"], c["gpus_total"]) for c in clusters] == [("gpu", 2, 16)]
    idle_free = clusters[0]["gpus_free"]

    name, job_id = submit(own_cluster, tmp_path, "gpus=2", "train.steps=100000", env=UNTIL_STOPPED)
    wait_status(own_cluster, tmp_path, name, {"RUNNING"})
    busy = local_partitions(own_cluster, tmp_path)[0]
    assert busy["gpus_free"] == idle_free - 2
    assert "RUNNING" in cmd(own_cluster, tmp_path, "runs", "--status", "running")
    wait_for(lambda: (tmp_path / name / "metrics.jsonl").exists(), 120, "training")

    assert f"Stopped {name} (job {job_id}) at step " in cmd(own_cluster, tmp_path, "stop", name)
    assert wait_status(own_cluster, tmp_path, name, {"CANCELLED", "FAILED"})["status"] == "CANCELLED"
    # asked, every rank saved and ended: no SIGTERM reached any, let alone one from outside Slurm
    assert not [e for e in events(tmp_path / name) if e["event"] in ("signalled", "terminated")]
    assert (tmp_path / name / "config.yaml").exists()  # stop keeps the files

    assert f"Deleted {name}." in cmd(own_cluster, tmp_path, "delete", "--yes", name)
    assert not (tmp_path / name).exists()
    assert name not in runs_json(own_cluster, tmp_path)


def test_a_run_waiting_for_gpus_says_why_in_words_and_when_slurm_expects_it(own_cluster, tmp_path):
    """Every GPU held by another job (a plain sbatch): the run pends for Resources, and runs, describe and logs say
    how many GPUs it waits for, how many of the partition's are in use, and Slurm's expected start where it has one."""
    hog = own_cluster.run("sbatch", "--parsable", "-N2", "--gres=gpu:8", "-t", "30", "-o", "/dev/null",
                          "--wrap", "sleep 600").stdout.strip()
    try:
        wait_for(lambda: own_cluster.run("squeue", "-h", "-j", hog, "-o", "%T").stdout.strip() == "RUNNING", 60,
                 "every GPU held")
        name, job_id = submit(own_cluster, tmp_path, "gpus=2", "train.steps=10")
        waiting = "waiting for 2 GPUs on partition 'gpu': 16 of its 16 are in use; it starts when other jobs end"
        def in_words():
            row = runs_json(own_cluster, tmp_path)[name]
            return row if row["reason"].startswith(waiting) else None

        row = wait_for(in_words, 60, "the reason in words", patient=True)
        assert row["status"] == "PENDING", row
        start = own_cluster.run("squeue", "-h", "-j", job_id, "-O", "StartTime").stdout.strip()
        expected = start[:4].isdigit() and time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S")) > time.time()
        if expected:  # the backfill pass may have planned it between the listing and squeue's answer: list again
            row = wait_for(lambda: (r := runs_json(own_cluster, tmp_path)[name])["reason"].count(
                "; Slurm expects it to start at ") and r, 30, "the expected start", patient=True)
        assert ("; Slurm expects it to start at " in row["reason"]) == expected, (start, row["reason"])
        assert f"PENDING ({waiting[:50]}" in cmd(own_cluster, tmp_path, "runs")  # cut to fit the table
        described = cmd(own_cluster, tmp_path, "describe", name)
        assert f"Status: PENDING ({waiting}" in described and "\nNodes: none yet\n" in described
        logs = own_cluster.launcher("logs", name, root=tmp_path)
        assert f"(no output from rank 0 yet; job {job_id} is PENDING: {waiting}" in logs.stderr, logs.stderr
    finally:
        own_cluster.run("scancel", hog)


def test_a_tasks_python_that_cannot_be_executed_is_named_by_runs_describe_and_logs(slurm, tmp_path):
    """The tasks' Python passed the launch's check, then lost its execute bit before the job started: nothing of the
    launcher's can run on the cluster to record why, so the status commands read it from the job's own output."""
    wrapper = tmp_path / "bin" / "python"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    wrapper.chmod(0o755)
    name, job_id = submit(slurm, tmp_path, "gpus=2", "train.steps=5", f"cluster.python={wrapper}",
                          "+cluster.sbatch_flags.hold=true")
    wrapper.chmod(0o644)
    slurm.run("scontrol", "release", job_id)
    assert slurm.wait(job_id, timeout=120) == "FAILED"
    cause = f"cannot execute {wrapper}: Permission denied"
    row = wait_status(slurm, tmp_path, name, {"FAILED"})
    assert row["reason"].startswith("exit code 126") and row["reason"].endswith(cause), row
    assert f"Status: FAILED (exit code 126:0: {cause})" in cmd(slurm, tmp_path, "describe", name)
    logs = slurm.launcher("logs", name, root=tmp_path)
    assert "==> the end of rank 0's stderr (" in logs.stdout and f"execve(): {wrapper}: Permission denied" in logs.stdout


def test_a_job_killed_before_writing_anything_is_never_running(slurm, tmp_path):
    name, job_id = submit(slurm, tmp_path, "gpus=2", "train.steps=100000", env=UNTIL_STOPPED)
    slurm.run("scancel", "--signal=KILL", "--full", job_id)  # SIGKILL to every task, at once
    slurm.wait(job_id, timeout=60)
    row = wait_status(slurm, tmp_path, name, {"FAILED", "CANCELLED"}, timeout=30)
    assert row["status"] in ("FAILED", "CANCELLED")
    start = time.time()
    cmd(slurm, tmp_path, "logs", name, "--follow", timeout=30)  # returns (within the timeout): the job is over
    print(f"logs --follow returned after {time.time() - start:.2f} s")


def test_twenty_concurrent_launches_give_twenty_records(slurm, tmp_path):
    def one(_):
        return slurm.launcher("gpus=1", "train.steps=1", "+cluster.sbatch_flags.hold=true", root=tmp_path, timeout=120)

    with ThreadPoolExecutor(20) as pool:
        results = list(pool.map(one, range(20)))
    assert [r.returncode for r in results] == [0] * 20, [r.stderr for r in results if r.returncode]
    records = [json.loads(p.read_text()) for p in tmp_path.glob("*/run.json")]
    slurm.run("scancel", *[r["job_id"] for r in records])
    assert len(records) == 20
    assert len({r["name"] for r in records}) == 20 and len({r["job_id"] for r in records}) == 20


@pytest.fixture(scope="module")
def cluster_without_accounting(slurm, tmp_path_factory):
    """A second local cluster without slurmdbd, whose squeue forgets finished jobs after 2 s."""
    state = tmp_path_factory.mktemp("noacct")
    port = cluster_port("noacct")
    up = run_up("--dir", str(state), "--name", f"noacct{port}", "--port", str(port), "--nodes", "1", "--gpus", "2",
                "--no-accounting", "--min-job-age", "2")
    assert up.returncode == 0, up.stderr
    yield {"SLURM_CONF": str(state / "etc" / "slurm.conf")}
    run_down(state)


def test_without_accounting_state_comes_from_squeue_then_the_run_directory(slurm, tmp_path, cluster_without_accounting):
    env = cluster_without_accounting
    conf = f"cluster.slurm_conf={env['SLURM_CONF']}"
    # Each run in a root of its own: a listing of the held run must not list the finished one while squeue still
    # knows it (a listing keeps a settled squeue answer in the run's directory).
    done_root, held_root = tmp_path / "done", tmp_path / "held"
    res = slurm.launcher("model=gpt_tiny", "gpus=1", "train.steps=2", conf, root=done_root, env=env)
    assert res.returncode == 0, res.stderr
    done = re.search(r"Submitted (\S+)", res.stdout).group(1)
    res = slurm.launcher("model=gpt_tiny", "gpus=1", "train.steps=100000", conf, "+cluster.sbatch_flags.hold=true",
                         root=held_root, env=env)
    held = re.search(r"Submitted (\S+) as Slurm job (\d+)", res.stdout)

    row = runs_json(slurm, held_root, env)[held.group(1)]
    assert (row["status"], row["state_source"]) == ("PENDING", "squeue")
    assert row["reason"] == f"held by its owner; release it with 'scontrol release {held.group(2)}'"
    subprocess.run(["scancel", held.group(2)], env={**slurm.env, **env}, check=True)
    cancelled_at = time.time()

    # Once squeue has forgotten the finished job, only the run directory can tell.
    done_job = json.loads((done_root / done / "run.json").read_text())["job_id"]

    def queued():
        return subprocess.run(["squeue", "-h", "-a", "--states=all", "-o", "%i"], env={**slurm.env, **env},
                              capture_output=True, text=True).stdout.split()

    wait_for(lambda: done_job not in queued() and any(e["event"] == "finished" for e in events(done_root / done)),
             120, f"job {done_job} forgotten by squeue, its run finished")
    wait_for(lambda: held.group(2) not in queued(), 60, f"cancelled job {held.group(2)} forgotten by squeue")
    print(f"squeue forgot both jobs {time.time() - cancelled_at:.1f} s after the scancel")
    row = runs_json(slurm, done_root, env)[done]
    assert (row["status"], row["state_source"]) == ("COMPLETED", "run directory")
    # Cancelled outside the launcher and forgotten by squeue: it left no final record, so UNKNOWN.
    row = runs_json(slurm, held_root, env)[held.group(1)]
    assert row["status"] == "UNKNOWN" and "no final record" in row["reason"], row


def test_a_run_json_cut_in_half_while_the_run_trains_is_rebuilt_and_mended_by_its_end(slurm, tmp_path):
    res = slurm.launcher("model=gpt_tiny", "gpus=2", "train.steps=60", "train.log_every=5", "name=torn", root=tmp_path,
                         env=paced(0.5))  # 30 s: a loaded machine's runs and describe (seconds each) come before its end
    assert res.returncode == 0, res.stderr
    job = re.search(r"as Slurm job (\d+)", res.stdout).group(1)
    record = tmp_path / "torn" / "run.json"
    whole = json.loads(record.read_text())
    wait_for(lambda: (tmp_path / "torn" / "metrics.jsonl").exists(), 120, "training")
    text = record.read_text()
    record.write_text(text[: len(text) // 2])  # as a disk that filled up mid-write would leave it
    row = runs_json(slurm, tmp_path)["torn"]
    assert row["job_id"] == job and row["status"] in ("PENDING", "RUNNING", "COMPLETED"), row  # not DAMAGED
    assert "record rebuilt from events.jsonl and plan.json: run.json is not valid JSON" in row["reason"], row
    described = slurm.launcher("describe", "torn", root=tmp_path)
    assert described.returncode == 0 and "Record: rebuilt from events.jsonl and plan.json" in described.stdout
    slurm.completes(job, tmp_path / "torn")
    mended = json.loads(record.read_text())  # the job's end step wrote it whole again
    assert {k: mended[k] for k in ("name", "job_id", "model", "gpus", "nodes", "steps")} == \
        {k: whole[k] for k in ("name", "job_id", "model", "gpus", "nodes", "steps")}
    row = runs_json(slurm, tmp_path)["torn"]
    assert (row["status"], row["step"], "rebuilt" in row["reason"]) == ("COMPLETED", 60, False), row
