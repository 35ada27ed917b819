"""Faults of the cluster itself, caused on the suite's second local cluster (``three`` in conftest.py): a node
lost mid-run (its slurmd killed; with its ranks, before Slurm notices), the controller stopped mid-run, and a
retry the controller refuses."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

from support.helpers import SLURMD_TIMEOUT_S
from support.helpers import REPO, events, launch, losses, paced, rank_pids, wait_for

RUN = ("model=gpt_tiny", "train.log_every=10")
# A run that loses a node: one rank on each of two nodes (a step of two gloo ranks costs a third of four's CPU), its
# first checkpoint at 25, the loss after it.
STEPS, CHECKPOINT_EVERY = 200, 25
TWO_NODES = ("gpus=2", "layout.nodes=2", f"train.steps={STEPS}", f"train.checkpoint_every={CHECKPOINT_EVERY}")


def stop_daemon(pidfile: Path, how: signal.Signals = signal.SIGKILL) -> tuple[list[str], dict]:
    """Signal a daemon of the test's own cluster and wait until it is gone; return its command line and
    environment to start it again."""
    pid = int(pidfile.read_text())
    proc = Path(f"/proc/{pid}")
    argv = proc.joinpath("cmdline").read_text().split("\0")[:-1]
    env = dict(item.split("=", 1) for item in proc.joinpath("environ").read_text().split("\0") if "=" in item)
    os.kill(pid, how)
    wait_for(lambda: not proc.exists() or "Z" in proc.joinpath("stat").read_text().split()[2], 60, "daemon gone")
    return argv, env


def start_daemon(pidfile: Path, argv: list[str], env: dict, log: Path) -> None:
    """Start a daemon again as slurm/up.sh does (its own session, its pid where slurm/down.sh finds it)."""
    with open(log, "a") as out:
        daemon = subprocess.Popen(argv, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                  start_new_session=True)
    pidfile.write_text(f"{daemon.pid}\n")


def back(cluster, node: str) -> None:
    """Wait until a node whose slurmd was started again takes jobs (Slurm returns it to service)."""
    wait_for(lambda: cluster.run("sinfo", "-h", "-n", node, "-o", "%T").stdout.strip() in ("idle", "mixed"), 180,
             f"{node} back")


def progress(run_dir: Path) -> int:
    return max(losses(run_dir), default=0) if (run_dir / "metrics.jsonl").exists() else 0


def test_a_lost_node_is_named_left_out_and_the_run_completes_on_the_others(three, tmp_path):
    cluster, state = three
    # Paced: after the first checkpoint it trains 35 s at least, past Slurm's notice of the loss (12-25 s).
    job = launch(cluster, tmp_path, "name=lost", *TWO_NODES, defaults=RUN, env=paced(0.2))
    run_dir = tmp_path / "lost"
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    nodes = cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    victim = cluster.run("scontrol", "show", "hostnames", nodes).stdout.split()[1]  # not the batch host
    killed_at = time.time()
    pidfile = state / "run" / f"slurmd-{victim}.pid"
    argv, env = stop_daemon(pidfile)
    try:
        lost = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"], 180, "lost attempt")[0]
        # Slurm requeues the job itself: its second attempt begins after the first is judged, not with it.
        second = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt" and e["attempt"] == 2], 180,
                          "second attempt")[0]
        assert (lost["outcome"], lost["node"], lost["exclude"]) == ("LOST", victim, [victim]), lost
        assert f"node {victim} lost at step" in lost["cause"] and lost["short"] == f"{victim} lost"
        assert victim not in cluster.run("scontrol", "show", "hostnames", second["nodes"]).stdout.split()
        cluster.completes(job, run_dir, timeout=400)
    finally:  # the next tests on this cluster need all three nodes
        start_daemon(pidfile, argv, env, state / "log" / f"slurmd-{victim}.log")
        back(cluster, victim)
    resumed = [e["step"] for e in events(run_dir) if e["event"] == "resumed"]
    assert len(resumed) == 1 and resumed[0] % CHECKPOINT_EVERY == 0 and progress(run_dir) == STEPS
    described = cluster.launcher("describe", "lost", root=tmp_path).stdout
    assert f"requeued by Slurm, excluding {victim}" in described and f"node {victim} lost" in described
    kinds = [e["event"] for e in events(run_dir)]
    assert kinds.count("attempt") == 2 and "retrying" not in kinds  # Slurm's requeue, not a second job
    print(f"node lost: attempt 2 began {second['time'] - killed_at:.0f} s after the kill "
          f"(SlurmdTimeout={SLURMD_TIMEOUT_S} s); completed {time.time() - killed_at:.0f} s after it")


def test_a_node_whose_preflight_never_ends_is_named_within_the_bound_and_left_out(three, tmp_path):
    """One rank per node on two of the three nodes; the second node's device check never returns (a hung GPU):
    within train.preflight_timeout_s the other rank names that node, and the retry runs without it."""
    cluster, _ = three
    stuck = cluster.nodes[1]
    job = launch(cluster, tmp_path, "name=stuck", "gpus=2", "layout.nodes=2", "train.steps=20",
                 "train.preflight_timeout_s=10", defaults=RUN, env={"LAUNCHER_FAULT": f"stuck:{stuck}"})
    run_dir = tmp_path / "stuck"
    retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 180, "retry")[0]
    failed = [e for e in events(run_dir) if e["event"] == "preflight_failed"]
    assert [(e["rank"], e["node"]) for e in failed] == [(1, stuck)], failed
    assert "did not finish their preflight checks within 10 s" in failed[0]["problem"]
    assert retry["exclude"] == [stuck], retry
    first = next(e for e in events(run_dir) if e["event"] == "attempt")
    assert failed[0]["time"] - first["time"] < 10 + 60, (first, failed)  # the bound, and the ranks' start
    assert "metrics.jsonl" not in {p.name for p in run_dir.iterdir()}  # caught before training
    cluster.completes(retry["job_id"], run_dir, timeout=300)
    attempts = [e for e in events(run_dir) if e["event"] == "attempt"]
    assert stuck not in cluster.run("scontrol", "show", "hostnames", attempts[-1]["nodes"]).stdout.split()
    assert job != retry["job_id"]


@contextmanager
def slurmd_timeout(cluster, state: Path, seconds: int):
    """The cluster's SlurmdTimeout for the duration of a test (a site's is a minute or more: Slurm then runs jobs
    on a dead node's "idle" state for that long), its own after."""
    conf = state / "etc" / "slurm.conf"
    original = conf.read_text()

    def write(text: str) -> None:  # whole, by rename: a slurmd started meanwhile must never read it half-written
        tmp = conf.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, conf)
        cluster.run("scontrol", "reconfigure")

    write(re.sub(r"^SlurmdTimeout=\d+", f"SlurmdTimeout={seconds}", original, flags=re.M))
    try:
        yield
    finally:
        write(original)


def test_a_node_lost_with_its_ranks_before_slurm_notices_is_left_out_and_costs_no_retry(three, tmp_path):
    """As on a site whose SlurmdTimeout is a minute: Slurm still reads the dead node "idle" when the attempt
    ends. The attempt's end asks the node itself (a probe step), names it LOST and retries without it, though
    the run has no retries to spend."""
    cluster, state = three
    for node in cluster.nodes:  # its retry needs two nodes besides the one it loses
        back(cluster, node)
    with slurmd_timeout(cluster, state, 120):
        # Paced: still training while the test stops the node's daemon and kills its rank.
        job = launch(cluster, tmp_path, "name=gone", *TWO_NODES, "cluster.max_retries=0", defaults=RUN,
                     env=paced(0.05))
        run_dir = tmp_path / "gone"
        wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
        nodes = cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
        victim = cluster.run("scontrol", "show", "hostnames", nodes).stdout.split()[1]  # not the batch host
        ranks = rank_pids(run_dir, job, victim)
        assert len(ranks) == 1, ranks
        pidfile = state / "run" / f"slurmd-{victim}.pid"
        argv, env = stop_daemon(pidfile)
        try:
            for pid in ranks.values():
                os.kill(pid, signal.SIGKILL)
            lost = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "attempt_ended"], 120, "end")[0]
            assert (lost["outcome"], lost["nodes"], lost["short"]) == ("LOST", [victim], f"{victim} lost"), lost
            state_then = cluster.run("sinfo", "-h", "-n", victim, "-o", "%T").stdout.strip()
            assert "down" not in state_then, state_then  # Slurm has not marked it down: "idle" or "allocated*"
            retry = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "retrying"], 60, "retry")[0]
            assert (retry["exclude"], retry["free"]) == ([victim], True), retry
            cluster.completes(retry["job_id"], run_dir, timeout=400)
        finally:
            start_daemon(pidfile, argv, env, state / "log" / f"slurmd-{victim}.log")
    second = [e for e in events(run_dir) if e["event"] == "attempt"][1]
    assert victim not in cluster.run("scontrol", "show", "hostnames", second["nodes"]).stdout.split()
    assert progress(run_dir) == STEPS
    back(cluster, victim)


def test_a_retry_the_controller_refuses_is_the_run_final_cause(three, tmp_path):
    cluster, _ = three
    job = launch(cluster, tmp_path, "name=refused", "gpus=2", "train.steps=900", "train.checkpoint_every=50",
                 defaults=RUN)
    run_dir = tmp_path / "refused"
    wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 180, "checkpoint")
    partition = cluster.run("sinfo", "-h", "-o", "%R").stdout.split()[0]
    cluster.run("scontrol", "update", f"PartitionName={partition}", "State=INACTIVE")
    try:
        os.kill(next(iter(rank_pids(run_dir, job, cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()).values())),
                signal.SIGKILL)
        final = wait_for(lambda: [e for e in events(run_dir) if e["event"] == "failed" and e.get("final")], 120,
                         "verdict")[0]
    finally:
        cluster.run("scontrol", "update", f"PartitionName={partition}", "State=UP")
    assert final["short"] == "retry refused" and "killed by a signal (SIGKILL)" in final["error"], final
    assert final["error"].endswith("; its retry could not be submitted: Slurm refused it: Required partition not "
                                   "available (inactive or drain)"), final["error"]
    listed = {r["name"]: r for r in json.loads(cluster.launcher("runs", "--json", root=tmp_path).stdout)}
    assert (listed["refused"]["status"], listed["refused"]["reason"]) == ("FAILED", "retry refused"), listed
    assert "its retry could not be submitted" in cluster.launcher("describe", "refused", root=tmp_path).stdout


def test_training_goes_on_while_the_controller_is_down_and_status_commands_answer(three, tmp_path):
    cluster, state = three
    # Paced to train for a minute at least: the job must outlive the outage (a job that ends while the
    # controller is down is Slurm's to reconcile; the run's own record already says COMPLETED, see state.py).
    job = launch(cluster, tmp_path, "name=calm", "gpus=2", "train.steps=200", "train.checkpoint_every=50",
                 defaults=RUN, env=paced(0.3))
    run_dir = tmp_path / "calm"
    wait_for(lambda: progress(run_dir) >= 10, 180, "training")
    pidfile = state / "run" / "slurmctld.pid"
    # Stopped, as an administrator stops it: it saves its state. (Killed outright within seconds of a job's start,
    # it can lose that start; Slurm then requeues the running job on its return: docs/recovery.md.)
    argv, env = stop_daemon(pidfile, signal.SIGTERM)
    try:
        before = progress(run_dir)
        wait_for(lambda: progress(run_dir) >= before + 20, 60, "training without a controller")
        answered = {}
        for command in (("runs",), ("runs", "--json"), ("describe", "calm"), ("clusters",)):
            started = time.time()
            res = cluster.launcher(*command, root=tmp_path, timeout=30)
            answered[" ".join(command)] = took = time.time() - started
            assert res.returncode == 0 and "Traceback" not in res.stderr, (command, took, res)
        print("with the controller down: " + ", ".join(f"{c} {t:.2f} s" for c, t in answered.items()))
        listed = json.loads(cluster.launcher("runs", "--json", root=tmp_path).stdout)
        assert [r["name"] for r in listed] == ["calm"]
        clusters = cluster.launcher("clusters", root=tmp_path)
        assert "not reachable" in clusters.stdout + clusters.stderr or "cannot reach" in clusters.stdout + clusters.stderr, clusters
        refused = cluster.launcher("model=gpt_tiny", "gpus=2", "name=during", root=tmp_path, timeout=60)
        assert refused.returncode != 0 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert not (tmp_path / "during").exists()
    finally:
        start_daemon(pidfile, argv, env, state / "log" / "slurmctld.log")
    wait_for(lambda: cluster.run("scontrol", "ping", check=False).returncode == 0, 60, "controller back")
    cluster.completes(job, run_dir, timeout=300)
    assert progress(run_dir) == 200
    listed = {r["name"]: r for r in json.loads(cluster.launcher("runs", "--json", root=tmp_path).stdout)}
    assert listed["calm"]["status"] == "COMPLETED"
    assert [e["event"] for e in events(run_dir)].count("attempt") == 1



def test_the_goodput_benchmark_runs_in_its_quick_mode(three, tmp_path):
    """scripts/bench_goodput.py --quick: a fault-free run beside one whose rank is killed, on this 3-node cluster;
    it prints each run's goodput, the fault's detection and restart, and the ratio."""
    cluster, _ = three
    out = subprocess.run([sys.executable, "scripts/bench_goodput.py", "--quick"], cwd=REPO,
                         env={**cluster.env, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert re.search(r"^fault-free: COMPLETED in \d+ s; Goodput: [01]\.\d\d of \d+ s", out.stdout, re.M), out.stdout
    assert re.search(r"^  kill +at +\d+ s: ended its attempt \d+ s later \(FAILED: rank 1 killed\); training again "
                     r"\d+ s after that$", out.stdout, re.M), out.stdout
    assert re.search(r"^goodput ratio: fault-free \d+ s / with faults \d+ s = [01]\.\d\d \(goal 0\.85\)$", out.stdout,
                     re.M), out.stdout


def test_the_footprint_benchmark_shows_a_minute_per_rpc_and_heartbeats_that_grow_with_nodes(three, tmp_path):
    """scripts/bench_footprint.py --quick: a 1-node and a 2-node run (2 ranks a node) side by side on this
    3-node cluster; in steady state the controller gets at most one comment update per job a minute, and the
    run directories see no create, rename, unlink or listing, and one heartbeat write per node a beat."""
    cluster, _ = three
    out = subprocess.run([sys.executable, "scripts/bench_footprint.py", "--quick"], cwd=REPO,
                         env={**cluster.env, "TMPDIR": str(tmp_path)}, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    head = re.search(r"^controller: (\d+) RPCs in (\d+) s with 2 running jobs: [\d.]+ per job per minute", out.stdout,
                     re.M)
    assert head, out.stdout
    rpcs = dict(re.findall(r"^  (REQUEST_\w+|MESSAGE_\w+) (\d+)$", out.stdout, re.M))
    assert set(rpcs) <= {"REQUEST_UPDATE_JOB"}, out.stdout  # the progress comment, nothing else from the jobs
    assert int(head[1]) <= 2 * -(-int(head[2]) // 60), out.stdout  # per job, one a minute (or part of one)
    rows = re.findall(r"^  (\d) node\(s\) x 2 ranks: .*; metadata ([\d.]+) .*\(heartbeats ([\d.]+)", out.stdout, re.M)
    assert [(n, float(meta)) for n, meta, _ in rows] == [("1", 0.0), ("2", 0.0)], out.stdout
    one, two = (float(beats) / int(n) for n, _, beats in rows)
    assert 0.7 < two / one < 1.3 and 20 < one < 40, out.stdout  # a write per node per 2-s beat, whatever its ranks
