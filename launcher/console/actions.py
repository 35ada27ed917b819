"""The console's buttons: stop, resume, move and delete as ``launcher stop``, ``resume``, ``move`` and ``delete`` do
them, through
the same service (launcher/service/), so a refusal is the CLI's own one line (``error: ...`` there, the answer's
``error`` here) and a success the same words, which the answer's ``said`` holds.

The actions run one at a time, on Slurm's answers of now, not on the answers the console shares between refreshes
(launcher/slurm/client.py ``SharedAnswers.fresh``), which they then make old. A stop waits for the running runs it
asked to save and end (up to the service's ``WAIT_S``): that wait holds no lock, so the console serves its pages
and other buttons meanwhile; the button's answer comes when the stop is done (a run on a cluster over SSH: when
the stop there is).
"""
from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional

from launcher.core.damage import DamagedRun
from launcher.errors import LaunchError
from launcher.remote.ship import remote_error, run_launcher
from launcher.remote.ssh import Remote
from launcher.service import delete, move, resume, stop
from launcher.slurm.client import SHARED
from launcher.views.lookup import roots_for

_ONE_AT_A_TIME = threading.Lock()
ACTIONS = ("stop", "stop-sweep", "resume", "move", "delete")


def act(action: str, root: Optional[Path], name: str, remote: Optional[Remote] = None,
        to: Optional[str] = None) -> Dict[str, str]:
    """Do ``action`` (stop, resume, move to cluster ``to``, delete, stop-sweep) on the run (or sweep) ``name`` in
    ``root`` (None: every run root): ``{"said": ...}`` with the command's words, or its LaunchError (its one-line
    refusal). A run on a cluster reached over SSH is acted on there, by the same command, as the CLI forwards it
    (launcher/remote/forward.py); it is not moved from here."""
    if action not in ACTIONS:
        raise LaunchError(f"unknown action '{action}': allowed {', '.join(ACTIONS)}")
    if action == "move" and remote is not None:
        raise LaunchError(f"{name} is on {remote.cluster}, reached over SSH: 'launcher move' there moves it")
    if action == "move" and not to:
        raise LaunchError(f"a move names the cluster it goes to: /api/run/{name}/move?to=CLUSTER")
    if remote is not None:
        return act_there(action, name, remote)
    roots = roots_for(root)
    if action in ("stop", "stop-sweep"):
        return said(stopped(roots, [name] if action == "stop" else [], name if action == "stop-sweep" else None))
    with acting():
        if action == "resume":
            return said([resume.submit(resume.ready(roots, name)).line()])
        if action == "move":
            moving = move.ready(roots, name, str(to))
            return said([*moving.warnings, move.move(moving).line()])
        deleted = delete.delete(delete.chosen(roots, [name], None))
        deleted.check()
        return said(deleted.lines())


def act_there(action: str, name: str, remote: Remote) -> Dict[str, str]:
    """``action`` on a run of a cluster reached over SSH: the command run there, its output the answer."""
    words = {"stop": ["stop", name], "stop-sweep": ["stop", "--sweep", name], "resume": ["resume", name],
             "delete": ["delete", "--yes", name]}
    waits = stop.WAIT_S + stop.SETTLE_S if action.startswith("stop") else 0  # the stop there waits as here
    proc = run_launcher(remote, "launcher", words[action], timeout=max(60.0, 4 * remote.timeout_s) + waits)
    if proc.returncode != 0:
        raise LaunchError(remote_error(remote, proc.stderr))
    return {"said": proc.stdout.strip()}


def said(lines: List[str]) -> Dict[str, str]:
    return {"said": "\n".join(lines).strip()}


@contextlib.contextmanager
def acting() -> Iterator[None]:
    """One action's part at a time, on Slurm's answers of now; a damaged run's error as the action's refusal."""
    with _ONE_AT_A_TIME, SHARED.fresh():
        try:
            yield
        except DamagedRun as err:
            raise LaunchError(str(err)) from None


def stopped(roots: List[Path], names: List[str], sweep: Optional[str]) -> List[str]:
    """A stop in its three parts: the ask and the end each under the lock, the wait between them not."""
    with acting():
        stopping = stop.ask(roots, names, sweep)
    stop.wait(stopping)  # Slurm's answers the tabs share do for it: it asks whether the job is still there
    with acting():
        return stopping.lines() + stop.finish(stopping).lines()
