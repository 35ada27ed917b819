"""The ``launcher`` command: one argparse tree, a subcommand per command, the launch the default.

``launcher gpus=16 model=gpt_1b`` (no command word) is ``launcher launch gpus=16 model=gpt_1b``.
Each command's module keeps its arguments next to its behaviour, as ``configure(parser)`` and
``main(args)``; only the module of the command being run is imported (and configured), so
``launcher --help`` and ``launcher runs`` do not pay for Hydra or submitit. Every mistake is one line
``error: ...`` and exit status 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, NoReturn, Optional, Sequence

from launcher import __version__
from launcher.core.damage import DamagedRun, forget_warnings
from launcher.core.rundir import launcher_home
from launcher.core.safepath import UnsafePath
from launcher.errors import LaunchError, did_you_mean
from launcher.remote.clusters import RUNS_INDEX
from launcher.remote.forward import forward, target
from launcher.views.width import to_stderr


@dataclass(frozen=True)
class Command:
    """A subcommand: the module with its ``configure(parser)`` and ``main(args)``, and its line in --help."""

    module: str
    summary: str
    about_runs: bool = False  # takes --root


COMMANDS: Dict[str, Command] = {
    "launch": Command("launcher.commands.launch", "compose runs from conf/ and submit them (the default command)"),
    "plan": Command("launcher.commands.plan", "will a run fit its GPUs, how fast, how it scales; submits nothing"),
    "runs": Command("launcher.commands.runs", "list runs, newest first, with their Slurm state and progress", True),
    "describe": Command("launcher.commands.describe",
                        "show a run's config, plan, paths, nodes, events, checkpoints and metrics", True),
    "logs": Command("launcher.commands.logs", "show a run's output: rank 0 by default", True),
    "stop": Command("launcher.commands.stop", "stop runs, each saving the step it is at first; their directories "
                    "stay", True),
    "resume": Command("launcher.commands.resume",
                      "continue a failed, stopped or finished-early run from its newest good checkpoint", True),
    "move": Command("launcher.commands.move", "move a run waiting in one cluster's queue to another cluster", True),
    "delete": Command("launcher.commands.delete", "cancel runs' jobs if active, then remove their directories",
                      True),
    "compare": Command("launcher.commands.compare", "compare runs' speed, scaling and loss (a sweep, or named runs)",
                       True),
    "clusters": Command("launcher.commands.clusters",
                        "every configured cluster: its partitions, GPUs free/total, reachable or not"),
    "secrets": Command("launcher.commands.secrets", "values every task of every run sees, kept out of Slurm"),
    "data": Command("launcher.commands.data", "prepare a dataset: text, JSON-lines or Parquet to tokenizer + shards"),
    "sample": Command("launcher.commands.sample", "generate text from a run's newest checkpoint with its tokenizer",
                      True),
    "export": Command("launcher.commands.export",
                      "write a run's checkpoint as a Hugging Face model directory (safetensors, config, tokenizer)",
                      True),
    "eval": Command("launcher.commands.evaluate",
                    "a checkpoint's held-out loss and perplexity, kept in the run's record", True),
    "login": Command("launcher.commands.login", "open a remote cluster's SSH connection once (a password or 2FA)"),
    "logout": Command("launcher.commands.login", "close a remote cluster's SSH connection"),
    "ui": Command("launcher.commands.ui", "a web console of every run: live curves, logs, stop/resume/delete",
                  True),
}

DEFAULT_COMMAND = "launch"
_WORD = re.compile(r"[a-z][a-z_-]*")
_TOP_LEVEL = ("-h", "--help", "-V", "--version")


class Parser(argparse.ArgumentParser):
    """argparse, but a bad argument raises LaunchError (one line, exit 2) instead of printing usage."""

    def error(self, message: str) -> NoReturn:
        raise LaunchError(f"{self.prog}: {message}; see --help")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``launcher`` / ``python -m launcher``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    forget_warnings()  # a damaged line is said once per command
    try:
        if not args:
            build_parser(None).print_help()
            return 0
        return run_command(args)
    except LaunchError as exc:
        # One line whatever a message quotes: a value with a newline must not start a second one.
        to_stderr("error: " + exc.message.replace("\r", "\\r").replace("\n", "\\n"))
        return 2
    except (DamagedRun, UnsafePath) as exc:  # a run that cannot be read, a place another user could change: which
        to_stderr(f"error: {exc}")
        return 2
    except SystemExit as done:  # --help, --version
        return done.code if isinstance(done.code, int) else 0
    except BrokenPipeError:  # `launcher runs | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def run_command(args: List[str]) -> int:
    """Parse ``args`` with the tree (the launch when no command word leads) and run the command."""
    if args[0] not in COMMANDS and args[0] not in _TOP_LEVEL:
        if _WORD.fullmatch(args[0]):
            commands = sorted(COMMANDS)
            raise LaunchError(f"unknown command '{args[0]}'{did_you_mean(args[0], commands)}; "
                              f"commands: {', '.join(commands)}; or launch with key=value overrides")
        args = [DEFAULT_COMMAND, *args]
    name = args[0] if args[0] in COMMANDS else None
    parser = build_parser(name)
    parsed, extras = parser.parse_known_args(args)
    take_extras(parsed, extras, "launcher" if parsed.command == DEFAULT_COMMAND else f"launcher {parsed.command}")
    if COMMANDS[parsed.command].about_runs and parsed.command not in ("runs", "ui") and (
            getattr(parsed, "cluster", None) or remote_runs_known()):
        remote = target(parsed)
        if remote is not None and parsed.command == "compare" and parsed.plot:
            parsed.remote = remote  # the figures come from there; the plot is drawn here (commands/compare.py)
        elif remote is not None and parsed.command == "export" and parsed.to_local:
            from launcher.commands.export import export_remote  # exported there, then copied here

            return export_remote(remote, args, parsed)
        elif remote is not None:  # the run lives on a cluster reached over SSH: the command runs there
            return forward(remote, args)
    module = importlib.import_module(COMMANDS[parsed.command].module)
    return module.main(parsed)


def remote_runs_known() -> bool:
    """Whether runs were launched from here to a remote cluster (one stat: a plain local command pays no more)."""
    return (launcher_home() / RUNS_INDEX).exists()


def take_extras(parsed: argparse.Namespace, extras: List[str], prog: str) -> None:
    """Overrides after an option (``plan --json gpus=8``) land in ``extras``; give them back to the
    command's ``overrides``. Anything else left over is a mistake."""
    unknown = [arg for arg in extras if arg.startswith("-") or not hasattr(parsed, "overrides")]
    if unknown:
        raise LaunchError(f"{prog}: unrecognized arguments: {' '.join(unknown)}; see --help")
    if extras:
        parsed.overrides = [*parsed.overrides, *extras]


def build_parser(command: Optional[str]) -> Parser:
    """The whole tree; only ``command``'s subparser gets its arguments (importing its module). Without a
    command (``launcher --help``) the top level shows the launch's options and config groups too."""
    parser = Parser(prog="launcher", formatter_class=argparse.RawDescriptionHelpFormatter,
                    description="Compose GPT training runs from conf/, submit them to Slurm, and follow them.")
    if command is None:
        from launcher.commands.launch import epilog  # lazy: keeps launcher.commands out of start-up

        parser.epilog = epilog()
    parser.add_argument("-V", "--version", action="version", version=f"launcher {__version__}")
    sub = parser.add_subparsers(dest="command", title="commands", metavar="COMMAND")
    for name, spec in COMMANDS.items():
        child = sub.add_parser(name, help=spec.summary, description=spec.summary[:1].upper() + spec.summary[1:] + ".",
                               **({"prog": "launcher"} if name == DEFAULT_COMMAND else {}))
        if name != command:
            continue
        if spec.about_runs:
            child.add_argument("--root", type=Path, default=None,
                               help="run root (default: $LAUNCHER_RUN_ROOT or ~/.launcher/runs)")
            child.add_argument("--cluster", metavar="NAME", default=None,
                               help="a remote cluster (its file names ssh:) to run this on; default: the run's own")
        importlib.import_module(spec.module).configure(child)
    return parser
