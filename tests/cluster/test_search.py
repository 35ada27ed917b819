"""Searches on the local cluster, gpt_tiny over train.lr.

6 trials, 2 in parallel: the launch submits 2 and returns; each trial's job, in its last step, reports it and
submits the next; no launcher process runs outside a job meanwhile. Trial 0's rank is SIGKILLed with no retry
left: it is reported failed and the search still ends with 6 trials; the best trial is the one with the lowest
eval_loss in the completed trials' own metrics.jsonl. A second search, one trial at a time with a pruner, tries a
good rate then a rate too small to learn: the second trial stops at its first evaluation, PRUNED.
And ``stop --sweep`` of a search: it stops the search, and no trial is submitted after it."""
from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

from support.helpers import events, paced, processes, rank_pids, record, runs_json, wait_for

TRIALS = 6


def outside_jobs(root: Path) -> list:
    """The processes whose command line names ``root`` and that no Slurm job started: no slurmstepd above them
    and no SLURM_JOB_ID in their environment. (The environment too: a cancelled trial's srun outlives its batch
    shell for a moment, and until it exits its parent is init.)"""
    return [f"{pid}: {' '.join(argv)} (parents: {parents(pid)})" for pid, environ, argv in processes()
            if str(root) in " ".join(argv) and "SLURM_JOB_ID" not in environ and not under_slurmstepd(pid)]


def parents(pid: int) -> str:
    chain = []
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        chain.append(f"{pid} {stat[stat.index('(') + 1:stat.rindex(')')]}")
        pid = int(stat[stat.rindex(")") + 2:].split()[1])
    return " < ".join(chain)


def under_slurmstepd(pid: int) -> bool:
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return True  # gone meanwhile: it was nothing's to judge
        name, ppid = stat[stat.index("(") + 1:stat.rindex(")")], int(stat[stat.rindex(")") + 2:].split()[1])
        if name == "slurmstepd":
            return True
        pid = ppid
    return False


def last_eval_loss(run_dir: Path) -> float:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [row["eval_loss"] for row in rows if row.get("eval_loss") is not None][-1]


def search_of(root: Path, search_id: str):
    from launcher.core.rundir import sweep_dir
    from launcher.search.study import load, open_study

    path = sweep_dir(root, search_id)
    return open_study(path, load(path))


def reported_trials(root: Path, count: int) -> list:
    """The run directories of the search's trials once ``count`` have reported; fails naming any launcher process
    found outside a job meanwhile."""
    def trials():
        return [p.parent for p in root.glob("*/trial.json")]

    def reported():
        stray = outside_jobs(root)
        assert not stray, f"launcher processes outside a job between trials: {stray}"
        done = [run for run in trials() if any(e["event"] == "trial_reported" for e in events(run))]
        return len(done) == count and done

    try:
        return wait_for(reported, 600, f"{count} trials reported", interval=0.5)
    except AssertionError as err:
        if "outside a job" in str(err):
            raise
        raise AssertionError("the search did not end; its trials' records:\n"
                             + "\n".join(record(run) for run in trials())) from None


def test_a_search_runs_its_trials_from_their_own_jobs_and_finds_the_lowest_loss(slurm, tmp_path):
    root = tmp_path / "runs"
    res = slurm.launcher("-m", "search=optuna", f"search.trials={TRIALS}", "search.parallel=2",
                         "search.metric=eval_loss", "train.lr=tag(log, interval(1e-4, 3e-2))", "model=gpt_tiny",
                         "gpus=1", "train.steps=4", "train.eval_every=2", "train.log_every=1", "cluster.max_retries=0",
                         f"run_root={root}", root=root, timeout=120, env=paced(1.0))
    # paced so that trial 0's rank is still there to kill when the test looks for it: four unpaced tiny steps
    # ended before a loaded machine's test found the rank
    assert res.returncode == 0, res.stderr
    search_id = re.search(r"Submitted search (\S+): trials 0, 1 of 6", res.stdout).group(1)
    killed = search_of(root, search_id).trials[0].user_attrs["run"]
    job = json.loads((root / killed / "run.json").read_text())["job_id"]
    pid = wait_for(lambda: rank_pids(root / killed, job).get(0), 120, f"trial 0's rank (job {job})", interval=0.05)
    os.kill(pid, signal.SIGKILL)

    runs = reported_trials(root, TRIALS)
    assert all(events(run)[-1]["event"] == "trial_reported" for run in runs)
    assert {json.loads((run / "run.json").read_text())["sweep"] for run in runs} == {search_id}
    assert {row["name"] for row in runs_json(slurm, root).values() if row.get("sweep") == search_id} \
        == {run.name for run in runs}

    study = search_of(root, search_id)
    assert [t.state.name for t in study.trials] == ["FAIL"] + ["COMPLETE"] * (TRIALS - 1)
    assert "killed" in study.trials[0].user_attrs["cause"], study.trials[0].user_attrs
    assert study.user_attrs["ended"] == f"all {TRIALS} trials ended"
    losses = {run.name: last_eval_loss(run) for run in runs if run.name != killed}
    best = min(losses, key=losses.get)
    assert study.best_trial.user_attrs["run"] == best and study.best_value == losses[best]
    assert not outside_jobs(root)


def test_a_trial_worse_than_the_median_is_pruned_before_its_last_step(slurm, tmp_path):
    root = tmp_path / "runs"
    res = slurm.launcher("-m", "search=optuna", "search.trials=2", "search.parallel=1", "search.pruner=median",
                         "search.startup_trials=1", "search.enqueue=[{train.lr:3e-2},{train.lr:1e-6}]",
                         "train.lr=tag(log, interval(1e-6, 3e-2))", "model=gpt_tiny", "gpus=1", "train.steps=8",
                         "train.warmup_steps=0", "train.eval_every=2", "train.log_every=1", f"run_root={root}",
                         root=root, timeout=120)
    assert res.returncode == 0, res.stderr
    search_id = re.search(r"Submitted search (\S+): trial 0 of 2", res.stdout).group(1)
    runs = {json.loads((run / "trial.json").read_text())["trial"]: run for run in reported_trials(root, 2)}

    study = search_of(root, search_id)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "PRUNED"]
    assert [t.params["train.lr"] for t in study.trials] == [3e-2, 1e-6]
    steps = [json.loads(line)["step"] for line in (runs[1] / "metrics.jsonl").read_text().splitlines()]
    assert max(steps) == 2 < 8  # stopped at its first evaluation
    assert study.trials[1].user_attrs["cause"] == "pruned at step 2"
    row = runs_json(slurm, root)[runs[1].name]
    assert (row["status"], row["reason"]) == ("COMPLETED", "pruned at step 2")


def test_stop_sweep_stops_the_search_and_no_trial_is_submitted_after_it(slurm, tmp_path):
    """3 trials, one at a time, each ~20 s of paced steps: ``stop --sweep`` while trial 0 trains marks the study
    stopped, cancels the job and tells trial 0 failed; no trial is submitted afterwards, though the cancelled job's
    batch script may still reach its last step."""
    root = tmp_path / "runs"
    # search.max_failures=2: trial 0's failure alone does not end the search; only the stop does.
    res = slurm.launcher("-m", "search=optuna", "search.trials=3", "search.parallel=1", "search.metric=loss",
                         "search.max_failures=2", "train.lr=tag(log, interval(1e-4, 3e-2))", "model=gpt_tiny",
                         "gpus=1", "train.steps=40", "train.log_every=1", f"run_root={root}", root=root, timeout=120,
                         env=paced(0.5))
    assert res.returncode == 0, res.stderr
    search_id = re.search(r"Submitted search (\S+): trials? 0 of 3", res.stdout).group(1)
    (first,) = [p.parent for p in root.glob("*/trial.json")]
    wait_for(lambda: (first / "metrics.jsonl").exists() and (first / "metrics.jsonl").read_text().strip(), 180,
             "trial 0 training", interval=0.5)

    stopped = slurm.launcher("stop", "--sweep", search_id, root=root, timeout=120)
    assert stopped.returncode == 0, stopped.stderr
    lines = stopped.stdout.splitlines()
    assert lines[0] == f"Stopped search {search_id}: it submits no more trials."
    cancelled = re.fullmatch(rf"Stopped {first.name} \(job (\d+)\) at step \d+: every rank saved it; .*", lines[2])
    assert cancelled and lines[1].startswith(f"Asked {first.name} "), stopped.stdout
    slurm.wait(cancelled.group(1), timeout=120)  # what its job could still submit (its batch shell), it has by now

    assert [p.parent for p in root.glob("*/trial.json")] == [first], "a trial was submitted after the stop"
    from launcher.core.rundir import sweep_dir
    from launcher.search.study import load, open_study
    from launcher.search.trials import STOPPED_BY

    path = sweep_dir(root, search_id)
    study = open_study(path, load(path))
    assert len(study.trials) == 1 and study.trials[0].state.name == "FAIL"
    assert study.trials[0].user_attrs["cause"].startswith("stopped"), study.trials[0].user_attrs
    assert "stopped" in study.user_attrs and study.user_attrs["ended"] == STOPPED_BY
    listed = slurm.launcher("runs", "--sweep", search_id, "--json", root=root)
    assert listed.returncode == 0, listed.stderr
    (row,) = json.loads(listed.stdout)
    assert (row["name"], row["trial"], row["trial_state"], row["value"]) == (first.name, 0, "FAIL", None)
    assert row["status"] == "CANCELLED" and set(row["params"]) == {"train.lr"}
    described = slurm.launcher("describe", search_id, root=root)
    assert f"ended: {STOPPED_BY}" in described.stdout, described.stdout + described.stderr
