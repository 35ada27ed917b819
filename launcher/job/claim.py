"""At most one job of a run alive at a time: the run's claim.

Whatever submits a job of a run (the launch, ``launcher resume``, a failed attempt's retry) first takes the run's
claim, naming itself as being submitting, then names the job Slurm gave it; the job, before its ranks start,
checks that the claim names it (launcher/job/recovery.py ``begin``). So two resumes at once give one job: the
second finds the claim taken and is refused in one line naming the holder. A job that finds another job of its
run holding the claim, still alive in Slurm, does not train.

The claim is a generation of files, ``RUN/claims/00000001.json``, ``00000002.json``, ...: the newest is the
claim. A claim is taken by creating the next generation's file with a hard link of a complete temporary file,
which fails when the file exists (atomic on local file systems and on NFS, as ``O_EXCL`` is): of two takers,
exactly one creates generation N+1, and the other reads it and is refused. A move takes the claim over the
waiting job it is about to cancel (:func:`take_over`), so that of two moves, or a move and a resume, one wins. No
lock is held across the submission, and no file is ever rewritten by two processes: only the taker renames its own
generation's file when it names the job.

A claim left by a job that has ended (Slurm no longer lists it alive) or by a submitter that died before naming
its job (older than :data:`SUBMIT_WINDOW_S`) is stale: the next taker takes the next generation over it.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Optional, Tuple

from launcher.core.rundir import write_atomic
from launcher.core.stop_request import this_job  # noqa: F401  (claim.this_job: the job as the run names it)
from launcher.errors import LaunchError
from launcher.slurm.output import SlurmError

CLAIMS = "claims"
SUBMIT_WINDOW_S = 120.0  # a claim still naming no job this long after it was taken: its submitter died
ENDING_WAIT_S = 60.0  # how long a taker waits for a job Slurm is ending (COMPLETING) rather than refuse
KEEP = 3  # generations kept: the claim and the two before it, for whoever reads how it changed hands
# Slurm's states of a job that holds or waits for resources: a job in one of them may still train.
LIVE_STATES = {"PENDING", "RUNNING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED", "CONFIGURING",
               "COMPLETING", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT"}


@dataclass(frozen=True)
class Claim:
    """One generation of a run's claim: the job it names (None while its submitter waits for sbatch), who
    took it (``launch``, ``resume``, ``retry``, or ``job``: a job that found the claim stale), from where, when."""

    generation: int
    job_id: Optional[str]
    by: str
    host: str
    pid: int
    time: float

    def holder(self) -> str:
        """The holder in the user's words."""
        if self.job_id is not None:
            return f"job {self.job_id}"
        age = max(0.0, time.time() - self.time)  # its time is rounded to the millisecond
        return f"a submission by {self.by} on {self.host} (pid {self.pid}, {age:.0f} s ago)"


class ClaimHeld(LaunchError):
    """Another job of the run is alive, or being submitted: the one line says which."""


# Slurm's state of a job ("" once Slurm no longer knows it); SlurmError when the controller does not answer.
JobState = Callable[[str], str]


def current(run_dir: Path) -> Optional[Claim]:
    """The run's claim (its newest generation), or None when it has none."""
    return _read(Path(run_dir) / CLAIMS)[0]


def _read(folder: Path) -> Tuple[Optional[Claim], int]:
    """The newest whole generation's claim, and the newest generation's number (one listing: a taker creates
    the generation after the one it judged, or finds that another taker did)."""
    numbers = sorted((int(path.stem) for path in folder.glob("*.json") if path.stem.isdigit()), reverse=True)
    for number in numbers:
        try:
            return Claim(**json.loads(_path(folder, number).read_text())), numbers[0]
        except (OSError, ValueError, TypeError):
            continue  # a damaged generation is passed over: the one before it stands
    return None, numbers[0] if numbers else 0


def holding(claim: Claim, job_state: JobState, holder: Optional[str] = None) -> Optional[str]:
    """Slurm's state of the job ``claim`` names while it still holds the run ("" for a submission still in
    progress), or None when the claim is stale: its job ended, or its submitter died before naming one.
    ``holder``: the job asking, whose own claim never holds against it. ClaimHeld when Slurm cannot say."""
    if claim.job_id is None:
        return "" if time.time() - claim.time <= SUBMIT_WINDOW_S else None
    if claim.job_id == holder:
        return None
    try:
        state = (job_state(claim.job_id).split() or [""])[0]
    except SlurmError as err:
        raise ClaimHeld(f"cannot tell whether job {claim.job_id} of the run still runs: {err}") from None
    return state if state in LIVE_STATES else None


def take(run_dir: Path, by: str, job_state: JobState, holder: Optional[str] = None,
         job_id: Optional[str] = None) -> Claim:
    """Take the run's claim for a submission by ``by`` (``job_id`` when the job is already known: a job taking
    over a stale claim); ClaimHeld naming the holder when another job of the run is alive or being submitted.
    A job that is ending (COMPLETING: Slurm still kills its processes) is waited for, up to
    :data:`ENDING_WAIT_S`."""
    folder = Path(run_dir) / CLAIMS
    folder.mkdir(exist_ok=True)
    ending_until, races = time.monotonic() + ENDING_WAIT_S, 0
    while True:
        held, newest = _read(folder)
        state = holding(held, job_state, holder) if held is not None else None
        if state == "COMPLETING" and time.monotonic() < ending_until:
            time.sleep(1.0)
            continue
        if held is not None and state is not None:
            shown = f" ({state})" if state else ""
            raise ClaimHeld(f"{Path(run_dir).name} already has {held.holder()}{shown}; one job of a run at a time")
        claim = Claim(generation=newest + 1, job_id=job_id, by=by,
                      host=socket.gethostname(), pid=os.getpid(), time=round(time.time(), 3))
        if _create(folder, claim):
            _prune(folder, claim.generation)
            return claim
        races += 1  # another taker between reading and creating: read again, and find it
        if races > 10:
            raise ClaimHeld(f"{Path(run_dir).name}'s claim kept changing hands; try again")


def take_over(run_dir: Path, by: str, job_id: str) -> Claim:
    """Take the run's claim from its waiting job ``job_id``, which the taker cancels before it submits another (a
    move: launcher/service/move.py), for a submission by ``by``; ClaimHeld naming the holder when the claim names
    anything else (another move or a resume took it first). Of two takers, one creates the next generation."""
    folder = Path(run_dir) / CLAIMS
    folder.mkdir(exist_ok=True)
    held, newest = _read(folder)
    if held is None or held.job_id == job_id:
        claim = Claim(generation=newest + 1, job_id=None, by=by, host=socket.gethostname(), pid=os.getpid(),
                      time=round(time.time(), 3))
        if _create(folder, claim):
            _prune(folder, claim.generation)
            return claim
        held = _read(folder)[0]
    holder = held.holder() if held is not None else "another taker"
    raise ClaimHeld(f"{Path(run_dir).name} already has {holder}; one job of a run at a time")


def name(run_dir: Path, claim: Claim, job_id: str) -> Claim:
    """The claim, now naming the job its submission got."""
    named = Claim(**{**asdict(claim), "job_id": job_id})
    write_atomic(_path(Path(run_dir) / CLAIMS, claim.generation), json.dumps(asdict(named)) + "\n")
    return named


def drop(run_dir: Path, claim: Claim) -> None:
    """Give the claim back after its submission failed: the generation before it stands again."""
    try:
        _path(Path(run_dir) / CLAIMS, claim.generation).unlink()
    except FileNotFoundError:
        pass


def enter(run_dir: Path, job_state: JobState, me: str, poll_s: float = 1.0) -> Optional[ClaimHeld]:
    """Whether job ``me``, starting, may train: None when the run's claim names it, or when the claim is
    stale or missing (a run submitted by hand or by an older launcher) and this job takes it over; else why
    not. A claim still being submitted is waited for (up to :data:`SUBMIT_WINDOW_S`): it may be this job's."""
    held = current(run_dir)
    while held is not None and held.job_id is None and holding(held, job_state) is not None:
        time.sleep(poll_s)
        held = current(run_dir)
    if held is not None and held.job_id == me:
        return None
    try:
        take(run_dir, "job", job_state, holder=me, job_id=me)
    except ClaimHeld as err:
        return err
    return None


def _path(folder: Path, generation: int) -> Path:
    return folder / f"{generation:08d}.json"


def _create(folder: Path, claim: Claim) -> bool:
    """Create the claim's generation file whole, unless it exists: a hard link of a complete temporary file."""
    tmp = folder / f".{claim.generation:08d}.{claim.host}.{claim.pid}.{time.monotonic_ns()}.tmp"
    tmp.write_text(json.dumps(asdict(claim)) + "\n")
    try:
        os.link(tmp, _path(folder, claim.generation))
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink()


def _prune(folder: Path, newest: int) -> None:
    for path in folder.glob("*.json"):
        if path.stem.isdigit() and int(path.stem) <= newest - KEEP:
            path.unlink(missing_ok=True)
