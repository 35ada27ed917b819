#!/usr/bin/env python
"""What does a rank's bring-up ask of the file systems it reads? Metadata operations, by kind and where (local cluster)

Every rank imports about 2,000 modules (torch, its distributed and checkpoint code, submitit, OmegaConf, the
launcher's own) from the tasks' Python environment and the run's frozen code, and each import costs a few
metadata operations: directory listings and stats of the path finder, an open, a stat of the opened file. On a
parallel file system those go to its metadata server, so what one rank does, times the ranks, is what a job's
start asks of that server. This script counts them.

It launches gpt_tiny at each shape of ``--shapes`` (nodes x ranks a node; 1x2, 2x4 and 4x8, i.e. 2, 8 and 32
ranks) on the cluster ``$SLURM_CONF`` names, with every task's Python traced: ``cluster.python`` is a wrapper this
script writes, which runs the tasks (``python -m launcher.job.task``) under
``strace --seccomp-bpf -f -ttt -y -e trace=%file,getdents64`` and the batch script's own steps on the host as they
are. Each rank's system calls from its exec to its first step (the run's ``ready`` event, which rank 0 writes when
the step is done) are counted:

- by kind: ``stat`` (stat, lstat, newfstatat, statx of a path), ``open`` (open, openat), ``getdents64`` (a
  directory read), ``readlink``, ``access``, ``other`` (execve, statfs, mkdir, unlink, rename ...), and beside
  them ``fstat``, a stat of a file already open (``newfstatat(fd, "", AT_EMPTY_PATH)``), whose attributes came
  with its open and which is not counted as a lookup;
- by where: the environment's ``torch`` package, the rest of the environment (``env``: the tasks' Python's
  prefix), the base interpreter's standard library (``stdlib``), the run's frozen code (``run-code``,
  RUN_DIR/code), the rest of the run directory (``run-dir``), node-local storage (``local``: /dev/shm, /tmp,
  $TMPDIR), the node's own ``system`` (/usr, /lib, /etc, /proc, /sys, /dev) and ``elsewhere``.

What a site keeps on shared storage is the environment and the run directory (``shared``), and the standard library
where its base interpreter is there too (``+stdlib``: a module's or conda's Python). Per rank is the median of the
shape's ranks; per node the sum of a node's ranks, averaged over the nodes; ``distinct`` counts the paths of those
calls, each once. The model after the tables scales the largest shape's figures to 1,024 and 16,384 ranks (8 a node)
against ``--mds-rate`` operations a second, the file-stat rate a Lustre metadata server sustained under mdtest
(docs/performance.md cites it): the time the server needs for the job's start if it served nothing else, when every
call reaches it, and when each node asks for each distinct path once (a client that caches every lookup), the two
bounds of what a site sees.

    python scripts/bench_bringup.py [--shapes 1x2,2x4,4x8] [OVERRIDE ...]   # a cluster of 4 nodes x 8 GPUs
    python scripts/bench_bringup.py --quick      # 2 ranks on one node (tests/cluster/test_bench_launcher_quick.py)

OVERRIDEs go to every launch (``cluster.stage_env=true``: what staging the environment changes). It needs strace
(scripts/setup.sh installs it) and a cluster: the suite's (2 nodes x 8) runs 1x2 and 2x4; for 4x8,
``bash slurm/up.sh --nodes 4 --gpus 8 --port 17130 --dir .slurm-bringup --no-accounting`` and
``SLURM_CONF=.slurm-bringup/etc/slurm.conf``. The page cache is warm here, so what it counts is the calls, not
their time.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

ROOT = Path(__file__).resolve().parents[1]
TRACED = "%file,getdents64"
KINDS = {"stat": ("stat", "lstat", "newfstatat", "fstatat64", "statx", "stat64", "lstat64"),
         "open": ("open", "openat", "openat2", "creat"), "getdents64": ("getdents64", "getdents"),
         "readlink": ("readlink", "readlinkat"), "access": ("access", "faccessat", "faccessat2")}
KIND_OF = {call: kind for kind, calls in KINDS.items() for call in calls}
# "all": every kind but fstat; "failed": of all, those refused; "distinct": the paths of all (each counted once)
ROWS = [*KINDS, "other", "all", "failed", "fstat", "distinct"]
WHERE = ["torch", "env", "stdlib", "run-code", "run-dir", "local", "system", "elsewhere"]
SHARED = ("torch", "env", "run-code", "run-dir")  # on shared storage at any site; stdlib at some
SCALES = (1024, 16384)
RANKS_A_NODE = 8
# Dell HPC Lustre Storage with Mellanox InfiniBand EDR (white paper, Lustre 2.7, 32 client nodes), section 4.3:
# mdtest file stat from 34,000 operations a second at 12 threads to 544,000 at 240 (file create: 13,800 to 29,000).
MDS_RATE = 544_000
QUICK_SHAPES, SHAPES = "1x2", "1x2,2x4,4x8"
RUN_BOUND_S = 900  # only a bound on a run that never ends

LINE = re.compile(r"^(\d+)\s+(\d+\.\d+)\s+(\w+)\((.*)$")
DIRFD = re.compile(r"^(AT_FDCWD|-?\d+)(?:<([^>]*)>)?")
QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"')
FAILED = re.compile(r"\) = -1 E[A-Z]+")
AT_CALLS = {"openat", "openat2", "newfstatat", "fstatat64", "statx", "readlinkat", "faccessat", "faccessat2",
            "mkdirat", "unlinkat", "renameat", "renameat2", "linkat", "symlinkat", "fchmodat", "fchownat",
            "utimensat", "execveat", "mknodat", "name_to_handle_at"}


@dataclass(frozen=True)
class Shape:
    """A layout to measure: nodes, and ranks on each (``gpus=`` and ``layout.nodes=`` of the launch)."""

    nodes: int
    per_node: int

    def __str__(self) -> str:
        return f"{self.ranks} ranks ({self.nodes} node{'s' if self.nodes > 1 else ''} x {self.per_node})"

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node

    @property
    def name(self) -> str:
        """The shape as ``--shapes`` writes it (``4x8``): it names the run and its traces."""
        return f"{self.nodes}x{self.per_node}"


def parse_shapes(text: str) -> List[Shape]:
    try:
        shapes = [Shape(*(int(part) for part in item.split("x"))) for item in text.split(",")]
    except (TypeError, ValueError):
        shapes = []
    if not shapes or any(shape.nodes < 1 or shape.per_node < 1 for shape in shapes):
        raise argparse.ArgumentTypeError(f"--shapes {text!r}: allowed NODESxRANKS[,...], e.g. 1x2,2x4,4x8")
    return shapes


def tasks_python() -> str:
    """This interpreter, named through its directory's real path: a virtual environment reached through a symlink
    (a worktree's ``.venv``) would make every ``realpath`` of the ranks' imports read the link and stat each folder
    above it, which a site's environment at its own path does not."""
    return os.path.join(os.path.realpath(os.path.dirname(sys.executable)), os.path.basename(sys.executable))


class Places:
    """Where a path lies: the longest of the known prefixes that holds it (each also as its real path). The
    folders above the environment and the run directory (``/shared`` and ``/shared/$USER`` at a site) count as
    theirs: they are on the same file system, and a path's resolution stats them."""

    def __init__(self, python: str, run_dir: Path) -> None:
        prefix, stdlib, torch = json.loads(subprocess.run(
            [python, "-c", "import importlib.util as u, json, os, sys; print(json.dumps([sys.prefix, "
                           "os.path.dirname(os.__file__), u.find_spec('torch').submodule_search_locations[0]]))"],
            capture_output=True, text=True, check=True).stdout)
        named = [(torch, "torch"), (prefix, "env"), (stdlib, "stdlib"), (str(run_dir / "code"), "run-code"),
                 (str(run_dir), "run-dir"), ("/dev/shm", "local"), ("/tmp", "local"), ("/var/tmp", "local"),
                 (tempfile.gettempdir(), "local"),
                 *((top, "system") for top in ("/usr", "/lib", "/lib64", "/etc", "/proc", "/sys", "/dev"))]
        prefixes, above = {}, {}
        for path, where in named:
            for form in {os.path.normpath(path), os.path.realpath(path)}:
                prefixes.setdefault(form.rstrip("/") + "/", where)
                if where in SHARED:
                    above.update({str(parent): where for parent in Path(form).parents if str(parent) != "/"})
        self.prefixes = sorted(prefixes.items(), key=lambda item: -len(item[0]))
        self.above = above

    def of(self, path: str) -> str:
        path = os.path.normpath(path)
        if path in self.above:
            return self.above[path]
        path += "/"
        return next((where for prefix, where in self.prefixes if path.startswith(prefix)), "elsewhere")


def traced_path(call: str, args: str) -> Tuple[Optional[str], bool]:
    """The path a traced call names (joined to its directory's where it is relative; the descriptor's own for a
    call on a descriptor), and whether it is a stat of an open file rather than a lookup."""
    quoted = QUOTED.search(args)
    fd = DIRFD.match(args)
    at = fd.group(2) if fd and (call in AT_CALLS or call.startswith("getdents")) else None
    if call.startswith("getdents"):
        return at, False
    if quoted is None:
        return at, False
    name = quoted.group(1)
    if call in AT_CALLS and name == "" and "AT_EMPTY_PATH" in args:
        return at, True
    if not name.startswith("/") and at:
        return os.path.join(at, name), False
    return name, False


@dataclass
class Traced:
    """One rank's calls: counters of where by row (``ROWS`` but ``distinct``), and the paths looked up by where."""

    rows: Dict[str, Counter]
    paths: Dict[str, set]

    def counts(self, row: str) -> Counter:
        return Counter({where: len(paths) for where, paths in self.paths.items()}) if row == "distinct" \
            else self.rows[row]


def count_trace(path: Path, until: float, places: Places) -> Traced:
    """One rank's calls up to ``until`` (its first step's end)."""
    traced = Traced({row: Counter() for row in ROWS if row != "distinct"}, defaultdict(set))
    with path.open(errors="replace") as lines:
        for line in lines:
            found = LINE.match(line)
            if found is None:
                continue  # a resumed call (counted where it started), a signal, an exit
            if float(found.group(2)) > until:
                break
            call, args = found.group(3), found.group(4)
            name, fstat = traced_path(call, args)
            where = places.of(name) if name else "elsewhere"
            if fstat:
                traced.rows["fstat"][where] += 1
                continue
            traced.rows[KIND_OF.get(call, "other")][where] += 1
            traced.rows["all"][where] += 1
            traced.paths[where].add(name)
            if FAILED.search(args):
                traced.rows["failed"][where] += 1
    return traced


def strace_options() -> List[str]:
    """strace's options: ``--seccomp-bpf`` (only the traced calls stop the rank) where the kernel lets a tracee
    install the filter, else every call stops it, which costs time, not counts."""
    strace = shutil.which("strace")
    if strace is None:
        raise SystemExit("bench_bringup.py: needs strace (apt-get install strace; scripts/setup.sh installs it)")
    for options in (["--seccomp-bpf"], []):
        probe = [strace, *options, "-f", "-qq", "-e", f"trace={TRACED}", "-o", os.devnull, "true"]
        if subprocess.run(probe, capture_output=True).returncode == 0:
            return [strace, *options]
    raise SystemExit("bench_bringup.py: strace cannot trace here (ptrace refused: a container without "
                     "CAP_SYS_PTRACE, or kernel.yama.ptrace_scope 3)")


def write_wrapper(path: Path, traces: Path, python: str) -> Path:
    """The tasks' Python for ``cluster.python`` at ``path``, running ``python``: a task runs under strace, its trace
    and strace's pid in a folder of its job and attempt (``JOB.RESTARTS``) named by its node and rank; anything else
    (the batch script's own steps, the launch's check of the interpreter) runs as it is. strace runs ahead of the
    ranks (nice -10, where it may): a rank stops at each traced call until its tracer has written it, and a tracer
    that waits for a core behind 32 ranks leaves its rank stopped (state ``t``) long enough for the ranks' watchdog to
    take it for a frozen one."""
    strace = " ".join(strace_options())
    mine = f'{traces}/$SLURM_JOB_ID.${{SLURM_RESTART_COUNT:-0}}'
    path.write_text(
        "#!/bin/sh\n# scripts/bench_bringup.py: the tasks' Python under strace\n"
        'case " $* " in\n  *" -m launcher.job.task "*)\n'
        f'    mkdir -p "{mine}" && echo $$ > "{mine}/$SLURMD_NODENAME.$SLURM_PROCID.pid"\n'
        f'    exec nice -n -10 {strace} -f -qq -ttt -y -e trace={TRACED} '
        f'-o "{mine}/$SLURMD_NODENAME.$SLURM_PROCID.trace" nice -n 10 {python} "$@" ;;\nesac\nexec {python} "$@"\n')
    path.chmod(0o755)
    return path


def traced_python(workdir: Path, traces: Path, staged: bool) -> Path:
    """The wrapper beside the traces, running this interpreter; or, where the environment is staged, the ``bin/python``
    of a venv of this interpreter's packages (hard links) that runs its ``bin/python-real``: the ranks run the node's
    copy of that wrapper, traced as before, its interpreter the copy's."""
    if not staged:
        return write_wrapper(workdir / "traced-python", traces, tasks_python())
    prefix = workdir / "env"
    if not prefix.exists():
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
        (site,) = prefix.glob("lib/python3*/site-packages")
        suite = Path(sysconfig.get_paths()["purelib"])
        subprocess.run(["cp", "-al", *map(str, suite.iterdir()), str(site)], check=True)
        (prefix / "bin" / "python-real").symlink_to(os.path.realpath(sys.executable))
        (prefix / "bin" / "python").unlink()
    return write_wrapper(prefix / "bin" / "python", traces, '"$(dirname "$0")/python-real"')


def detach(traces: Path) -> None:
    """End the tracing (strace detaches on SIGTERM; the rank runs on untraced): once a rank is past its first
    step nothing more is counted, and every traced call stops it for a moment (:func:`write_wrapper`)."""
    for record in traces.glob("*/*.pid"):
        pid = int(record.read_text())
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "strace":
                os.kill(pid, signal.SIGTERM)
        except (OSError, ValueError):
            pass  # strace and its rank are gone already


def events(run_dir: Path) -> List[dict]:
    path = run_dir / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def launch(shape: Shape, steps: int, traces: Path, root: Path, overrides: List[str], python: Path) -> Path:
    """Launch gpt_tiny at ``shape`` with the traced tasks (no retry: an attempt that fails ends the run), end
    the tracing at its first step and wait for its end (stopping it past RUN_BOUND_S); its run directory. The
    launcher imports from this checkout (the working directory), the tasks from the run's frozen code only:
    PYTHONPATH is left out."""
    name = f"bringup-{shape.name}-{int(time.time())}"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    command = [sys.executable, "-m", "launcher", "model=gpt_tiny", f"gpus={shape.ranks}",
               f"layout.nodes={shape.nodes}", f"train.steps={steps}", "train.log_every=1", "train.eval_every=0",
               "train.checkpoint_every=0", "cluster.max_retries=0",
               f"cluster.python={python}", f"name={name}", f"run_root={root}", *overrides]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench_bringup.py: the launch failed:\n{done.stderr[-3000:]}")
    run_dir, start, traced = root / name, time.time(), True
    while not any(e["event"] == "attempt_ended" for e in events(run_dir)):
        if traced and any(e["event"] == "ready" for e in events(run_dir)):
            detach(traces)
            traced = False
        if time.time() - start > RUN_BOUND_S:
            subprocess.run([sys.executable, "-m", "launcher", "stop", name, "--root", str(root), "--now"],
                           cwd=ROOT, env=env, capture_output=True)
            raise SystemExit(f"bench_bringup.py: {run_dir} did not end within {RUN_BOUND_S} s: stopped")
        time.sleep(0.5)
    detach(traces)
    return run_dir


@dataclass
class Measured:
    """A shape's counts: each traced rank's (``count_trace``), by its node and rank."""

    shape: Shape
    ranks: Dict[Tuple[str, int], Traced]

    def per_rank(self, row: str) -> Dict[str, float]:
        return {where: statistics.median(traced.counts(row)[where] for traced in self.ranks.values())
                for where in WHERE}

    def per_node(self, row: str) -> Dict[str, float]:
        """A node's ranks' counts summed (their distinct paths joined), the mean over the nodes."""
        nodes: Dict[str, Counter] = defaultdict(Counter)
        paths: Dict[str, Dict[str, set]] = defaultdict(lambda: defaultdict(set))
        for (node, _), traced in self.ranks.items():
            nodes[node].update(traced.counts(row))
            for where, named in traced.paths.items():
                paths[node][where] |= named
        if row == "distinct":
            nodes = {node: Counter({where: len(named) for where, named in by.items()}) for node, by in paths.items()}
        return {where: statistics.mean(counts[where] for counts in nodes.values()) for where in WHERE}

    def job(self, row: str, where: str) -> int:
        return sum(traced.counts(row)[where] for traced in self.ranks.values())


def measure(shape: Shape, steps: int, overrides: List[str], workdir: Path) -> Measured:
    traces = workdir / f"traces-{shape.name}"
    python = traced_python(workdir, traces, "cluster.stage_env=true" in overrides)
    run_dir = launch(shape, steps, traces, workdir / "runs", overrides, python)
    happened = events(run_dir)
    ready = next((e for e in happened if e["event"] == "ready"), None)
    ended = [e for e in happened if e["event"] == "attempt_ended"]
    if ready is None:
        raise SystemExit(f"bench_bringup.py: {run_dir} never reached its first step "
                         f"(outcome {ended[-1].get('outcome') if ended else 'unknown'}); see its logs/")
    attempts = sorted(traces.glob(f"{ready['job_id']}.*"), key=lambda folder: int(folder.suffix[1:]))
    places = Places(str(python), run_dir)
    ranks = {}
    for trace in sorted(attempts[-1].glob("*.trace")) if attempts else []:
        node, rank = trace.stem.rsplit(".", 1)
        ranks[(node, int(rank))] = count_trace(trace, ready["time"], places)
    if len(ranks) != shape.ranks:
        raise SystemExit(f"bench_bringup.py: {len(ranks)} traces of {shape.ranks} ranks in {traces}")
    return Measured(shape, ranks)


HEADER = " " * 12 + "".join(f"{name:>10}" for name in [*WHERE, "shared", "+stdlib"])


def table_row(label: str, counts: Dict[str, float]) -> str:
    """One row: the counts by where, then on shared storage (environment and run directory) and with the
    standard library."""
    shared = sum(counts[where] for where in SHARED)
    values = [*(counts[where] for where in WHERE), shared, shared + counts["stdlib"]]
    return f"  {label:<10}" + "".join(f"{value:>10,.0f}" for value in values)


def report(measured: Measured) -> None:
    shape = measured.shape
    nodes = len({node for node, _ in measured.ranks})
    print(f"\n== {shape}: metadata operations from a rank's start to its first step")
    print(f"per rank (the median of {shape.ranks})\n{HEADER}")
    for row in ROWS:
        print(table_row(row, measured.per_rank(row)))
    print(f"per node (the mean of {nodes})\n{HEADER}")
    for row in ("all", "open", "stat", "getdents64", "distinct"):
        print(table_row(row, measured.per_node(row)))
    print(f"the job's opens (its {shape.ranks} ranks): under torch {measured.job('open', 'torch'):,}, "
          f"under the run's code {measured.job('open', 'run-code'):,}")


def model(measured: Measured, rate: float) -> None:
    """The largest shape's shared operations scaled to SCALES ranks at RANKS_A_NODE a node, against one metadata
    server answering ``rate`` operations a second and nothing else: every call of a node's ranks sent to it, and
    each distinct path of theirs once a node (a client that caches every lookup and open, as Lustre's and GPFS's
    can while they hold the server's lock), the two bounds of what a site's server sees."""
    every, distinct = measured.per_node("all"), measured.per_node("distinct")
    calls, paths = sum(every[where] for where in SHARED), sum(distinct[where] for where in SHARED)
    print(f"\n== model: a node's shared operations, {calls:,.0f} calls of {paths:,.0f} distinct paths "
          f"({every['stdlib']:,.0f} and {distinct['stdlib']:,.0f} more with the standard library), measured at "
          f"{measured.shape}, at {RANKS_A_NODE} ranks a node, against one metadata server at {rate:,.0f}/s")
    print(f"{'ranks':>8}{'nodes':>8}{'every call':>14}{'server s':>10}{'distinct paths':>16}{'server s':>10}")
    for ranks in SCALES:
        nodes = ranks // RANKS_A_NODE
        scale = nodes * RANKS_A_NODE / measured.shape.per_node  # a node's calls grow with its ranks
        print(f"{ranks:>8,}{nodes:>8,}{calls * scale:>14,.0f}{calls * scale / rate:>10,.1f}"
              f"{paths * nodes:>16,.0f}{paths * nodes / rate:>10,.1f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", metavar="OVERRIDE", help="a launch override for every run")
    parser.add_argument("--shapes", type=parse_shapes, help=f"NODESxRANKS,... (default {SHAPES})")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--mds-rate", type=float, default=MDS_RATE, help="metadata operations a second")
    parser.add_argument("--quick", action="store_true", help=f"--shapes {QUICK_SHAPES}: one job, seconds")
    args = parser.parse_args()
    shapes = args.shapes or parse_shapes(QUICK_SHAPES if args.quick else SHAPES)
    print(f"gpt_tiny, {args.steps} steps, traced: {TRACED}; overrides: {' '.join(args.overrides) or 'none'}")
    with tempfile.TemporaryDirectory(prefix="bringup-", ignore_cleanup_errors=True) as tmp:
        measured = [measure(shape, args.steps, args.overrides, Path(tmp)) for shape in shapes]
    for each in measured:
        report(each)
    model(max(measured, key=lambda each: each.shape.ranks), args.mds_rate)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
