"""Moving a waiting run to another cluster, for ``launcher move RUN cluster=NAME`` and the console's Move.

A run whose job waits in one cluster's queue (PENDING) goes where it may start sooner: the same run (its name,
seed, data, model, steps and GPUs), composed again from its run file with the target cluster's settings (the file's
``cluster`` choice and ``cluster.*`` keys replaced) and checked as a launch is, as ``resume gpus=N`` composes a run
again (launcher/submit/relayout.py), before anything changes. Then the move takes the run's claim over its waiting
job (launcher/job/claim.py ``take_over``: of two moves, or a move and a resume, one wins and the other is refused in
one line), cancels that job and its watcher, waits until Slurm no longer lists the job alive, rewrites the run's
files for the target and submits the run there (launcher/job/submission.py ``resubmit``): one job of the run at a
time, never a run that trains in two places. A job found started when the claim is taken keeps the run (the move is
refused, the claim given back); one that starts after waits in its batch script's first step for the claim, which
names the move, until the cancel ends it, and the new job is submitted only once it is gone.

Where the target sees the same run root (a cluster of this machine), the run directory stays, its record follows
the new job, and its ``moved`` event says from where to where. To a cluster over SSH, the run's record (run.yaml,
config, plan, record, events, metrics, its frozen code) and its newest good checkpoint are copied into that
cluster's run root over the ControlMaster connection (launcher/remote/ship.py) and submitted there by the agent
(launcher/remote/agent.py ``adopt``); the old directory, its ``moved`` event naming where the run went, is set
aside under the run root's ``.moved/`` (no longer listed: ``runs`` lists the run on its new cluster), and this
machine's index of remote runs names the run's cluster, so that ``describe`` and the others go there. Nothing moves
a run by itself.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional, Sequence, Tuple

from launcher.core.attempt_log import AttemptLog
from launcher.core.checkpoints import latest_checkpoint
from launcher.core.events import Moved
from launcher.core.rundir import CODE, CONFIG, EVENTS, METRICS, PLAN, RECORD, append_event, read_events
from launcher.core.run_index import RunRecord
from launcher.errors import LaunchError
from launcher.job import claim
from launcher.job.submission import resubmit, watch, watcher_of
from launcher.remote.clusters import remember, remote_of
from launcher.remote.ship import call, send_files
from launcher.remote.ssh import Remote
from launcher.slurm.client import Slurm, SlurmError, user_name
from launcher.status.job_state import JobState, job_states
from launcher.views.lookup import changeable, clock, duration, lookup

if TYPE_CHECKING:
    from launcher.compose.composer import ComposedRun

MOVED_AWAY = ".moved"  # under the run root: the directories of runs moved to a cluster over SSH
GONE_S = 60.0  # how long a cancelled waiting job may take to leave Slurm's queue before the move gives up
POLL_S = 0.5


@dataclass
class Moving:
    """A run found movable: its record and state, the cluster it goes to, the run composed for that cluster, and
    the checks' warnings there."""

    rec: RunRecord
    state: JobState
    target: str
    run: "ComposedRun"
    warnings: List[str] = field(default_factory=list)
    remote: Optional[Remote] = None  # the target is reached over SSH
    asked: List[str] = field(default_factory=list)  # with cluster=auto: each candidate's line, the chosen first


@dataclass
class MovedRun:
    """A run moved: from which cluster and job (and how long that job had waited), to which."""

    name: str
    from_cluster: str
    from_job_id: str
    waited_s: Optional[float]
    cluster: str
    job_id: str

    def line(self) -> str:
        waited = f", waited {duration(self.waited_s)}" if self.waited_s is not None else ""
        return (f"Moved {self.name} from {self.from_cluster} (job {self.from_job_id}{waited}) to {self.cluster} as "
                f"Slurm job {self.job_id}.")


def moved_line(moved: Moved) -> str:
    """A ``moved`` event as ``describe`` and the console show it."""
    waited = f", waited {duration(moved.waited_s)}" if moved.waited_s is not None else ""
    return (f"Moved: from {moved.from_cluster} at {clock(moved.time)} (job {moved.from_job_id}{waited}) to "
            f"{moved.cluster} (job {moved.job_id})" + (f" by {moved.by}" if moved.by else ""))


def unmovable(name: str, job_id: Optional[str], state: str) -> Optional[str]:
    """Why a run in ``state`` is not moved, and what to do instead (the console's Move says it before it is
    pressed); None when it waits in the queue and can be."""
    if state == "PENDING":
        return None
    if state == "RUNNING":
        return f"{name} is RUNNING (job {job_id}); only a waiting (PENDING) run moves: it trains where it is"
    if state in ("RECOVERING", "REQUEUED"):
        return (f"{name} is {state} (job {job_id}); only a waiting (PENDING) run moves: move it once its next job "
                "waits in the queue")
    return (f"{name} is {state}; only a waiting (PENDING) run moves: 'launcher resume {name}' goes on where it ran, "
            "'launcher -f RUN_DIR/run.yaml cluster=NAME' trains it anew elsewhere")


def target_of(rec: RunRecord, asked: str) -> Tuple[str, List[str]]:
    """The cluster the run of ``rec`` goes to, and with ``cluster=auto`` each candidate's line: ``asked`` names a
    configured cluster of this machine other than the run's own, or is ``auto``, the candidate where the run would
    start first (launcher/service/auto.py: those ``cluster=auto`` placed it among, else every configured cluster),
    where that is sooner than where it waits; LaunchError in one line naming the clusters there are, or why the
    run stays."""
    from launcher.compose.catalog import AUTO_CLUSTER  # lazy: keeps the catalogue out of start-up

    if asked == AUTO_CLUSTER:
        return soonest(rec)
    others = targets(rec.cluster)
    allowed = f"configured here: {', '.join(others)}" if others else "no other cluster is configured here"
    if asked == rec.cluster:
        raise LaunchError(f"{rec.name} already waits on cluster {asked}; move it to another ({allowed})")
    if asked not in others:
        raise LaunchError(f"cluster={asked} is not a configured cluster ({allowed}), or {AUTO_CLUSTER}")
    return asked, []


def soonest(rec: RunRecord) -> Tuple[str, List[str]]:
    """``move RUN cluster=auto``: the other candidate where the run would start first, and each one's line;
    LaunchError in one line, with the candidates' lines, where none starts it sooner than where it waits."""
    from launcher.core.config import load_run_config  # lazy: keeps omegaconf out of start-up
    from launcher.service.auto import elsewhere  # lazy: Hydra, for cluster=auto only

    run_dir = Path(rec.run_dir)
    placement, best = elsewhere(run_dir, load_run_config(run_dir / CONFIG), str(rec.job_id))
    lines = [candidate.line for candidate in placement.candidates]
    if best is None:
        raise LaunchError(f"{rec.name} stays on {rec.cluster}: no other candidate would start it sooner "
                          f"({'; '.join(lines) or 'no other cluster is configured here'})")
    return best.cluster, lines


def targets(cluster: str) -> List[str]:
    """The clusters a run on ``cluster`` may be asked to move to (the console's choice): every configured one but
    its own and the package's template for a site, as listed, without reading them."""
    from launcher.compose.catalog import cluster_choices  # lazy: keeps the catalogue out of start-up

    return cluster_choices(cluster)


def ready(roots: Sequence[Path], name: str, cluster: str) -> Moving:
    """The run ``name``, checked movable (waiting in the queue) to ``cluster`` and composed for it; LaunchError in
    one line, with nothing changed, when it cannot be."""
    (rec,) = changeable([lookup(roots, name)])
    state = job_states([rec])[rec.name]
    refused = unmovable(rec.name, rec.job_id, state.state)
    if refused:
        raise LaunchError(refused)
    target, asked = target_of(rec, cluster)
    from launcher.compose.runfile import read_run_file, without_cluster  # lazy: keeps hydra out of start-up
    from launcher.core.config import load_run_config  # lazy: keeps omegaconf out of start-up
    from launcher.service.auto import CANDIDATES  # lazy: Hydra, which composing the run loads anyway
    from launcher.submit.relayout import recompose  # lazy: keeps hydra out of start-up

    kept = without_cluster(read_run_file(Path(rec.run_dir) / "run.yaml"))
    candidates = load_run_config(Path(rec.run_dir) / CONFIG).cluster.candidates  # cluster=auto's, kept for a next move
    run, warnings = recompose([*kept, f"cluster={target}",
                               *([f"{CANDIDATES}=[{','.join(candidates)}]"] if candidates else [])])
    remote = remote_of(run.config.cluster) if run.config.cluster.ssh else None
    return Moving(rec, state, target, run, warnings, remote, asked)


def move(moving: Moving) -> MovedRun:
    """Cancel the run's waiting job, wait until it is gone, and submit the run on the target cluster under the
    claim taken over that job; LaunchError in one line when another move or resume holds the run, when the job
    started meanwhile, or when the target refuses the job (then the run waits nowhere, and says how to resume)."""
    rec, run_dir = moving.rec, Path(moving.rec.run_dir)
    old_job, old_cluster, slurm = str(rec.job_id), rec.cluster, Slurm(rec.slurm_conf)
    since = AttemptLog(read_events(run_dir)).queued_since()
    waited = None if since is None else round(time.time() - since, 1)
    taken = claim.take_over(run_dir, "move", old_job)
    try:
        leave(slurm, rec, run_dir)
    except BaseException:
        claim.drop(run_dir, taken)
        raise
    moved = Moved(from_job_id=old_job, from_cluster=old_cluster, waited_s=waited, by=user_name())
    if moving.remote is not None:
        return move_there(moving, moving.remote, moved, taken)
    from launcher.submit.relayout import rewrite  # lazy: keeps hydra out of start-up

    try:
        rewrite(rec, moving.run)
        job_id = resubmit(run_dir, by="move", taken=taken)
    except (SlurmError, LaunchError, OSError) as err:
        claim.drop(run_dir, taken)  # no job of the run holds it: a resume may submit one
        said = f"{err.strerror}: {err.filename}" if isinstance(err, OSError) else str(err)
        raise LaunchError(f"cancelled {rec.name}'s job {old_job} on {old_cluster}, but {moving.target} refused the "
                          f"run: {said}; 'launcher resume {rec.name}' submits it there again") from None
    moved.job_id, moved.cluster = job_id, moving.target
    append_event(run_dir, moved)
    watch(run_dir, job_id)
    return MovedRun(rec.name, old_cluster, old_job, waited, moving.target, job_id)


def move_there(moving: Moving, remote: Remote, moved: Moved, taken: claim.Claim) -> MovedRun:
    """The move's submission on a cluster over SSH: the run's record and newest checkpoint copied into that
    cluster's run root and submitted there; this directory, its ``moved`` event naming where the run went, set
    aside. LaunchError, the claim given back, when the copy or the submission there fails."""
    from launcher.remote.agent import run_item  # lazy: keeps omegaconf out of start-up

    rec, run_dir, into = moving.rec, Path(moving.rec.run_dir), None
    try:
        into = call(remote, "incoming", {"name": rec.name})["path"]
        send_files(remote, run_dir, carried(run_dir), into)
        there = call(remote, "adopt", {"name": rec.name, "incoming": into, "run": run_item(moving.run),
                                       "record": rec.to_json(), "moved": asked(moved)})["record"]
    except LaunchError as err:
        claim.drop(run_dir, taken)
        left = "" if into is None or gone(remote, into) else f" (its copy is left in {into} there)"
        raise LaunchError(f"cancelled {rec.name}'s job {moved.from_job_id} on {moved.from_cluster}, but could not "
                          f"move it to {moving.target}: {err}{left}; 'launcher resume {rec.name}' submits it where it "
                          "was") from None
    moved.job_id, moved.cluster, moved.run_dir = there["job_id"], moving.target, f"{remote.cluster}:{there['run_dir']}"
    append_event(run_dir, moved)
    remember(remote.cluster, [RunRecord(**there)])
    set_aside(run_dir)
    return MovedRun(rec.name, moved.from_cluster or "", moved.from_job_id or "", moved.waited_s, moving.target,
                    there["job_id"])


def gone(remote: Remote, into: str) -> bool:
    """Whether the copy of a move that failed is removed from the cluster over SSH (a run's checkpoint must not
    stay behind in a hidden folder of that run root); False where it cannot be reached to remove it."""
    try:
        call(remote, "discard", {"incoming": into})
    except LaunchError:
        return False
    return True


def asked(moved: Moved) -> dict:
    """The ``moved`` event's fields the cluster's side records (it adds the job it submitted, on its cluster)."""
    return {"time": moved.time, "from_job_id": moved.from_job_id, "from_cluster": moved.from_cluster,
            "waited_s": moved.waited_s, "by": moved.by}


def carried(run_dir: Path) -> List[str]:
    """What of the run goes to another cluster: its record, its frozen code, and its newest good checkpoint (its
    rank logs, older checkpoints and claims stay)."""
    names = [name for name in (RECORD, CONFIG, PLAN, "run.yaml", "sbatch.sh", EVENTS, METRICS, CODE)
             if (run_dir / name).exists()]
    newest = latest_checkpoint(run_dir)
    return names + ([str(newest.relative_to(run_dir))] if newest else [])


def set_aside(run_dir: Path) -> None:
    """Move the run's old directory under its run root's ``.moved/`` (hidden from listings and lookups, so the
    name finds the run where it went), kept there as the record of the move."""
    aside = run_dir.parent / MOVED_AWAY
    aside.mkdir(mode=0o700, exist_ok=True)
    if aside.is_symlink() or not aside.is_dir():
        raise LaunchError(f"{aside} is not a folder of the run root; {run_dir} stays")
    run_dir.rename(aside / f"{run_dir.name}.{int(time.time())}")


def leave(slurm: Slurm, rec: RunRecord, run_dir: Path) -> None:
    """Cancel the run's job (still waiting, as Slurm says now) and its watcher, and wait until Slurm no longer
    lists the job alive; LaunchError when it started meanwhile, or when Slurm cannot cancel it or say it is gone."""
    job = str(rec.job_id)
    try:
        state = (slurm.job_state(job).split() or [""])[0]
        if state != "PENDING":
            raise LaunchError(unmovable(rec.name, job, state or "gone from the queue") or "")
        for cancelled in filter(None, (job, watcher_of(run_dir))):
            slurm.cancel(cancelled)
        deadline = time.monotonic() + GONE_S
        while (slurm.job_state(job).split() or [""])[0] in claim.LIVE_STATES:
            if time.monotonic() > deadline:
                raise LaunchError(f"job {job} of {rec.name} was cancelled but Slurm still lists it after "
                                  f"{GONE_S:.0f} s; move it again once it is gone")
            time.sleep(POLL_S)
    except SlurmError as err:
        raise LaunchError(f"could not move {rec.name} off job {job}: {err}") from None
