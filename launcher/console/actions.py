"""The console's buttons: ``launcher stop``, ``resume`` and ``delete`` themselves, not a copy of them.

Each button runs the command's own ``main`` with the arguments the CLI would parse, so a refusal is the CLI's own
one line (``error: ...`` there, the answer's ``error`` here) and a success its own words. The commands print; their
output is caught, so they run one at a time. They decide on Slurm's answers of now, not on the answers the console
shares between refreshes (launcher/slurm/client.py ``SharedAnswers.fresh``), which they then make old. A stop
waits for the running runs it asked to save and end (up to ``launcher stop``'s ``WAIT_S``): that wait holds
neither the lock nor the caught output, so the console serves its pages and other buttons meanwhile; the button's
answer comes when the stop is done (a run on a cluster over SSH: when the stop there is).
"""
from __future__ import annotations

import argparse
import contextlib
import io
import threading
from pathlib import Path
from typing import Dict, Iterator, Optional

from launcher.commands import delete, resume, stop
from launcher.core.damage import DamagedRun
from launcher.errors import LaunchError
from launcher.remote.ship import remote_error, run_launcher
from launcher.remote.ssh import Remote
from launcher.slurm.client import SHARED

_ONE_AT_A_TIME = threading.Lock()


def act(action: str, root: Optional[Path], name: str, remote: Optional[Remote] = None) -> Dict[str, str]:
    """Run ``action`` (stop, resume, delete, stop-sweep) on the run (or sweep) ``name``: ``{"said": ...}`` with
    what the command printed, or the command's LaunchError (its one-line refusal). A run on a cluster reached over
    SSH is acted on there, by the same command, as the CLI forwards it (launcher/remote/forward.py)."""
    if remote is not None:
        words = {"stop": ["stop", name], "stop-sweep": ["stop", "--sweep", name], "resume": ["resume", name],
                 "delete": ["delete", "--yes", name]}
        if action not in words:
            raise LaunchError(f"unknown action '{action}': allowed {', '.join(words)}")
        waits = stop.WAIT_S + stop.SETTLE_S if action.startswith("stop") else 0  # the stop there waits as here
        proc = run_launcher(remote, "launcher", words[action], timeout=max(60.0, 4 * remote.timeout_s) + waits)
        if proc.returncode != 0:
            raise LaunchError(remote_error(remote, proc.stderr))
        return {"said": proc.stdout.strip()}
    if action in ("stop", "stop-sweep"):
        return stopped(argparse.Namespace(root=root, names=[name] if action == "stop" else [],
                                          sweep=name if action == "stop-sweep" else None, wait=None, now=False))
    if action == "resume":
        command, args = resume.main, argparse.Namespace(root=root, name=name, layout=[])
    elif action == "delete":
        command, args = delete.main, argparse.Namespace(root=root, names=[name], sweep=None, yes=True)
    else:
        raise LaunchError(f"unknown action '{action}': allowed stop, stop-sweep, resume, delete")
    out = io.StringIO()
    with saying(out):
        command(args)
    return {"said": out.getvalue().strip()}


@contextlib.contextmanager
def saying(out: io.StringIO) -> Iterator[None]:
    """One command's part at a time, on Slurm's answers of now, its output caught in ``out``; a damaged run's
    error as the command's refusal."""
    with _ONE_AT_A_TIME, SHARED.fresh(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            yield
        except DamagedRun as err:
            raise LaunchError(str(err)) from None


def stopped(args: argparse.Namespace) -> Dict[str, str]:
    """``launcher stop`` in its three parts: the ask and the end each under the lock, the wait between them not."""
    out = io.StringIO()
    with saying(out):
        stopping = stop.ask(args)
    stop.wait(stopping)  # Slurm's answers the tabs share do for it: it asks whether the job is still there
    with saying(out):
        stop.finish(stopping)
    return {"said": out.getvalue().strip()}
