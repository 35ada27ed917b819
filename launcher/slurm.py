"""The one module of launcher/ that runs Slurm's client tools (sinfo, squeue, sacct, scontrol, scancel, sbatch).

A :class:`Slurm` is bound to one cluster (its slurm.conf, or none for Slurm's own default) and passes that
cluster's environment to every call it makes, with a timeout; nothing here changes ``os.environ``, so two
clusters can be asked at once from threads. Output is always requested with named fields and parsed by
those names into dataclasses.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

REPO = Path(__file__).resolve().parents[1]
LOCAL_SLURM_CONF = REPO / ".slurm" / "etc" / "slurm.conf"
TIMEOUT_S = 20
PING_TIMEOUT_S = 4


class SlurmError(RuntimeError):
    """A Slurm client tool failed or could not be reached; the message is one line for the user."""


def slurm_conf_for(cluster_name: str, slurm_conf: Optional[str]) -> Optional[str]:
    """The slurm.conf of a cluster: its own (a relative path is relative to the repo), else for ``local``
    $SLURM_CONF or the repo's .slurm/; None means Slurm's own default ($SLURM_CONF, else the site's)."""
    if slurm_conf:
        return str(REPO / os.path.expanduser(slurm_conf))
    if cluster_name == "local":
        return os.environ.get("SLURM_CONF") or str(LOCAL_SLURM_CONF)
    return None


# ---- parsing by field name -------------------------------------------------------------------------------

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

    @property
    def max_time_min(self) -> Optional[int]:
        return minutes(self.max_time)

    def offers(self) -> str:
        """One phrase: ``2 nodes x 8 GPUs, 8 CPUs, 4096 MB each``."""
        return (f"{self.nodes} node{'s' if self.nodes != 1 else ''} x {self.gpus_per_node} GPUs, {self.cpus_per_node} CPUs, "
                f"{self.mem_mb_per_node} MB each")


def partitions_of(nodes: List[Node]) -> List[Partition]:
    by_name: Dict[str, List[Node]] = {}
    for node in nodes:
        by_name.setdefault(node.partition, []).append(node)
    return [Partition(name=name, default=group[0].default, nodes=len(group),
                      gpus_per_node=max(n.gpus for n in group),
                      gpu_type=next((n.gpu_type for n in group if n.gpu_type), None),
                      cpus_per_node=max(n.cpus for n in group), mem_mb_per_node=max(n.mem_mb for n in group),
                      max_nodes=group[0].max_nodes, max_time=group[0].max_time)
            for name, group in by_name.items()]


@dataclass(frozen=True)
class JobRow:
    """A job as sacct or squeue reports it, in Slurm's words (launcher/state.py folds them)."""

    job_id: str
    state: str
    reason: str
    nodes: str
    start: str
    end: str = ""
    elapsed: str = ""
    exit_code: str = ""
    source: str = ""


SACCT_FIELDS = ("JobID", "State", "Reason", "ExitCode", "Start", "End", "Elapsed", "NodeList")
SQUEUE_FIELDS = ("JobID", "State", "Reason", "NodeList", "StartTime", "TimeUsed")


def parse_sacct(out: str) -> List[JobRow]:
    return [JobRow(r["JobID"], r["State"], r["Reason"], r["NodeList"], r["Start"], r["End"], r["Elapsed"],
                   r["ExitCode"], "sacct") for r in field_rows(out, SACCT_FIELDS)]


def parse_squeue(out: str) -> List[JobRow]:
    return [JobRow(r["JobID"], r["State"], r["Reason"], r["NodeList"], r["StartTime"], "", r["TimeUsed"], "",
                   "squeue") for r in field_rows(out, SQUEUE_FIELDS)]


def sbatch_reason(stderr: str) -> str:
    """Slurm's reason from sbatch's complaint (``sbatch: error: Batch job submission failed: X`` -> ``X``)."""
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()] or ["sbatch failed"]
    last = re.sub(r"^sbatch: (error|fatal): ", "", lines[-1])
    return re.sub(r"^Batch job submission failed: ", "", last)


def _format(names: Sequence[str]) -> str:
    return ",".join(f"{name}:|" for name in names)


# ---- one cluster -------------------------------------------------------------------------------------------

@dataclass
class Slurm:
    """Slurm's client tools pointed at one cluster. ``conf`` None: Slurm's own default configuration."""

    conf: Optional[str]
    timeout: float = TIMEOUT_S
    _partitions: Optional[List[Partition]] = field(default=None, repr=False)

    @property
    def env(self) -> Dict[str, str]:
        env = dict(os.environ)
        if self.conf:
            env["SLURM_CONF"] = self.conf
        return env

    def run(self, args: Sequence[str], timeout: Optional[float] = None) -> str:
        """Run a client tool; its stdout, or SlurmError with its last error line (tool name said once)."""
        timeout = timeout or self.timeout
        try:
            proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=self.env)
        except FileNotFoundError:
            raise SlurmError(f"'{args[0]}' is not installed; run scripts/setup.sh or load your site's Slurm") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"'{' '.join(args[:2])}' did not answer in {timeout:.0f} s") from None
        if proc.returncode != 0:
            errors = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
            said = [ln.strip() for ln in proc.stdout.splitlines() if ln.strip()]  # scontrol ping: "... is DOWN"
            last = errors[-1] if errors else said[0] if said else f"exit code {proc.returncode}"
            raise SlurmError(last if last.startswith(f"{args[0]}:") else f"{args[0]}: {last}")
        return proc.stdout

    def unreachable(self, timeout: float = PING_TIMEOUT_S) -> Optional[str]:
        """Why the controller does not answer (``scontrol: ... is DOWN``), or None when it does."""
        try:
            out = self.run(["scontrol", "ping"], timeout=timeout)
        except SlurmError as err:
            return str(err)
        return None if "UP" in out else f"scontrol ping: {' '.join(out.split())}"

    def ping(self, timeout: float = PING_TIMEOUT_S) -> None:
        """SlurmError with a one-line hint when the controller cannot be reached."""
        why = self.unreachable(timeout)
        if why:
            where = self.conf or "$SLURM_CONF, else the site's default"
            raise SlurmError(f"Slurm is not reachable ({why}); start the cluster ('bash slurm/up.sh' for a local one) "
                             f"or check its slurm.conf ({where})")

    def nodes(self, timeout: Optional[float] = None) -> List[Node]:
        """Every node of every partition, with its resources and use: one sinfo call."""
        return parse_nodes(self.run(["sinfo", "-h", "-N", "-O", _format(NODE_FIELDS)], timeout))

    def partitions(self) -> List[Partition]:
        """The cluster's partitions, asked once per process (their shape does not change under a launch)."""
        if self._partitions is None:
            self._partitions = partitions_of(self.nodes())
        return self._partitions

    def partition(self, name: Optional[str]) -> Partition:
        """The named partition, or the default one."""
        parts = self.partitions()
        for part in parts:
            if (name is None and part.default) or part.name == name:
                return part
        names = ", ".join(p.name for p in parts) or "none"
        wanted = f"partition '{name}'" if name else "a default partition"
        raise SlurmError(f"the cluster has no {wanted} (partitions: {names})")

    def hostnames(self, nodelist: str) -> List[str]:
        """``node[1-2]`` as ``[node1, node2]``, in Slurm's order."""
        return self.run(["scontrol", "show", "hostnames", nodelist]).split()

    def node_states(self, nodelist: str) -> Dict[str, str]:
        """Each node of a node list with its current state."""
        rows = field_rows(self.run(["sinfo", "-h", "-N", "-n", nodelist, "-O", _format(("NodeList", "StateLong"))]),
                          ("NodeList", "StateLong"))
        return {row["NodeList"]: row["StateLong"] for row in rows}

    def sacct(self, job_ids: Sequence[str]) -> List[JobRow]:
        """Jobs from accounting; SlurmError where accounting is off or unreachable."""
        return parse_sacct(self.run(["sacct", "-X", "-P", "-n", "-j", ",".join(job_ids), "-o", ",".join(SACCT_FIELDS)]))

    def squeue(self) -> List[JobRow]:
        """Jobs still in the controller's memory (queued, running, or recently finished)."""
        return parse_squeue(self.run(["squeue", "-h", "-a", "--states=all", "-O", _format(SQUEUE_FIELDS)]))

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def sbatch(self, script: Path) -> str:
        """Submit a script; its job id, or SlurmError with Slurm's reason alone (one line)."""
        try:
            proc = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True,
                                  timeout=self.timeout, env=self.env)
        except FileNotFoundError:
            raise SlurmError("'sbatch' is not installed; run scripts/setup.sh or load your site's Slurm") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"sbatch did not answer in {self.timeout:.0f} s") from None
        if proc.returncode != 0:
            raise SlurmError(sbatch_reason(proc.stderr))
        return proc.stdout.strip().split(";")[0]

    def executor(self, folder: Path, max_num_timeout: int):
        """A submitit SlurmExecutor whose sbatch runs through this cluster (see :func:`_executor_class`)."""
        return _executor_class()(self, folder=folder, max_num_timeout=max_num_timeout)


_CLUSTERS: Dict[Optional[str], Slurm] = {}


def for_cluster(cluster) -> Slurm:
    """The Slurm of a ClusterConfig (one per slurm.conf per process, so partitions are asked once)."""
    conf = slurm_conf_for(cluster.name, cluster.slurm_conf)
    if conf not in _CLUSTERS:
        _CLUSTERS[conf] = Slurm(conf)
    return _CLUSTERS[conf]


@functools.lru_cache(maxsize=None)
def _executor_class():
    """submitit's SlurmExecutor with its sbatch call going through a :class:`Slurm` (imported lazily: submitit
    is only needed to submit). Only the submission itself is replaced; the script and folders are submitit's."""
    import uuid

    from submitit.core import utils
    from submitit.slurm.slurm import SlurmExecutor

    class ClusterExecutor(SlurmExecutor):
        def __init__(self, slurm: Slurm, **kwargs) -> None:
            super().__init__(**kwargs)
            self.slurm = slurm

        def _submit_command(self, command: str):
            tmp_uuid = uuid.uuid4().hex
            path = utils.JobPaths.get_first_id_independent_folder(self.folder) / f".submission_file_{tmp_uuid}.sh"
            path.write_text(self._make_submission_file_text(command, tmp_uuid))
            job = self.job_class(folder=self.folder, job_id=self.slurm.sbatch(path),
                                 tasks=list(range(self._num_tasks())))
            job.paths.move_temporary_file(path, "submission_file", keep_as_symlink=True)
            self._write_job_id(job.job_id, tmp_uuid)
            self._set_job_permissions(job.paths.folder)
            return job

    return ClusterExecutor
