"""The one module of launcher/ that runs Slurm's client tools (sinfo, squeue, sacct, scontrol, scancel, sbatch).

A :class:`Slurm` is bound to one cluster (its slurm.conf, or none for Slurm's own default) and passes that
cluster's environment to every call it makes, with a timeout; nothing here changes ``os.environ``, so two
clusters can be asked at once from threads. Output is always requested with named fields and parsed by
those names into dataclasses.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import pwd
import re
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from launcher.core.rundir import SOURCE_ROOT, launcher_home
from launcher.core.store import CREDENTIAL_VARIABLES
from launcher.slurm.limits import (ASSOC_FIELDS, QOS_FIELDS, SiteRules, cached, enforce_words, parse_associations,
                                   parse_partition_rules, parse_qos)
from launcher.slurm.output import (NODE_FIELDS, SACCT_FIELDS, SQUEUE_FIELDS, JobRow, Node, NoPartition, Partition,
                                   SlurmError, TestOnly, Unreachable, array_elements, field_list, field_rows,
                                   parse_nodes, parse_sacct, parse_squeue, parse_test_only, partitions_of,
                                   sbatch_reason, srun_lost_nodes, unusable)

LOCAL_SLURM_CONF = SOURCE_ROOT / ".slurm" / "etc" / "slurm.conf"
LOCAL_UP = SOURCE_ROOT / "slurm" / "up.sh"  # what starts the local cluster, in a checkout only
LOCAL_MARK = "# Written by slurm/up.sh"  # the first line of every slurm.conf it writes


def not_the_local_cluster(conf: Optional[str]) -> bool:
    """Whether ``conf`` (cluster ``local``'s slurm.conf: $SLURM_CONF, else the checkout's) is a real cluster's,
    not one slurm/up.sh wrote: a site's, exported for its own tools."""
    try:
        with open(conf or "", encoding="utf-8", errors="replace") as f:
            return not f.readline().startswith(LOCAL_MARK)
    except OSError:
        return False  # none there: unreachable, said as such
TIMEOUT_S = 20
PING_TIMEOUT_S = 4
PARTITIONS_TIMEOUT_S = 10  # a dry run asks for the GPU type and must not wait long on a silent cluster
PROBE_TIMEOUT_S = 30  # srun gives up on a node whose slurmd does not answer in about 10 s


def slurm_conf_for(cluster_name: str, slurm_conf: Optional[str]) -> Optional[str]:
    """The slurm.conf of a cluster: its own (a relative path is relative to the repo), else for ``local``
    $SLURM_CONF or the repo's .slurm/; None means Slurm's own default ($SLURM_CONF, else the site's)."""
    if slurm_conf:
        return str(SOURCE_ROOT / os.path.expanduser(slurm_conf))
    if cluster_name == "local":
        return os.environ.get("SLURM_CONF") or str(LOCAL_SLURM_CONF)
    return None


@dataclass
class Slurm:
    """Slurm's client tools pointed at one cluster. ``conf`` None: Slurm's own default configuration."""

    conf: Optional[str]
    timeout: float = TIMEOUT_S
    _partitions: Optional[List[Partition]] = field(default=None, repr=False)
    _asking: Optional[threading.Thread] = field(default=None, repr=False, compare=False)
    _failed: Optional[SlurmError] = field(default=None, repr=False, compare=False)
    _rules: Optional[SiteRules] = field(default=None, repr=False, compare=False)
    # The oldest of the last known answers :data:`SHARED` gave this Slurm, the controller not answering again.
    stale: Optional["Stale"] = field(default=None, repr=False, compare=False)

    @property
    def env(self) -> Dict[str, str]:
        # A row of pending array elements (``123_[5-11%2]``) in full, not cut at 64 characters. An array element's
        # own variables stay out: sbatch would hand them to the job it submits (a retry of the element is a plain
        # job), whose steps would then take it for the element.
        # Nor do the object store's credentials (launcher/core/store.py): sbatch would keep them in the job's
        # environment, which the controller stores and sacct shows; the tasks get them from the secrets store.
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_ARRAY_")
                  and k not in CREDENTIAL_VARIABLES}, "SLURM_BITSTR_LEN": "0"}
        if self.conf:
            env["SLURM_CONF"] = self.conf
        return env

    def run(self, args: Sequence[str], timeout: Optional[float] = None) -> str:
        """Run a client tool; its stdout, or SlurmError with its last error line (tool name said once). A question
        (not an action) is answered from :data:`SHARED` while it shares answers: where the controller does not
        answer, with the last answer it had, noted in :attr:`stale`."""
        if SHARED.max_age_s and _asks(args) and not getattr(SHARED.here, "fresh", False):
            kept: List[Stale] = []
            text = SHARED.answer(self.conf, tuple(args), lambda: self._run(args, timeout), kept)
            if kept and (self.stale is None or kept[0].as_of < self.stale.as_of):
                self.stale = kept[0]
            return text
        return self._run(args, timeout)

    def _run(self, args: Sequence[str], timeout: Optional[float] = None) -> str:
        timeout = timeout or self.timeout
        if self.conf and not os.path.isfile(self.conf):  # the tools would wait for their timeout to say so
            raise SlurmError(f"{args[0]}: its slurm.conf {self.conf} does not exist")
        try:
            proc = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=self.env)
        except FileNotFoundError:
            raise SlurmError(f"'{args[0]}' is not installed; run scripts/setup.sh or load your site's Slurm") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"'{' '.join(args[:2])}' did not answer in {timeout:.0f} s", transient=True) from None
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
        if why and self.conf == str(LOCAL_SLURM_CONF) and not LOCAL_UP.is_file():
            # an installed package's own local cluster: its path means nothing to the user, there is no up.sh
            raise Unreachable("the local cluster is not running (no slurm/up.sh started one for this installation; "
                             "it is for a checkout's tests): choose your cluster with cluster=NAME, or 'launcher "
                             "clusters add NAME' first")
        if why:
            where = self.conf or "$SLURM_CONF, else the site's default"
            raise Unreachable(f"Slurm is not reachable ({why}); start the cluster ('bash slurm/up.sh' for a local one) "
                             f"or check its slurm.conf ({where})")

    def nodes(self, timeout: Optional[float] = None) -> List[Node]:
        """Every node of every partition, with its resources and use: one sinfo call."""
        return parse_nodes(self.run(["sinfo", "-h", "-N", "-O", field_list(NODE_FIELDS)], timeout))

    def partitions(self) -> List[Partition]:
        """The cluster's partitions, asked once per process (their shape does not change under a launch)."""
        self._join()
        if self._failed is not None:  # the prefetch's error, said once
            failed, self._failed = self._failed, None
            raise failed
        if self._partitions is None:
            self._partitions = partitions_of(self.nodes(timeout=PARTITIONS_TIMEOUT_S))
        return self._partitions

    def prefetch(self) -> None:
        """Start asking for the partitions and the site's rules in a thread, so that Slurm answers while Hydra
        composes a launch; :meth:`partitions` and :meth:`site_rules` then wait for those answers (or raise the
        partitions' SlurmError) instead of asking again. Rules that could not be asked are asked again then."""
        if self._partitions is not None or self._asking is not None:
            return

        def ask() -> None:
            try:
                self._partitions = partitions_of(self.nodes(timeout=PARTITIONS_TIMEOUT_S))
            except SlurmError as err:
                self._failed = err
                return
            try:
                self._rules = self._cached_rules()
            except SlurmError:
                pass

        self._asking = threading.Thread(target=ask, daemon=True)
        self._asking.start()

    def _join(self) -> None:
        if self._asking is not None:
            self._asking.join()
            self._asking = None

    def partition(self, name: Optional[str]) -> Partition:
        """The named partition, or the default one."""
        parts = self.partitions()
        for part in parts:
            if (name is None and part.default) or part.name == name:
                return part
        names = ", ".join(p.name for p in parts) or "none"
        wanted = f"partition '{name}'" if name else "a default partition"
        raise NoPartition(f"the cluster has no {wanted} (partitions: {names})")

    def features(self, partition: str) -> List[str]:
        """The node features every node of ``partition`` has (slurm.conf's ``Features=``)."""
        rows = [set(filter(None, line.strip().split(","))) - {"(null)"}
                for line in self.run(["sinfo", "-h", "-N", "-p", partition, "-o", "%f"]).splitlines() if line.strip()]
        return sorted(set.intersection(*rows)) if rows else []

    def default_account(self) -> Optional[str]:
        """This user's default account in accounting, or None (no accounting, or no account set)."""
        try:
            out = self.run(["sacctmgr", "-n", "-P", "show", "user", user_name(), "format=DefaultAccount"])
        except SlurmError:
            return None
        return next((line.strip() for line in out.splitlines() if line.strip()), None)

    def site_rules(self) -> SiteRules:
        """What the site's accounting lets this user run (launcher/slurm/limits.py), asked at most every few
        minutes: kept in the launcher's home per cluster and user. SlurmError when Slurm cannot be asked."""
        self._join()
        if self._rules is None:
            self._rules = self._cached_rules()
        return self._rules

    def _cached_rules(self) -> SiteRules:
        user = user_name()
        # Slurm's default configuration is whichever $SLURM_CONF names now (one site's, then another's)
        where = self.conf or os.environ.get("SLURM_CONF") or "Slurm's default"
        key = hashlib.sha256(f"{where}\0{user}".encode()).hexdigest()[:16]
        return cached(launcher_home() / "cache" / f"site-rules-{key}.json", lambda: self._ask_site_rules(user))

    def _ask_site_rules(self, user: str) -> SiteRules:
        config = self.run(["scontrol", "show", "config"])
        enforce = enforce_words(config)
        if not enforce:  # nothing to know: Slurm refuses no job for its account or QOS
            return SiteRules(user, (), "", (), {}, {})
        cluster = re.search(r"^ClusterName\s*=\s*(\S+)", config, re.M)
        where = [f"cluster={cluster.group(1)}"] if cluster else []
        assocs = parse_associations(self.run(["sacctmgr", "-n", "-P", "show", "assoc", f"user={user}", *where,
                                              f"format={','.join(ASSOC_FIELDS)}"]))
        qos = parse_qos(self.run(["sacctmgr", "-n", "-P", "show", "qos", f"format={','.join(QOS_FIELDS)}"]))
        parts = parse_partition_rules(self.run(["scontrol", "show", "partition", "-o"]))
        return SiteRules(user, enforce, self.default_account() or "", assocs, qos, parts)

    def hostnames(self, nodelist: str) -> List[str]:
        """``node[1-2]`` as ``[node1, node2]``, in Slurm's order."""
        return self.run(["scontrol", "show", "hostnames", nodelist]).split()

    def node_states(self, nodelist: str) -> Dict[str, str]:
        """Each node of a node list with its current state."""
        rows = field_rows(self.run(["sinfo", "-h", "-N", "-n", nodelist, "-O", field_list(("NodeList", "StateLong"))]),
                          ("NodeList", "StateLong"))
        return {row["NodeList"]: row["StateLong"] for row in rows}

    def node_reasons(self, nodelist: str) -> Dict[str, str]:
        """Each node of a node list that runs nothing, with its state and the reason set on it, in Slurm's words
        (``drained: trial``, ``down*: Not responding``)."""
        fields = ("NodeList", "StateLong", "Reason")
        rows = field_rows(self.run(["sinfo", "-h", "-N", "-n", nodelist, "-O", field_list(fields)]), fields)
        return {row["NodeList"]: row["StateLong"] + (f": {row['Reason']}" if row["Reason"].strip() not in ("", "none")
                                                     else "")
                for row in rows if unusable(row["StateLong"])}

    def sacct(self, job_ids: Sequence[str]) -> List[JobRow]:
        """Jobs from accounting; SlurmError where accounting is off or unreachable."""
        return parse_sacct(self.run(["sacct", "-X", "-P", "-n", "-j", ",".join(job_ids), "-o", ",".join(SACCT_FIELDS)]))

    def squeue(self, user: Optional[str] = None) -> List[JobRow]:
        """Jobs still in the controller's memory (queued, running, or recently finished); ``user``'s only where
        given (a site's queue may hold tens of thousands of others)."""
        mine = ["-u", user] if user else []
        return parse_squeue(self.run(["squeue", "-h", "-a", "--states=all", *mine, "-O", field_list(SQUEUE_FIELDS)]))

    def job_names(self, user: str) -> Dict[str, str]:
        """The names of ``user``'s jobs still in the controller's memory, by job (``123``, ``123_4``): the launcher
        names a run's job after the run, a job array after its sweep, and a watcher after either
        (launcher/slurm/batch.py ``WATCHER_SUFFIX``)."""
        fields = ("JobArrayID", "Name")  # the name last: a name holding the separator cuts only itself
        rows = field_rows(self.run(["squeue", "-h", "-a", "--states=all", "-u", user, "-O", field_list(fields)]),
                          fields)
        return {element: row["Name"] for row in rows for element in array_elements(row["JobArrayID"])}

    def job_end(self, job_id: str) -> Optional[JobRow]:
        """sacct's account of how a job ended: its state and exit code (``0:9``: killed by signal 9), with the node
        of its batch step, the batch host (a killed batch shell's step itself reads CANCELLED, the job FAILED);
        None when sacct has no such job."""
        rows = parse_sacct(self.run(["sacct", "-P", "-n", "-j", job_id, "-o", ",".join(SACCT_FIELDS)]))
        job = next((row for row in rows if row.job_id == job_id), None)
        batch = next((row for row in rows if row.job_id == f"{job_id}.batch"), None)
        return dataclasses.replace(job, nodes=batch.nodes) if job and batch and batch.nodes else job

    def job_state(self, job_id: str) -> str:
        """Slurm's state of one job (``123``, or ``123_4`` of an array) while the controller remembers it, in its
        words (``RUNNING``, ``CANCELLED by 1000``); "" once it does not."""
        try:
            out = self.run(["squeue", "-h", "--states=all", "-j", job_id, "-O", field_list(SQUEUE_FIELDS)])
        except SlurmError as err:
            if "Invalid job id" in str(err):  # purged from the controller's memory: long ended
                return ""
            raise
        return next((row.state for row in parse_squeue(out) if job_id in (row.job_id, row.unique_id)), "")

    def cancel(self, job_id: str) -> None:
        self.run(["scancel", job_id])

    def requeue(self, job_id: str) -> None:
        """Put a running job back in the queue (same job id): Slurm ends its processes and starts it again."""
        self.run(["scontrol", "requeue", job_id])

    def unanswering(self, job_id: str, nodelist: str, timeout: float = PROBE_TIMEOUT_S) -> List[str]:
        """The nodes of a running job's allocation where Slurm cannot start a task now: one step of ``true`` on
        every node (``--overlap``: beside whatever still runs). Before the controller marks a dead node down
        (``SlurmdTimeout``, often minutes) it still reads "idle"; this asks its slurmd. [] when all answer,
        and when the probe itself cannot run (no srun, the job gone): no node is blamed without evidence."""
        nodes = self.hostnames(nodelist)
        try:
            proc = subprocess.run(["srun", f"--jobid={job_id}", "--overlap", f"--nodes={len(nodes)}",
                                   f"--ntasks={len(nodes)}", "--ntasks-per-node=1", f"--nodelist={nodelist}",
                                   "--time=1", "--quiet", "true"],
                                  capture_output=True, text=True, timeout=timeout, env=self.env)
        except FileNotFoundError:
            return []
        except subprocess.TimeoutExpired as err:
            stderr = err.stderr.decode(errors="replace") if isinstance(err.stderr, bytes) else (err.stderr or "")
            return [node for node in srun_lost_nodes(stderr) if node in nodes]
        return [] if proc.returncode == 0 else [node for node in srun_lost_nodes(proc.stderr) if node in nodes]

    def slurmd_timeout_s(self) -> int:
        """The controller's SlurmdTimeout: how long a node may stay silent before Slurm marks it down."""
        return self._config_number("SlurmdTimeout", 0)

    def kill_wait_s(self) -> int:
        """The controller's KillWait: how long Slurm waits after its SIGTERM to a job's tasks before SIGKILL."""
        return self._config_number("KillWait", 30)  # Slurm's default

    def max_array_size(self) -> int:
        """The controller's MaxArraySize: a job array's indices must be below it (0: no job arrays)."""
        return self._config_number("MaxArraySize", 1001)  # Slurm's default

    def _config_number(self, name: str, default: int) -> int:
        found = re.search(rf"^{name}\s*=\s*(\d+)", self.run(["scontrol", "show", "config"]), re.M)
        return int(found.group(1)) if found else default

    def start_now(self, job_id: str) -> None:
        """Make a pending job eligible now (the update also wakes the scheduler): Slurm gives a requeued job a
        begin time 10-30 s ahead (the queue shows ``PD (BeginTime)``), which a run resuming from its checkpoint
        would only wait out."""
        self.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])

    def set_comment(self, job_id: str, text: str) -> None:
        """The job's Comment, as squeue (``%k``) and sacct show it."""
        self.run(["scontrol", "update", f"JobId={job_id}", f"Comment={text}"])

    def sbatch(self, script: Path, flags: Sequence[str] = ()) -> str:
        """Submit a script (with sbatch's ``flags`` besides its own #SBATCH lines); its job id, or SlurmError with
        Slurm's reason alone (one line)."""
        proc = self._sbatch(["--parsable", *flags, str(script)], self.timeout)
        if proc.returncode != 0:
            raise SlurmError(sbatch_reason(proc.stderr))
        return proc.stdout.strip().split(";")[0]

    def test_only(self, script: Path, timeout: Optional[float] = None) -> TestOnly:
        """When Slurm would start ``script`` were it submitted now (``sbatch --test-only``: nothing is queued);
        SlurmError with Slurm's reason where it would refuse it."""
        return parse_test_only(self._sbatch(["--test-only", str(script)], timeout or self.timeout).stderr)

    def _sbatch(self, args: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
        try:
            return subprocess.run(["sbatch", *args], capture_output=True, text=True, timeout=timeout, env=self.env)
        except FileNotFoundError:
            raise SlurmError("'sbatch' is not installed; run scripts/setup.sh or load your site's Slurm") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"sbatch did not answer in {timeout:.0f} s", transient=True) from None

_CLUSTERS: Dict[Optional[str], Slurm] = {}


def _asks(args: Sequence[str]) -> bool:
    """Whether a call only asks (sinfo, squeue, sacct, scontrol ping/show): one whose answer may be shared."""
    return args[0] in ("sinfo", "squeue", "sacct") or (args[0] == "scontrol" and args[1] in ("ping", "show"))


def as_of(stamp: float) -> str:
    """``as of 12:04:31``: when something last known was known, in the local time of day."""
    return f"as of {time.strftime('%H:%M:%S', time.localtime(stamp))}"


@dataclass(frozen=True)
class Stale:
    """A last known answer, given because asking Slurm again failed: when it was answered (``as_of``, wall-clock
    time), since when asking fails, and why."""

    as_of: float
    failing_since: float
    why: str

    def words(self, now: float) -> str:
        """``as of 12:04:31; Slurm not answering for 40 s``"""
        return f"{as_of(self.as_of)}; Slurm not answering for {max(0.0, now - self.failing_since):.0f} s"


@dataclass
class Asking:
    """A question out to Slurm (:class:`SharedAnswers`): since when (wall-clock time), and set once answered, with
    its answer (stdout or SlurmError), which those who waited for it take even if the kept ones were forgotten
    meanwhile."""

    since: float
    done: threading.Event = field(default_factory=threading.Event)
    answer: object = None


class SharedAnswers:
    """Slurm's answers to questions, kept ``max_age_s`` and shared by every caller in this process: a long-lived
    process that many clients ask at once (the web console, launcher/console/) asks each cluster a question at
    most once per ``max_age_s``, however many tabs are open. Off (0) in the commands, which ask once and exit. A
    failure is kept as long (an unreachable cluster is not asked again each refresh), and a caller asking what is
    being asked waits for that answer. Where a question was answered before and the controller does not answer it
    again (a timeout, a silence) or not yet (within ``wait_s``), the last known answer is given instead, dated
    (:class:`Stale`): a slow or restarting controller leaves the pages with what was last known rather than nothing
    or a wait. ``forget(conf)`` after an
    action there (a stop) makes the next ask fresh."""

    def __init__(self) -> None:
        self.max_age_s = 0.0
        self.wait_s = 2.0  # how long a caller waits for a new answer where a last known one can be given instead
        self.calls = 0  # the tools run on behalf of callers, for the console's measure of its load on Slurm
        self._kept: Dict[tuple, tuple] = {}  # (conf, args) -> (when, stdout or SlurmError)
        self._known: Dict[tuple, tuple] = {}  # (conf, args) -> (wall-clock time, stdout): the last good answer
        self._failing: Dict[tuple, Stale] = {}  # (conf, args) -> its last known answer while asking again fails
        self._asking: Dict[tuple, Asking] = {}  # (conf, args) -> the question out now
        self._guard = threading.Lock()
        self.here = threading.local()  # ``fresh`` set: this thread asks Slurm itself (an action's checks)

    @contextlib.contextmanager
    def fresh(self, conf: Optional[str] = None):
        """Ask Slurm itself in this block (an action decides on what is true now), then forget ``conf``'s
        answers, which the action has made old."""
        self.here.fresh = True
        try:
            yield
        finally:
            self.here.fresh = False
            self.forget(conf)

    def answer(self, conf: Optional[str], args: tuple, ask, stale: Optional[List[Stale]] = None) -> str:
        """``ask()``'s answer, or the one kept; where it is a last known one, its :class:`Stale` is appended to
        ``stale``. An answer older than ``max_age_s`` is asked again in a thread of its own, once however many
        callers want it; each waits for it, but where the question was answered before, no longer than ``wait_s``:
        then it is given the last known answer, dated, while the question stays out (a page refreshing while
        Slurm is slow shows at once what was last known, and the new answer at a refresh after it comes)."""
        key = (conf, args)
        with self._guard:
            kept, asking = self._kept.get(key), None
            if kept is None or time.monotonic() - kept[0] > self.max_age_s:
                asking = self._asking.get(key)
                if asking is None:
                    asking = self._asking[key] = Asking(time.time())
                    self.calls += 1
                    threading.Thread(target=self._ask, args=(key, ask, asking), daemon=True).start()
            known = self._known.get(key)
        if asking is not None and not asking.done.wait(self.wait_s if known else None):
            failing = self._failing.get(key)
            since = min(asking.since, failing.failing_since) if failing else asking.since
            if stale is not None:
                stale.append(Stale(known[0], since, "Slurm has not answered yet"))
            return known[1]
        with self._guard:
            given, failing = asking.answer if asking is not None else self._kept[key][1], self._failing.get(key)
        if isinstance(given, SlurmError):
            raise given
        if failing is not None and stale is not None:
            stale.append(failing)
        return given

    def _ask(self, key: tuple, ask, asking: "Asking") -> None:
        """Ask the question (:meth:`_asked`) and keep its answer for ``max_age_s``, then tell who waits for it."""
        asking.answer = self._asked(key, ask)
        with self._guard:
            self._kept[key] = (time.monotonic(), asking.answer)
            del self._asking[key]
        asking.done.set()

    def _asked(self, key: tuple, ask):
        """``ask()``'s answer, kept as the last known one; where the controller does not answer, the last known one
        (the silence noted) or, with none, the SlurmError; a refusal is Slurm's answer, given as such."""
        try:
            text = ask()
        except SlurmError as err:
            known = self._known.get(key)
            if known is None or not err.transient:
                return err
            failing = self._failing.get(key)
            self._failing[key] = Stale(known[0], failing.failing_since if failing else time.time(), str(err))
            return known[1]
        self._known[key] = (time.time(), text)
        self._failing.pop(key, None)
        return text

    def forget(self, conf: Optional[str] = None) -> None:
        """Drop the answers kept for ``conf`` (None: every cluster's)."""
        with self._guard:
            for key in [key for key in self._kept if conf is None or key[0] == conf]:
                del self._kept[key]


SHARED = SharedAnswers()


def on_every_node(command: Sequence[str], nodes: int, timeout: float) -> Tuple[str, str]:
    """Run ``command`` as one task on each of the ``nodes`` nodes of the job whose batch step this process is
    (``srun``, with the job's own environment): what it printed, and how srun ended (its exit status, or killed after
    ``timeout`` seconds); OSError where srun cannot run."""
    try:
        ran = subprocess.run(["srun", f"--nodes={nodes}", f"--ntasks={nodes}", "--ntasks-per-node=1", *command],
                             stdout=subprocess.PIPE, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as err:
        said = err.stdout.decode(errors="replace") if isinstance(err.stdout, bytes) else err.stdout or ""
        return said, f"srun did not end within {timeout} s"
    return ran.stdout, f"srun's exit status {ran.returncode}"


def user_name() -> str:
    """The user Slurm sees (it goes by the uid): the password entry's name, else $USER."""
    try:
        return pwd.getpwuid(os.getuid()).pw_name
    except KeyError:  # a uid without an entry (some containers)
        return os.environ.get("USER", str(os.getuid()))


def for_cluster(cluster) -> Slurm:
    """The Slurm of a ClusterConfig (one per slurm.conf per process, so partitions are asked once)."""
    return for_conf(slurm_conf_for(cluster.name, cluster.slurm_conf))


def for_conf(conf: Optional[str]) -> Slurm:
    """The process's one Slurm for this slurm.conf."""
    if conf not in _CLUSTERS:
        _CLUSTERS[conf] = Slurm(conf)
    return _CLUSTERS[conf]
