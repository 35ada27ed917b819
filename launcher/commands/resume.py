"""``launcher resume RUN [gpus=N]``: continue a failed, stopped or finished-early run from its newest good
checkpoint, as a new attempt of the same run (launcher/service/resume.py, which the console's Resume runs too);
with ``gpus=N`` on N GPUs, its global batch kept. This module parses the arguments and prints what the resume
says: a new layout's warnings, then the job it resumed as.
"""
from __future__ import annotations

import argparse

from launcher.service import resume
from launcher.views.lookup import roots_of
from launcher.views.width import wrap


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix)")
    parser.add_argument("layout", nargs="*", metavar="gpus=N",
                        help="go on on N GPUs: the global batch is kept, so every step reads the batch it would have")


def main(args: argparse.Namespace) -> int:
    resuming = resume.ready(roots_of(args), args.name, args.layout)
    if resuming.warnings:
        from launcher.commands.launch import warn  # lazy: the launch's imports, only for a new layout's warnings

        warn(resuming.warnings)
    print(wrap(resume.submit(resuming).line()))
    return 0
