"""``launcher stop``: stop runs; their directories (logs, checkpoints) stay.

A running run is asked to save the step it is at and end, and given ``--wait`` seconds before its job is cancelled;
every other active job, and every job with ``--now``, is cancelled at once; ``--sweep`` of a search stops the
search itself (launcher/service/stop.py, which the console's Stop runs too). This module parses the flags and
prints what the stop says: its asks before the wait, what became of each run after it.
"""
from __future__ import annotations

import argparse

from launcher.errors import LaunchError
from launcher.service import stop
from launcher.views.lookup import roots_of
from launcher.views.width import wrap


def run_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="RUN", help="run names (or unique prefixes)")
    parser.add_argument("--sweep", help="every run of this sweep id")


def wait_seconds(text: str) -> int:
    """``--wait``'s value: whole seconds, at least 1."""
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"a whole number of seconds, at least 1, is needed (--now stops at once), "
                                         f"not {text!r}")
    return int(text)


def configure(parser: argparse.ArgumentParser) -> None:
    run_args(parser)
    parser.add_argument("--wait", type=wait_seconds, metavar="SECONDS",
                        help=f"how long a running run has to save the step it is at and end before its job is "
                             f"cancelled (default {stop.WAIT_S})")
    parser.add_argument("--now", action="store_true",
                        help="cancel at once, without asking: the ranks then save only if Slurm's KillWait leaves "
                             "them time, else the steps since the last checkpoint are trained again")


def main(args: argparse.Namespace) -> int:
    if args.now and args.wait is not None:
        raise LaunchError("--now cancels at once and --wait waits for a save first: give one of them")
    stopping = stop.ask(roots_of(args), args.names, args.sweep, args.wait, args.now)
    for line in stopping.lines():
        print(wrap(line), flush=True)  # before the wait: the user sees what is being waited for
    stop.wait(stopping)
    for line in stop.finish(stopping).lines():
        print(wrap(line))
    return 0
