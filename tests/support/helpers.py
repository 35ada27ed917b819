"""Helpers shared by the test modules: the cluster handle, waiting, launching, and reading a run's records.

Test modules import from here (or from train_harness.py, train_workers.py, tracker_files.py), never from one
another."""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from launcher.forecast.target import TargetGpu

REPO = Path(__file__).resolve().parents[2]
UP = str(REPO / "slurm" / "up.sh")
DOWN = str(REPO / "slurm" / "down.sh")

# Only a bound on a hung CLI call: a command that loads a model (export, sample) took over 60 s on a slower
# 2-core machine whose cores the rest of the suite kept busy (a fresh-clone run).
CLI_BOUND_S = 180

FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY"}


def shared_once(tmp_path_factory, name: str, build) -> Path:
    """A directory made once per pytest session by ``build(directory)`` and then only read: the first of the
    session's processes (pytest-xdist's workers) to ask builds it under a lock, the others wait and reuse it. A
    build that fails leaves nothing, and the next to ask tries again."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the session's, above each worker's own
    directory = base / f"shared-{name}"
    with open(base / f"shared-{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (directory / ".built").exists():
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir()
            build(directory)
            (directory / ".built").touch()
    return directory


def wait_for(condition, timeout: float, what: str, interval: float = 0.3, patient: bool = False):
    """Call ``condition`` until it returns something truthy; return that. Fails naming ``what`` after
    ``timeout`` seconds. ``patient``: a costly condition (a process of its own, a query of Slurm's database) is
    asked every ``interval`` for the first 10 s, then less often, up to every 2 s, so that a wait of minutes (a
    run to its end) costs the machine the other tests share little."""
    start = time.time()
    deadline = start + timeout
    while True:
        found = condition()
        if found:
            return found
        now = time.time()
        if now >= deadline:
            raise AssertionError(f"no {what} within {timeout} s")
        waited = now - start
        time.sleep(max(interval, min(2.0, waited / 10)) if patient and waited > 10 else interval)


@dataclass(frozen=True)
class SlurmCluster:
    """A running local cluster: the environment its client tools need, and its shape."""

    env: dict
    nodes: list[str]
    gpus_per_node: int

    def run(self, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def wait(self, job_id: str, timeout: float = 180) -> str:
        """Poll sacct until the job reaches a final state; return it."""
        def final():
            out = self.run("sacct", "-n", "-X", "-P", "-o", "State", "-j", job_id).stdout.split()
            return out[0] if out and out[0].split()[0] in FINAL_STATES else None

        try:
            return wait_for(final, timeout, f"end of job {job_id}", interval=0.5, patient=True)
        except AssertionError:
            raise AssertionError(f"job {job_id} did not finish in {timeout} s") from None

    def completes(self, job_id: str, run_dir: Path, timeout: float = 300) -> None:
        """Assert that job ``job_id`` of the run in ``run_dir`` ends COMPLETED; else fail with the run's own record
        of why (a CI log holds only what the assertion says)."""
        state = self.wait(job_id, timeout)
        assert state == "COMPLETED", f"job {job_id} ended {state}; the run's record:\n{record(run_dir)}"

    def launcher(self, *args: str, root: Path, timeout: float = CLI_BOUND_S, env: dict | None = None
                 ) -> subprocess.CompletedProcess:
        """Run ``python -m launcher ARGS`` as a user would, with runs under ``root``."""
        env = {**self.env, **(env or {}), "LAUNCHER_RUN_ROOT": str(root)}
        return run_launcher(*args, env=env, timeout=timeout, cwd=REPO)


def run_launcher(*args: str, env: dict | None = None, cwd: Path | None = None, timeout: float = CLI_BOUND_S, input=None,
                 python: str = sys.executable, flags: tuple = (), check: bool = False,
                 stdin=None) -> subprocess.CompletedProcess:
    """``python -m launcher ARGS`` as a user runs it, a process of its own: the one way the tests run the CLI outside
    their own process. ``env``: its whole environment (default: this one's); ``cwd``: where it runs (default:
    here, where a project's layer is looked for); ``flags``: the interpreter's own
    (``-X importtime``); ``input``: its standard input, text or bytes (the output is then bytes too)."""
    return subprocess.run([str(python), *flags, "-m", "launcher", *args], env=os.environ if env is None else env,
                          cwd=cwd, capture_output=True, text=not isinstance(input, bytes), input=input,
                          stdin=stdin, timeout=timeout, check=check)


def overridden(defaults: tuple, extra: tuple) -> list:
    """A test's default overrides with ``extra`` replacing those of the same key (the launcher refuses a key
    given twice)."""
    keys = {arg.split("=", 1)[0] for arg in extra}
    return [arg for arg in defaults if arg.split("=", 1)[0] not in keys] + list(extra)


def job_id_of(stdout: str) -> str:
    """The Slurm job id a launch printed."""
    found = re.search(r"as Slurm job (\d+)", stdout)
    assert found, f"no job id in {stdout!r}"
    return found.group(1)


def launch(cluster: SlurmCluster, root: Path, *args: str, defaults: tuple = (), env: dict | None = None,
           timeout: float = 60) -> str:
    """Submit a run with ``python -m launcher`` (``args`` replacing the ``defaults`` of the same key); return
    its job id."""
    res = cluster.launcher(*overridden(defaults, args), root=root, env=env, timeout=timeout)
    assert res.returncode == 0, res.stderr
    return job_id_of(res.stdout)


def run_name(root: Path, job_id: str, cluster: str = "local") -> str:
    """The name of the run under ``root`` that job ``job_id`` of ``cluster`` trains (two clusters can each have
    a job of the same id)."""
    records = [json.loads(p.read_text()) for p in root.glob("*/run.json")]
    names = [r["name"] for r in records if (r["job_id"], r["cluster"]) == (job_id, cluster)]
    assert len(names) == 1, (job_id, names)
    return names[0]


def processes():
    """Every process this machine shows: its pid, environment and command line (one that ends meanwhile is skipped)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            environ = dict(item.split("=", 1) for item in (proc / "environ").read_text().split("\0") if "=" in item)
            argv = (proc / "cmdline").read_text().split("\0")
        except OSError:
            continue
        yield int(proc.name), environ, argv


def rank_pids(run_dir: Path, job_id: str, node: str | None = None) -> dict[int, int]:
    """The processes of the ranks of this test's own job (on ``node``, or every node), by their Slurm variables
    (srun, whose command line names the same module, is not one) and the run directory their command line names:
    job ids repeat across the clusters of tests running side by side (each cluster's first job is 1)."""
    folder = str(Path(run_dir).absolute() / "submitit")
    return {int(environ["SLURM_PROCID"]): pid for pid, environ, argv in processes()
            if environ.get("SLURM_JOB_ID") == job_id and "launcher.job.task" in argv and "python" in argv[0]
            and folder in argv and "SLURM_PROCID" in environ and node in (None, environ.get("SLURMD_NODENAME"))}


def batch_shell_pid(run_dir: Path, job_id: str) -> int:
    """The batch shell of this test's own job (Slurm's copy of the script, ``slurm_script``), told from another
    cluster's job of the same id by the run root its environment names."""
    for pid, environ, argv in processes():
        if environ.get("SLURM_JOB_ID") == job_id and any(arg.endswith("slurm_script") for arg in argv[1:2]) \
                and environ.get("LAUNCHER_RUN_ROOT") == str(Path(run_dir).parent):
            return pid
    raise AssertionError(f"no batch shell of job {job_id} (run {Path(run_dir).name})")


def events(run_dir: Path) -> list[dict]:
    """The run's events.jsonl, in order ([] before it exists)."""
    path = Path(run_dir) / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


# srun options that leave the tasks no way to reach Slurm, as in a container image without Slurm's client or munge:
# what must be done with Slurm (the requeue, the progress comment) is then done by the batch shell on the host.
TASKS_WITHOUT_SLURM = "cluster.srun_args=['--export=ALL,SLURM_CONF=/nonexistent/slurm.conf']"


def record(run_dir: Path) -> str:
    """The run's events but its heartbeats, one line each: what a failed test shows of the run."""
    return "\n".join(json.dumps({k: v for k, v in e.items() if k != "time"}) for e in events(run_dir)
                     if e.get("event") != "heartbeat")


def losses(run_dir: Path) -> dict[int, float]:
    """The loss of every logged step (the newest record of a step logged twice), without the final summary."""
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return {r["step"]: r["loss"] for r in map(json.loads, lines) if not r.get("final")}


def preempt_after_a_checkpoint(cluster: SlurmCluster, *runs: tuple[Path, str]) -> None:
    """Send Slurm's USR2 (as before a time limit or a preemption) to each (run_dir, job_id) once its run has a
    checkpoint; return when every requeued job has resumed."""
    for run_dir, job in runs:
        wait_for(lambda: list((run_dir / "checkpoints").glob("step_????????")), 120, f"checkpoint of {run_dir.name}",
                 interval=0.2)
        cluster.run("scancel", "--signal=USR2", job)
    for run_dir, _ in runs:
        wait_for(lambda: any(e["event"] == "resumed" for e in events(run_dir)), 180, f"resume of {run_dir.name}")


def runs_json(cluster: SlurmCluster, root: Path, env: dict | None = None) -> dict[str, dict]:
    """``launcher runs --json`` by run name."""
    res = cluster.launcher("runs", "--json", root=root, env=env)
    assert res.returncode == 0, res.stderr
    return {row["name"]: row for row in json.loads(res.stdout)}


def wait_status(cluster: SlurmCluster, root: Path, name: str, wanted: set, timeout: float = 120,
                env: dict | None = None) -> dict:
    """Poll ``launcher runs --json`` until run ``name`` has one of the ``wanted`` statuses; return its row."""
    seen = {}

    def reached():
        seen["row"] = runs_json(cluster, root, env).get(name)
        return seen["row"] if seen["row"] and seen["row"]["status"] in wanted else None

    try:
        return wait_for(reached, timeout, f"{name} in {wanted}", interval=1, patient=True)
    except AssertionError:
        raise AssertionError(f"{name} never reached {wanted}; last {seen.get('row')}") from None


def git(root: Path, *args: str) -> str:
    """Run git in ``root`` with a fixed identity; return its output."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True, env=env).stdout


# The steady run (the ``steady`` fixture, tests/cluster/conftest.py), and the run a fault test starts unless it says
# otherwise: 150 steps on 2 GPUs, checkpointed every 20. Two ranks are enough to tell the rank that failed from the
# peer that lost it, and a step of two gloo ranks costs a third of four's CPU.
STEADY_STEPS = 150
STEADY_RUN = ("model=gpt_tiny", "gpus=2", f"train.steps={STEADY_STEPS}", "train.log_every=10",
              "train.checkpoint_every=20")
# A lost node is noticed by Slurm only after SlurmdTimeout; the clusters of the fault tests set it to 10 s (a site uses
# minutes), so tests wait seconds, not minutes, for what a site's cluster does the same way.
SLURMD_TIMEOUT_S = 10
# Slurm's default KillWait, the time between its SIGTERM to a job's tasks and its SIGKILL, as sites keep it; the
# suite's clusters use 5 s (slurm/up.sh), and the test of a requeue that loses no step has a cluster of its own.
SITE_KILL_WAIT_S = 30
# The time-limited run: each attempt trains at most about 52 s (the signal comes 30-60 s after the start,
# Slurm's 30-second tick, and starting takes 8 s or more), so 180 s of paced steps need at least 4 attempts. Few
# long steps rather than many short ones: a step's CPU is the same however long it waits.
PACE_S, PACED_STEPS = 0.3, 600


# The GPU the planner's tests plan for (tests/unit/test_planner.py, tests/cluster/training/test_planner.py).
H100 = TargetGpu(gpu_type="h100", memory_gib=80, memory_source="test", enforce=True, peak_flops=989e12,
                 peak_source="test")


def paced(seconds: float) -> dict[str, str]:
    """The environment of a run whose every step takes ``seconds`` longer (launcher/train/faults.py): it waits
    rather than spends the CPU the other tests share, and its losses are those of an unpaced run."""
    return {"LAUNCHER_FAULT": f"pace@{seconds}"}


# A run that trains until it is stopped: two steps a second, each a few hundredths of a CPU-second on two ranks
# (what such a test waits for is a state, or a first line of metrics, not a number of steps).
UNTIL_STOPPED = paced(0.5)


# Ports. Every cluster a test starts listens on the suite's own cluster's port plus an offset of its own, so
# that two checkouts' suites (each with its own cluster, on its own port) can run side by side. A cluster uses
# its port up to port + 20 + its node count. The SSH site of tests/support/sshd_site.py (an sshd, no cluster) has one too.
PORT_OFFSETS = {"local2": 100, "noacct": 300, "twice": 400, "dies": 500, "restart": 600, "limited": 700,
                "sshd": 800, "strict": 900, "move": 950, "auto_busy": 200,
                "auto_strict": 240}


def suite_port() -> int:
    """The port of the suite's own cluster: $SLURM_CONF's SlurmctldPort, else $SLURM_LOCAL_PORT, else slurm/up.sh's
    default."""
    conf = Path(os.environ.get("SLURM_CONF", REPO / ".slurm" / "etc" / "slurm.conf"))
    try:
        found = re.search(r"^SlurmctldPort=(\d+)", conf.read_text(), re.M)
    except OSError:
        found = None
    return int(found.group(1)) if found else int(os.environ.get("SLURM_LOCAL_PORT", "16810"))


def cluster_port(purpose: str) -> int:
    """The port of the extra cluster a test starts for ``purpose`` (a key of PORT_OFFSETS)."""
    return suite_port() + PORT_OFFSETS[purpose]


OWN_CLUSTERS_OFFSET, OWN_CLUSTER_PORTS = 1000, 50


def own_cluster_port() -> int:
    """The port of the cluster a test has to itself (tests/cluster/conftest.py): one block of ports per pytest-xdist
    worker, which runs one test at a time."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    return suite_port() + OWN_CLUSTERS_OFFSET + OWN_CLUSTER_PORTS * worker


def run_up(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    """slurm/up.sh with these arguments."""
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run(["bash", UP, *args], capture_output=True, text=True, env=env, timeout=180)


def run_down(state: Path) -> subprocess.CompletedProcess:
    """slurm/down.sh for the cluster whose state is in ``state``."""
    return subprocess.run(["bash", DOWN, "--dir", str(state)], capture_output=True, text=True, timeout=120)


def said(stderr: str) -> list[str]:
    """stderr's lines but those naming a check a dry run or a plan could not make (``not checked: ...``: the quick
    tier has no cluster to ask, the cluster tier has one)."""
    return [line for line in stderr.splitlines() if not line.startswith("not checked: ")]


CONTRACT = REPO / "docs" / "design-contract.md"


def contract_table(section: str, header: str) -> str:
    """The table of docs/design-contract.md under ``section`` whose header row is ``header``."""
    text = CONTRACT.read_text()
    assert section in text, f"{CONTRACT.name} lacks the section {section!r}"
    return re.search(re.escape(header) + r"\n(?:\|.*\|\n?)+", text.split(section, 1)[1]).group(0).strip()


def types_table(header: str, types: dict, fields_of) -> str:
    """A contract's table as the types give it: each one's name (as ``types`` keys it), fields and docstring."""
    rows = [header, "|" + "---|" * header.count(" | ") + "---|"]
    for name, cls in types.items():
        what = " ".join(cls.__doc__.split()).replace("``", "`")
        rows.append(f"| {name} | {', '.join(f'`{field}`' for field in fields_of(cls))} | {what} |")
    return "\n".join(rows)
