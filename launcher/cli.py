"""The ``launcher`` command: a subcommand, or a launch described by Hydra overrides.

``python -m launcher gpus=16 model=gpt_1b`` composes one run and submits it;
``-m`` sweeps; ``dry_run=true`` prints the plan and sbatch script instead,
``dry_run=json`` the plan as JSON. A first argument naming a subcommand
(``runs``, ``logs``, ...) dispatches to it instead. Heavy imports (submitit,
tabulate, the submission code) happen only on the paths that need them, so
answering stays fast.
"""
from __future__ import annotations

import importlib
import json
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Dict, List, Optional, Sequence

from launcher.errors import LaunchError, did_you_mean

if TYPE_CHECKING:
    from launcher.compose import ComposedRun

# Subcommand name -> "module:function". Each function takes the remaining
# arguments and returns an exit status; its module is imported only when used.
SUBCOMMANDS: Dict[str, str] = {
    "runs": "launcher.commands.runs:main",
    "describe": "launcher.commands.describe:main",
    "logs": "launcher.commands.logs:main",
    "stop": "launcher.commands.stop:main",
    "delete": "launcher.commands.delete:main",
    "clusters": "launcher.commands.clusters:main",
    "compare": "launcher.commands.compare:main",
    "secrets": "launcher.commands.secrets:main",
    "plan": "launcher.commands.plan:main",
}

_WORD = re.compile(r"[a-z][a-z_-]*")


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Entry point of ``launcher`` / ``python -m launcher``; returns the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args and args[0] in SUBCOMMANDS:
            return _subcommand(args[0])(args[1:])
        return launch_command(args)
    except LaunchError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `launcher runs | head`: the reader left; stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def launch_command(args: List[str]) -> int:
    """Compose the runs the arguments describe; print them (dry run) or submit them."""
    multirun = False
    overrides: List[str] = []
    for arg in args:
        if arg in ("-h", "--help"):
            print(usage())
            return 0
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg.startswith("-"):
            raise LaunchError(f"unknown option '{arg}'; see --help")
        else:
            overrides.append(arg)
    if overrides and _WORD.fullmatch(overrides[0]):
        commands = sorted(SUBCOMMANDS)
        raise LaunchError(
            f"unknown command '{overrides[0]}'{did_you_mean(overrides[0], commands)}; "
            f"commands: {', '.join(commands) or 'none'}; or launch with key=value overrides"
        )

    from launcher.compose import compose_runs

    runs = compose_runs(overrides, multirun=multirun)
    modes = {run.config.dry_run for run in runs}
    if len(modes) > 1:
        raise LaunchError("dry_run must be the same for every run of a sweep")
    mode = modes.pop()
    # Refuse (exit 2, before anything is submitted) a run that cannot fit its GPUs' memory, unless force=true;
    # a dry run only warns. See launcher/planning/gate.py and docs/planning.md.
    from launcher.planning.gate import check_launch

    for warning in check_launch(runs, dry_run=mode is not False):
        print(f"warning: {warning}", file=sys.stderr)
    if mode == "json":
        for run in runs:
            print(json.dumps({**run.plan.to_dict(), "name": _display_name(run), "overrides": run.overrides}))
        return 0
    if mode is True:
        _print_dry_run(runs)
        return 0
    from launcher.submit import launch

    return launch(runs, sweep=multirun)


def usage() -> str:
    from launcher.catalog import GROUPS, options

    groups = "\n".join(f"  {group:<8} {', '.join(options(group))}" for group in GROUPS)
    commands = ", ".join(sorted(SUBCOMMANDS)) or "(none yet)"
    return f"""usage: launcher [-m|--multirun] [key=value ...]
       launcher <command> [args ...]

Compose a GPT training run from conf/ and submit it to Slurm.

config groups (key=option):
{groups}
  gpus also takes any other count: gpus=3 is one node, gpus=24 three nodes of 8.

overrides: any key of launcher/core/config.py, e.g. train.steps=200 cluster.partition=gpu
  +cluster.sbatch_flags.mail-type=END  adds an extra #SBATCH option
  dry_run=true   print the plan and the sbatch script; submit nothing
  dry_run=json   print the plan as JSON (one object per line for a sweep)
  name=NAME      run name (letters, digits, . _ -)

-m, --multirun   sweep: gpus=8,16,128 model=gpt_125m,gpt_1b launches 6 runs
-h, --help       this help

commands: {commands}

examples:
  launcher gpus=16 model=gpt_1b
  launcher -m gpus=8,16,128 model=gpt_125m,gpt_1b dry_run=json"""


def _subcommand(name: str) -> Callable[[List[str]], int]:
    module, function = SUBCOMMANDS[name].split(":")
    return getattr(importlib.import_module(module), function)


def _display_name(run: ComposedRun) -> str:
    """The run's name, or its stem where the launch would add a random suffix."""
    from launcher.core.rundir import base_name

    return run.config.name or base_name(run.plan.model, run.plan.gpus)


def _print_dry_run(runs: List[ComposedRun]) -> None:
    from tabulate import tabulate

    from launcher.sbatch import render_sbatch

    for index, run in enumerate(runs):
        name = _display_name(run)
        folder = Path(run.config.run_root).expanduser() / name / "submitit"
        if index:
            print()
        print(f"# run {name}: {' '.join(run.overrides) or '(defaults)'}")
        print(tabulate(run.plan.to_dict().items(), headers=["plan", ""], intfmt=","))
        print(f"\n# sbatch script (submitit folder {folder})")
        print(render_sbatch(run.config, run.plan, name, folder))
