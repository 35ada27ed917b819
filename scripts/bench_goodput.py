"""Goodput under faults: the same run without faults and with one fault every ``--every`` seconds
(a rank SIGKILLed, a rank SIGSTOPped, a node lost with its ranks, a preemption), on the cluster ``$SLURM_CONF``
names (3 nodes or more: ``bash slurm/up.sh --nodes 3``). It prints the fault-free wall time over the faulty one
(the goal: 0.85 or more), each fault's detection and restart, and ``describe``'s goodput line of each run:
where every second went.

    python scripts/bench_goodput.py [--steps 4000] [--every 90]     # gpus=4 on 2 nodes, one run after the other
    python scripts/bench_goodput.py --quick                         # gpus=2 on 1 node, side by side, one kill

Faults are caused for real on the benchmark's own jobs only: ranks are found by SLURM_JOB_ID and SLURM_PROCID in
/proc/PID/environ, a node's slurmd by its pid file (slurm/up.sh's layout), and started again after its loss.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Dict, List, Optional

REPO = Path(__file__).resolve().parents[1]
SCHEDULE = ("kill", "hang", "node", "preempt")


@dataclass
class Fault:
    kind: str
    at: float  # when it was caused
    job_id: str
    undo: Optional[Callable[[], None]] = None  # restarts what it stopped (a node's slurmd)


def run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=check)


def launcher(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "LAUNCHER_RUN_ROOT": str(root)}
    return subprocess.run([sys.executable, "-m", "launcher", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def events(run_dir: Path) -> List[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def job_of(run_dir: Path) -> str:
    return json.loads((run_dir / "run.json").read_text())["job_id"]


def cluster_nodes() -> List[str]:
    return run("sinfo", "-h", "-N", "-o", "%N").stdout.split()


def ranks(job_id: str, nodes: List[str], node: Optional[str] = None) -> Dict[int, int]:
    """The benchmark's own job's ranks (on ``node``): rank -> pid."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            env = dict(i.split("=", 1) for i in (proc / "environ").read_text().split("\0") if "=" in i)
            argv = (proc / "cmdline").read_text().split("\0")
        except OSError:
            continue
        if env.get("SLURM_JOB_ID") == job_id and "SLURM_PROCID" in env and "launcher.job.task" in argv \
                and "python" in argv[0] and env.get("SLURMD_NODENAME") in ([node] if node else nodes):
            found[int(env["SLURM_PROCID"])] = int(proc.name)
    return found


def lose_node(job_id: str, nodes: List[str]) -> Optional[Callable[[], None]]:
    """Kill a node's slurmd and its ranks (not the batch host's); returns what starts the slurmd again."""
    allocated = run("scontrol", "show", "hostnames", run("squeue", "-h", "-j", job_id, "-o", "%N").stdout.strip()
                    ).stdout.split()
    if len(allocated) < 2:
        return None
    victim = allocated[-1]
    pidfile = Path(os.environ["SLURM_CONF"]).parents[1] / "run" / f"slurmd-{victim}.pid"
    pid = int(pidfile.read_text())
    proc = Path(f"/proc/{pid}")
    argv = proc.joinpath("cmdline").read_text().split("\0")[:-1]
    env = dict(i.split("=", 1) for i in proc.joinpath("environ").read_text().split("\0") if "=" in i)
    os.kill(pid, signal.SIGKILL)
    for rank_pid in ranks(job_id, nodes, victim).values():
        os.kill(rank_pid, signal.SIGKILL)

    def restart() -> None:
        with open(pidfile.parents[1] / "log" / f"slurmd-{victim}.log", "a") as out:
            daemon = subprocess.Popen(argv, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL,
                                      start_new_session=True)
        pidfile.write_text(f"{daemon.pid}\n")
    return restart


def cause(kind: str, run_dir: Path, nodes: List[str]) -> Optional[Fault]:
    """Cause one fault on the run's current job; None when it has no rank to cause it on yet."""
    job = job_of(run_dir)
    found = ranks(job, nodes)
    if not found:
        return None
    fault = Fault(kind, time.time(), job)
    if kind == "kill":
        os.kill(found[max(found)], signal.SIGKILL)
    elif kind == "hang":
        os.kill(found[max(found)], signal.SIGSTOP)
    elif kind == "node":
        fault.undo = lose_node(job, nodes)
        if fault.undo is None:
            os.kill(found[max(found)], signal.SIGKILL)  # a one-node run: its node is its batch host
    else:
        run("scancel", "--signal=USR2", job)
    return fault


def training_since(run_dir: Path, since: float) -> bool:
    """Whether the run trained a step (a timed metrics record) after ``since``."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return False
    lines = path.read_text().splitlines()
    return any(json.loads(line).get("time", 0) > since for line in lines[-3:] if line.strip())


def finished(run_dir: Path) -> Optional[str]:
    """COMPLETED or FAILED once the run's record says it is over, else None."""
    found = events(run_dir)
    if any(e.get("event") == "failed" and e.get("final") for e in found):
        return "FAILED"
    last = next((e for e in reversed(found) if e.get("event") in ("attempt", "attempt_ended")), {})
    return "COMPLETED" if last.get("outcome") == "COMPLETED" else None


def wall(run_dir: Path) -> float:
    found = events(run_dir)
    return found[-1]["time"] - next(e["time"] for e in found if e.get("event") == "submitted")


def goodput_line(root: Path, name: str) -> str:
    res = launcher(root, "describe", name, "--json")
    info = json.loads(res.stdout) if res.returncode == 0 else {}
    return (info.get("goodput") or {}).get("line", f"(describe failed: {res.stderr.strip()})")


def fault_lines(run_dir: Path, faults: List[Fault]) -> List[str]:
    """Each fault's detection (to its attempt's end) and restart (to the next attempt's first step)."""
    found = events(run_dir)
    lines = []
    for fault in faults:
        ended = next((e for e in found if e.get("event") == "attempt_ended" and e["time"] >= fault.at), None)
        back = next((e for e in found if e.get("event") in ("resumed", "started") and ended  # from scratch: started
                     and e["time"] > ended["time"]), None)
        why = ended and (ended.get("short") or ended.get("cause"))
        detected = (f"ended its attempt {ended['time'] - fault.at:.0f} s later ({ended.get('outcome')}"
                    f"{': ' + why if why else ''})") if ended else "never ended its attempt"
        again = f"; training again {back['time'] - ended['time']:.0f} s after that" if back else ""
        lines.append(f"  {fault.kind:<8} at {fault.at - found[0]['time']:5.0f} s: {detected}{again}")
    return lines


def watch(root: Path, name: str, nodes: List[str], schedule: List[str], every: float, timeout: float) -> List[Fault]:
    """Wait for the run to end, causing the scheduled faults one every ``every`` seconds of its training."""
    run_dir, faults, last = root / name, [], time.time()
    deadline = time.time() + timeout
    while finished(run_dir) is None:
        if time.time() > deadline:
            raise SystemExit(f"run {name} did not end in {timeout:.0f} s: {events(run_dir)[-3:]}")
        for fault in faults:
            if fault.undo and job_of(run_dir) != fault.job_id:  # its attempt is over: the node comes back
                fault.undo()
                fault.undo = None
        if schedule and time.time() - last >= every and training_since(run_dir, last):
            fault = cause(schedule[0], run_dir, nodes)
            if fault:
                faults.append(fault)
                schedule.pop(0)
                last = fault.at
        time.sleep(0.5)
    for fault in faults:
        if fault.undo:
            fault.undo()
    return faults


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4000, help="4000: the four faults, 90 s apart, fit in")
    parser.add_argument("--every", type=float, default=90.0, help="seconds of training between faults")
    parser.add_argument("--quick", action="store_true", help="a short run on 1 node and one kill, for the suite")
    args = parser.parse_args()
    nodes = cluster_nodes()
    if len(nodes) < 3:
        raise SystemExit(f"the cluster has {len(nodes)} nodes; the benchmark needs 3 (bash slurm/up.sh --nodes 3)")
    shape = ("gpus=2", "layout.nodes=1") if args.quick else ("gpus=4", "layout.nodes=2")
    steps, every = (300, 10.0) if args.quick else (args.steps, args.every)
    schedule = ["kill"] if args.quick else list(SCHEDULE)
    common = ("model=gpt_tiny", *shape, f"train.steps={steps}", "train.checkpoint_every=50", "train.log_every=10",
              "train.stall_timeout_s=30", "cluster.max_retries=4")
    root = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    names = ("calm", "faulty")
    for name in names if args.quick else names[:1]:
        res = launcher(root, *common, f"name={name}")
        if res.returncode != 0:
            raise SystemExit(f"launch failed: {res.stderr.strip()}")
    timeout = 600 + 4 * steps * 0.2
    if args.quick:  # side by side: both see the same load
        faults = watch(root, "faulty", nodes, schedule, every, timeout)
        watch(root, "calm", nodes, [], every, timeout)
    else:  # one after the other: the faulty run needs the third node once one is lost
        watch(root, "calm", nodes, [], every, timeout)
        res = launcher(root, *common, "name=faulty")
        if res.returncode != 0:
            raise SystemExit(f"launch failed: {res.stderr.strip()}")
        faults = watch(root, "faulty", nodes, schedule, every, timeout)
    outcome = {name: finished(root / name) for name in names}
    calm, faulty = wall(root / "calm"), wall(root / "faulty")
    print(f"run: gpt_tiny {' '.join(shape)}, {steps} steps, checkpoint every 50, train.stall_timeout_s=30")
    print(f"fault-free: {outcome['calm']} in {calm:.0f} s; {goodput_line(root, 'calm')}")
    print(f"with {len(faults)} fault(s): {outcome['faulty']} in {faulty:.0f} s; {goodput_line(root, 'faulty')}")
    print("\n".join(fault_lines(root / "faulty", faults)))
    print(f"goodput ratio: fault-free {calm:.0f} s / with faults {faulty:.0f} s = {calm / faulty:.2f} (goal 0.85)")
    return 0 if set(outcome.values()) == {"COMPLETED"} else 1


if __name__ == "__main__":
    raise SystemExit(main())
