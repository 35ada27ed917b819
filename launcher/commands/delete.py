"""``launcher delete``: cancel runs' jobs if active, then remove their directories."""
from __future__ import annotations

import argparse
import shutil
import sys

from launcher.commands.common import chosen_runs, roots_of
from launcher.commands.stop import cancel, run_args
from launcher.errors import LaunchError


def configure(parser: argparse.ArgumentParser) -> None:
    run_args(parser)
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")


def main(args: argparse.Namespace) -> int:
    records = chosen_runs(roots_of(args), args.names, args.sweep)
    names = ", ".join(rec.name for rec in records)
    if not args.yes:
        if not sys.stdin.isatty():
            raise LaunchError(f"delete {names}: confirm with --yes (no terminal to ask on)")
        if input(f"Delete {len(records)} run(s): {names}? [y/N] ").strip().lower() not in ("y", "yes"):
            print("Nothing deleted.")
            return 1
    cancel(records)
    for rec in records:
        shutil.rmtree(rec.run_dir, ignore_errors=True)
        print(f"Deleted {rec.name}.")
    return 0
