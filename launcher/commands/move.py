"""``launcher move RUN cluster=NAME``: move a run whose job waits in one cluster's queue to another cluster, where
it may start sooner (launcher/service/move.py, which the console's Move runs too). This module parses the
arguments and prints what the move says: the target's warnings, then where the run went.
"""
from __future__ import annotations

import argparse

from launcher.errors import LaunchError
from launcher.service import move
from launcher.views.lookup import roots_of
from launcher.views.width import wrap

USAGE = "cluster=NAME, the configured cluster the waiting run goes to, or cluster=auto, where it starts first"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix)")
    parser.add_argument("target", metavar="cluster=NAME", help="the cluster the run goes to (launcher clusters), or "
                        "cluster=auto: the candidate where it would start first")


def cluster_asked(text: str) -> str:
    """The cluster ``cluster=NAME`` names; LaunchError for anything else."""
    name = text.removeprefix("cluster=")
    if not text.startswith("cluster=") or not name:
        raise LaunchError(f"move takes {USAGE}; got '{text}'")
    return name


def main(args: argparse.Namespace) -> int:
    moving = move.ready(roots_of(args), args.name, cluster_asked(args.target))
    if moving.warnings:
        from launcher.commands.launch import warn  # lazy: the launch's imports, only for the target's warnings

        warn(moving.warnings)
    for line in moving.asked:  # cluster=auto: each candidate's answer, as a launch prints them
        print(wrap(line))
    print(wrap(move.move(moving).line()))
    return 0
