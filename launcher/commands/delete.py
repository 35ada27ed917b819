"""``launcher delete``: cancel runs' jobs if active, then remove their directories (launcher/service/delete.py,
which the console's Delete runs too), after asking on a terminal unless ``--yes``."""
from __future__ import annotations

import argparse
import sys

from launcher.commands.stop import run_args
from launcher.errors import LaunchError
from launcher.service import delete
from launcher.views.lookup import roots_of
from launcher.views.width import wrap


def configure(parser: argparse.ArgumentParser) -> None:
    run_args(parser)
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def main(args: argparse.Namespace) -> int:
    records = delete.chosen(roots_of(args), args.names, args.sweep)
    names = ", ".join(rec.name for rec in records)
    if not args.yes:
        if not sys.stdin.isatty():
            raise LaunchError(f"delete {names}: confirm with --yes (no terminal to ask on)")
        if input(f"Delete {len(records)} run(s): {names}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Nothing deleted.")
            return 1
    deleted = delete.delete(records)
    for line in deleted.lines():
        print(wrap(line))
    deleted.check()
    return 0
