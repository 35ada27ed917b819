"""What Slurm's client tools print, parsed by field name into typed rows (launcher/slurm/client.py runs the tools).

Output is requested with named fields (``sinfo -O``, ``squeue -O``, ``sacct -o``), one ``|`` after each value,
and every row is zipped with those names, so adding a field never shifts another. srun's reports of a step's
tasks and nodes, which it prints only in its own words, are read here too (:func:`srun_task_ends`).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple


# Slurm's words for a controller that did not answer (rather than one that refused): asked again, with backoff.
CONTROLLER_SILENT = re.compile(r"Unable to contact slurm controller|Socket timed out|Connection refused|"
                               r"Zero Bytes were transmitted|Resource temporarily unavailable|try again",
                               re.IGNORECASE)


class SlurmError(RuntimeError):
    """A Slurm client tool failed or could not be reached; the message is one line for the user.
    ``transient``: the controller did not answer (a tool that timed out, or Slurm's words for it,
    :data:`CONTROLLER_SILENT`), so the same request may pass when asked again; else Slurm refused it."""

    def __init__(self, message: str, transient: Optional[bool] = None) -> None:
        super().__init__(message)
        self.transient = bool(CONTROLLER_SILENT.search(message)) if transient is None else transient


class Unreachable(SlurmError):
    """The cluster's controller does not answer (or its slurm.conf is not there): a launch may have meant another."""


class NoPartition(SlurmError):
    """Slurm answered, and the cluster has no such partition (or no default one): a refusal, not a silence."""


@dataclass(frozen=True)
class Gres:
    gpus: int
    gpu_type: Optional[str]  # None where the gres names no type (``gpu:8``)


def parse_gres(gres: str) -> Gres:
    """The GPUs in a gres string: ``gpu:8``, ``gpu:h100:8(S:0-1)``, ``craynetwork:1,gpu:a100:2``, ``(null)``."""
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and parts[-1].isdigit():
            return Gres(int(parts[-1]), parts[1] if len(parts) == 3 else None)
    return Gres(0, None)


def field_rows(out: str, names: Sequence[str]) -> List[Dict[str, str]]:
    """Rows of ``|``-separated values (``-O Name:|`` or ``-P`` output) zipped with the field names."""
    rows = []
    for line in out.splitlines():
        values = line.split("|")
        if len(values) < len(names):
            raise SlurmError(f"unexpected Slurm output {line!r} for fields {','.join(names)}")
        rows.append({name: value.strip() for name, value in zip(names, values)})
    return rows


def minutes(text: str) -> Optional[int]:
    """A Slurm time limit (``infinite``, ``30:00``, ``4:00:00``, ``2-00:00:00``) in minutes; None if unlimited."""
    if not text or text.lower() in ("infinite", "unlimited", "n/a"):
        return None
    days, _, clock = text.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    seconds = {1: lambda: parts[0] * 60, 2: lambda: parts[0] * 60 + parts[1],
               3: lambda: parts[0] * 3600 + parts[1] * 60 + parts[2]}[len(parts)]()
    return (int(days or 0) * 86400 + seconds) // 60


def max_job_nodes(size: str) -> Optional[int]:
    """The upper end of sinfo's job size ``1-infinite`` / ``1-4``; None if unlimited."""
    top = size.rpartition("-")[2]
    return int(top) if top.isdigit() else None


@dataclass(frozen=True)
class Node:
    """One node of one partition (a node in two partitions is two rows), as sinfo reports it."""

    name: str
    partition: str
    default: bool
    gpus: int
    gpu_type: Optional[str]
    gpus_used: int
    state: str
    cpus: int
    mem_mb: int
    max_time: str
    max_nodes: Optional[int]


NODE_FIELDS = ("NodeList", "Partition", "Gres", "GresUsed", "StateLong", "CPUs", "Memory", "Time", "Size")


def parse_nodes(out: str) -> List[Node]:
    nodes = []
    for row in field_rows(out, NODE_FIELDS):
        gres = parse_gres(row["Gres"])
        nodes.append(Node(
            name=row["NodeList"], partition=row["Partition"].rstrip("*"), default=row["Partition"].endswith("*"),
            gpus=gres.gpus, gpu_type=gres.gpu_type, gpus_used=parse_gres(row["GresUsed"]).gpus,
            state=row["StateLong"], cpus=int(row["CPUs"]), mem_mb=int(row["Memory"] or 0), max_time=row["Time"],
            max_nodes=max_job_nodes(row["Size"])))
    return nodes


@dataclass(frozen=True)
class Partition:
    """What a partition can ever hold (the largest node's resources where nodes differ)."""

    name: str
    default: bool
    nodes: int
    gpus_per_node: int
    gpu_type: Optional[str]
    cpus_per_node: int
    mem_mb_per_node: int
    max_nodes: Optional[int]  # per job (MaxNodes); None if unlimited
    max_time: str  # as Slurm prints it
    gpu_types: Tuple[str, ...] = ()  # every type of GPU its nodes have (gres gpu:TYPE:N), sorted

    @property
    def max_time_min(self) -> Optional[int]:
        return minutes(self.max_time)

    def offers(self) -> str:
        """One phrase: ``2 nodes x 8 GPUs, 8 CPUs, 4096 MB each``."""
        return (f"{self.nodes} node{'s' if self.nodes != 1 else ''} x {self.gpus_per_node} GPUs, "
                f"{self.cpus_per_node} CPUs, {self.mem_mb_per_node} MB each")


def partitions_of(nodes: List[Node]) -> List[Partition]:
    by_name: Dict[str, List[Node]] = {}
    for node in nodes:
        by_name.setdefault(node.partition, []).append(node)
    return [Partition(name=name, default=group[0].default, nodes=len(group),
                      gpus_per_node=max(n.gpus for n in group),
                      gpu_type=next((n.gpu_type for n in group if n.gpu_type), None),
                      cpus_per_node=max(n.cpus for n in group), mem_mb_per_node=max(n.mem_mb for n in group),
                      max_nodes=group[0].max_nodes, max_time=group[0].max_time,
                      gpu_types=tuple(sorted({n.gpu_type for n in group if n.gpu_type})))
            for name, group in by_name.items()]


@dataclass(frozen=True)
class JobRow:
    """A job as sacct or squeue reports it, in Slurm's words (launcher/status/job_state.py folds them).

    ``job_id`` is the job's name in Slurm's commands and in a run's record: ``123``, or ``123_4`` for element 4
    of job array 123. ``unique_id`` is the number in the job's own ``SLURM_JOB_ID`` (an element has one of its
    own once it starts; the same as ``job_id`` for a job that is no array's)."""

    job_id: str
    state: str
    reason: str
    nodes: str
    start: str
    end: str = ""
    elapsed: str = ""
    exit_code: str = ""
    source: str = ""
    unique_id: str = ""
    # squeue's only (a pending job's reason in words needs them: launcher/status/pending.py)
    user: str = ""
    partition: str = ""
    gpus: int = 0  # asked for (pending) or held (running)
    priority: float = 0.0
    qos: str = ""


SACCT_FIELDS = ("JobID", "JobIDRaw", "State", "Reason", "ExitCode", "Start", "End", "Elapsed", "NodeList")
# squeue's JobArrayID is what sacct calls JobID (``123_4``), its JobID what sacct calls JobIDRaw.
SQUEUE_FIELDS = ("JobArrayID", "JobID", "State", "Reason", "NodeList", "StartTime", "TimeUsed", "UserName",
                 "Partition", "tres-alloc", "Priority", "QOS")


def parse_sacct(out: str) -> List[JobRow]:
    return [JobRow(element, r["State"], r["Reason"], r["NodeList"], r["Start"], r["End"], r["Elapsed"],
                   r["ExitCode"], "sacct", r["JobIDRaw"])
            for r in field_rows(out, SACCT_FIELDS) for element in array_elements(r["JobID"])]


def parse_squeue(out: str) -> List[JobRow]:
    return [JobRow(element, r["State"], r["Reason"], r["NodeList"], r["StartTime"], "", r["TimeUsed"], "",
                   "squeue", r["JobID"], r["UserName"], r["Partition"], tres_gpus(r["tres-alloc"]),
                   _number(r["Priority"]), r["QOS"])
            for r in field_rows(out, SQUEUE_FIELDS) for element in array_elements(r["JobArrayID"])]


def tres_gpus(tres: str) -> int:
    """The GPUs in a job's trackable resources (``cpu=2,node=1,gres/gpu=2``; typed ``gres/gpu:h100=8`` counted
    only where the untyped total is missing)."""
    counts = dict(item.split("=", 1) for item in tres.split(",") if "=" in item)
    if counts.get("gres/gpu", "").isdigit():
        return int(counts["gres/gpu"])
    return sum(int(v) for k, v in counts.items() if k.startswith("gres/gpu:") and v.isdigit())


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


# A job array's elements that have not started, on one row: ``123_[5-11%2]``, ``123_[1,3,7-9]``.
_PENDING_ELEMENTS = re.compile(r"(?P<array>\d+)_\[(?P<indices>[\d,-]+)(%\d+)?\]")


def array_elements(job_id: str) -> List[str]:
    """The jobs one row of sacct or squeue stands for: itself, or each element of a row of pending array
    elements (``123_[5-7%2]`` is ``123_5``, ``123_6``, ``123_7``), as each element's record names it."""
    match = _PENDING_ELEMENTS.fullmatch(job_id)
    if not match:
        return [job_id]
    return [f"{match['array']}_{index}" for index in expand_ranks(match["indices"])]


def sbatch_reason(stderr: str) -> str:
    """Slurm's reason from sbatch's complaint (``sbatch: error: Batch job submission failed: X`` -> ``X``)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()] or ["sbatch failed"]
    last = re.sub(r"^sbatch: (error|fatal): ", "", lines[-1])
    return re.sub(r"^Batch job submission failed: ", "", last)


# sbatch --test-only's answer on stderr: "sbatch: Job 197 to start at 2026-12-06T06:21:57 using 1 processors on nodes
# local-node1 in partition gpu".
_TEST_ONLY = re.compile(r"Job \d+ to start at (?P<start>\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d) using \d+ "
                        r"processors? on nodes (?P<nodes>\S+) in partition (?P<partition>\S+)")


@dataclass(frozen=True)
class TestOnly:
    """When Slurm would start a job (``sbatch --test-only``): its expected start (epoch seconds, this host's
    clock), the nodes and partition it would be given."""

    __test__ = False  # not a test class, whatever pytest's name rule says

    start: float
    nodes: str
    partition: str


def parse_test_only(stderr: str) -> TestOnly:
    """sbatch --test-only's answer; SlurmError with Slurm's reason where it names no start (a refusal:
    ``allocation failure: Requested node configuration is not available``)."""
    found = _TEST_ONLY.search(stderr)
    when = start_epoch(found["start"]) if found else None
    if found is None or when is None:
        raise SlurmError(sbatch_reason(stderr))
    return TestOnly(when, found["nodes"], found["partition"])


def start_epoch(text: str, now: Optional[float] = None) -> Optional[float]:
    """A start as Slurm prints it (``2026-12-06T06:21:57``, this host's local time) in epoch seconds; None where it
    names none (``N/A``, ``Unknown``). Where ``now`` is given, a start not after it is None too: squeue's StartTime
    of a pending job the scheduler has not planned yet holds its submission time, so only a start ahead is a plan.
    sbatch --test-only's start is always a plan, one of now meaning now: it is read without ``now``."""
    try:
        when = time.mktime(time.strptime(text, "%Y-%m-%dT%H:%M:%S"))
    except ValueError:
        return None
    return None if now is not None and when <= now else when


def field_list(names: Sequence[str]) -> str:
    """``-O`` / ``--Format`` argument for these fields, each value followed by ``|``."""
    return ",".join(f"{name}:|" for name in names)


# Words of a node state (sinfo's StateLong) that mean no job can run there now.
UNUSABLE = ("down", "drain", "fail", "not_responding", "maint", "reboot", "power", "unknown", "inval")


def unusable(state: str) -> bool:
    """A node in this state runs nothing: down, drained, failing, not responding, ... (``*`` is no response)."""
    state = state.lower()
    return state.endswith("*") or any(word in state for word in UNUSABLE)


# srun's line for a task that ended badly: "srun: error: node2: task 2: Killed",
# "srun: error: node1: tasks 0-1: Exited with exit code 1".
SRUN_TASK = re.compile(r"srun: error: (?P<node>\S+): tasks? (?P<tasks>[\d,-]+): (?P<how>.+)$")
# srun's lines as it ends the step itself: "srun: launch/slurm: _step_signal: Terminating StepId=17.0", "srun: Job
# step aborted: Waiting up to 32 seconds for job step to finish."
SRUN_ENDS_STEP = re.compile(r"_step_signal: Terminating StepId|Job step aborted")
# srun's lines for a node it lost: "srun: error: Task launch for StepId=6.0 failed on node n2: Communication
# connection failure", "srun: error: Node failure on n2".
SRUN_NODE_LOST = re.compile(r"Task launch for StepId=\S+ failed on node (?P<launch>[^\s:]+)|"
                            r"Node failure on (?P<node>[^\s:]+)")


@dataclass(frozen=True)
class TaskEnd:
    """One srun report of tasks that ended badly; ``after_end``: reported once srun had begun ending the step itself
    (``--kill-on-bad-exit`` after another task's end), so srun's doing, not the tasks' own (a task that ignored its
    SIGTERM, still importing, is then SIGKILLed and reported "Killed")."""

    node: str
    ranks: List[int]
    how: str  # "Killed", "Exited with exit code 1", "Segmentation fault", ...
    after_end: bool = False


def expand_ranks(text: str) -> List[int]:
    """``0-1,3`` as [0, 1, 3]."""
    ranks: List[int] = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        ranks += list(range(int(first), int(last or first) + 1))
    return ranks


def srun_task_ends(stderr: str) -> List[TaskEnd]:
    """srun's reports of tasks that ended badly, in the order srun printed them (first failure first), each marked
    when srun had already begun ending the step."""
    ends, ending = [], False
    for line in stderr.splitlines():
        match = SRUN_TASK.search(line.strip())
        if match:
            ends.append(TaskEnd(match["node"], expand_ranks(match["tasks"]), match["how"].strip(), ending))
        ending = ending or bool(SRUN_ENDS_STEP.search(line))
    return ends


def srun_lost_nodes(stderr: str) -> List[str]:
    """The nodes srun reports it lost or could not start a task on, in the order it reported them."""
    lost: List[str] = []
    for match in SRUN_NODE_LOST.finditer(stderr):
        node = match["launch"] or match["node"]
        if node not in lost:
            lost.append(node)
    return lost
