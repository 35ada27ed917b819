"""``launcher [launch]``: compose the runs the overrides (and a run file) describe; print them or submit them.

``launcher gpus=16 model=gpt_1b`` composes one run and submits it; ``-m`` sweeps; ``-f run.yaml`` starts
from a run file; ``dry_run=true`` prints the plan and sbatch script instead, ``dry_run=json`` the plan as
JSON. Heavy imports (Hydra, submitit, tabulate) happen only on the paths that need them.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

from launcher.compose.catalog import GROUPS, auto_asked, options
from launcher.core.run_index import base_name
from launcher.errors import LaunchError
from launcher.job.secret_store import secrets_dir, store_secrets
from launcher.remote.clusters import launch_remote, remote_of, same_remote
from launcher.remote.ship import call
from launcher.views.lookup import invocation
from launcher.views.width import fit_table, fold_script, to_stderr, wrap

if TYPE_CHECKING:
    from launcher.compose.composer import ComposedRun
    from launcher.submit.checks import Verdict
    from launcher.submit.submitter import Launched


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.usage = "launcher [launch] [-m] [-f RUN.yaml] [key=value ...]"
    parser.epilog = epilog()
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="Hydra overrides (see below)")
    parser.add_argument("-m", "--multirun", action="store_true",
                        help="sweep: gpus=8,16,128 model=gpt_125m,gpt_1b launches 6 runs; or a search (search=optuna)")
    parser.add_argument("-f", "--file", type=Path, metavar="RUN.yaml",
                        help="start from a run file (a run directory's run.yaml, say); overrides win over it")


def epilog() -> str:
    """The config groups and override forms, for ``launcher --help`` and ``launcher launch --help``."""
    groups = "\n".join(f"  {group:<8} {', '.join(options(group))}" for group in GROUPS)
    return f"""launch (the default command: launcher key=value ... is launcher launch key=value ...):
  -m, --multirun       sweep: gpus=8,16,128 model=gpt_125m,gpt_1b launches 6 runs
                       search: search=optuna search.trials=24 'train.lr=tag(log, interval(1e-4, 3e-3))'
  -f, --file RUN.yaml  start from a run file; every run directory keeps its own as run.yaml

config groups (key=option):
{groups}
  gpus also takes any other count: gpus=3 is one node, gpus=24 three nodes of 8.

overrides: any key of launcher/core/config.py, e.g. train.steps=200 cluster.partition=gpu
  +cluster.sbatch_flags.mail-type=END  adds an extra #SBATCH option
  dry_run=true   print the plan and the sbatch script; submit nothing
  dry_run=json   print the plan as JSON (one object per line for a sweep)
  name=NAME      run name (letters, digits, . _ -)

examples:
  launcher gpus=16 model=gpt_1b
  launcher -m gpus=8,16,128 model=gpt_125m,gpt_1b dry_run=json
  launcher -f ~/.launcher/runs/gpt_1b-16g-ab12/run.yaml gpus=32"""


def overrides_of(args: argparse.Namespace) -> List[str]:
    """The command line's overrides, after those of the run file (which they win over); a key given
    twice on the command line (or in the file) is an error."""
    from launcher.compose.overrides import check_given_once  # lazy: keeps hydra out of start-up
    from launcher.compose.runfile import merge, read_run_file  # lazy: keeps omegaconf out of start-up

    check_given_once(args.overrides)
    if args.file is None:
        return list(args.overrides)
    overrides = merge(read_run_file(args.file), args.overrides)
    check_given_once(overrides)
    return overrides


def main(args: argparse.Namespace) -> int:
    """Compose the runs the arguments describe; print them (dry run) or submit them."""
    from launcher.compose.composer import compose_runs  # lazy: keeps hydra out of start-up
    from launcher.search.space import asked  # lazy: keeps omegaconf out of start-up

    overrides = overrides_of(args)
    store_secrets(secrets_dir())  # a bucket's data is checked with the credentials its tasks will have
    if asked(overrides):  # search=optuna: launcher/search/
        if auto_asked(overrides):
            raise LaunchError("cluster=auto places one run; a search (search=optuna) names its cluster: cluster=NAME")
        return search(overrides, args.multirun)
    if auto_asked(overrides):  # cluster=auto: where it starts first (launcher/service/auto.py)
        runs = [placed(overrides, args.multirun, json_out=dry_run_asked(overrides, "json"))]
    else:
        from launcher.submit.prefetch import prefetch  # lazy: keeps omegaconf out of start-up

        prefetch(overrides, source=not dry_run_asked(overrides))  # Slurm (and git) answer while Hydra composes
        runs = compose_runs(overrides, multirun=args.multirun)
    modes = {run.config.dry_run for run in runs}
    if len(modes) > 1:
        raise LaunchError("dry_run must be the same for every run of a sweep")
    mode = modes.pop()
    # Every refusal before anything is submitted, in the same words for a launch and a dry run
    # (launcher/submit/checks.py; the memory gate: docs/planning.md).
    from launcher.submit.checks import judge  # lazy: keeps hydra, submitit out of start-up

    verdict = judge(runs)
    if mode is False and verdict.refusals:  # one line, and nothing else
        raise verdict.error(runs)
    warn(verdict.lines(runs, verdict.warnings))
    if mode is not False:
        print_runs(runs, mode, sweep=args.multirun)
        return would_refuse(verdict, runs)
    if any(run.config.cluster.ssh for run in runs):  # a cluster reached over SSH: submitted there
        print_submitted(launch_remote(runs, sweep=args.multirun))
        return 0
    from launcher.submit.submitter import launch  # lazy: keeps hydra, submitit out of start-up

    print_submitted(launch(runs, sweep=args.multirun))
    return 0


def placed(overrides: List[str], multirun: bool, json_out: bool = False) -> ComposedRun:
    """``cluster=auto``: every candidate's line (on stderr where stdout is JSON), then the run composed for the
    cluster where it starts first; LaunchError where none can run it."""
    from launcher.service.auto import place  # lazy: keeps hydra out of start-up

    placement = place(overrides, multirun)
    for candidate in placement.candidates:
        if json_out:
            to_stderr(candidate.line)
        else:
            print(wrap(candidate.line, indent="  "))
    chosen = placement.chosen
    if chosen is None:
        raise placement.refusal()
    return chosen


def warn(lines: List[str]) -> None:
    for line in lines:
        to_stderr(f"warning: {line}")


def would_refuse(verdict: Verdict, runs: List[ComposedRun]) -> int:
    """A dry run's end: the checks not made and why, then what a launch would refuse (exit 2), or exit 0."""
    for note in verdict.unchecked:
        to_stderr(f"not checked: {note}")
    for line in verdict.lines(runs, verdict.refusals):
        to_stderr(f"a launch would be refused: {line}")
    return 2 if verdict.refusals else 0


def search(overrides: List[str], multirun: bool) -> int:
    """A search launch: its corners' dry run, or the study made and its first trials submitted."""
    from launcher.search.start import check_search, start_search  # lazy: keeps omegaconf out of start-up

    checked = check_search(overrides, multirun)
    verdict, mode = checked.verdict, checked.corners[0].config.dry_run
    if mode is False and verdict.refusals:
        raise verdict.error(checked.corners)
    warn(verdict.lines(checked.corners, verdict.warnings))
    if mode is not False:  # the plans at the space's corners: what the search may submit at its extremes
        print_runs(checked.corners, mode)
        return would_refuse(verdict, checked.corners)
    started, settings = start_search(checked), checked.settings
    from launcher.submit.freeze import dirty_note, source_state  # lazy: keeps launcher.submit out of start-up

    note = dirty_note(source_state())
    if note:
        print(note)
    toward = "lowest" if settings.direction == "minimize" else "highest"
    numbers = ", ".join(map(str, started.submitted))
    print(f"Submitted search {started.search_id}: trial{'s' if len(started.submitted) > 1 else ''} {numbers} of "
          f"{settings.trials}, {settings.parallel} at a time, toward the {toward} {settings.metric}")
    print(f"  study    {started.path}")
    print(f"  status   {invocation()} runs --sweep {started.search_id}")
    return 0


def print_runs(runs: List[ComposedRun], mode: object, sweep: bool = False) -> None:
    """A dry run: the runs' plans as JSON (``dry_run=json``, one object per line) or as tables and scripts (a
    sweep's as the job arrays it would be submitted as)."""
    if mode == "json":
        for run in runs:
            print(json.dumps({**run.plan.to_dict(), "name": display_name(run), "overrides": run.overrides,
                              "data": run.data.to_dict()}))
    else:
        print_dry_run(runs, sweep)


def dry_run_asked(overrides: List[str], kind: Optional[str] = None) -> bool:
    """Whether the overrides ask for a dry run (of ``kind``, ``json``, where named; composition decides: this only
    spares a dry run the submission's early question to git, and keeps stdout JSON's own)."""
    return any(o.split("=", 1)[0].lstrip("+") == "dry_run" and o.split("=", 1)[1].lower() != "false"
               and kind in (None, o.split("=", 1)[1].lower()) for o in overrides if "=" in o)


def display_name(run: ComposedRun) -> str:
    """The run's name, or its stem where the launch would add a random suffix."""
    return run.config.name or base_name(run.plan.model, run.plan.gpus)


def print_dry_run(runs: List[ComposedRun], sweep: bool = False) -> None:
    """Each run's plan, and the sbatch script it would be submitted with (launcher/submit/submitter.py scripts): for
    a sweep's runs that would share a job array, the array's one script after their plans. For a cluster reached
    over SSH, the scripts are that cluster's, with its paths."""
    names = [display_name(run) for run in runs]
    if any(run.config.cluster.ssh for run in runs):
        from launcher.remote.agent import request  # lazy: keeps hydra out of start-up

        same_remote(runs)
        answer = call(remote_of(runs[0].config.cluster), "scripts",
                      {**request(runs, sweep, sys.argv[1:]), "names": names})
        shown, data, where = answer["scripts"], answer["data"], f" on cluster {runs[0].config.cluster.name}"
    else:
        from launcher.submit.submitter import scripts  # lazy: keeps hydra, submitit out of start-up

        shown, data, where = [asdict(script) for script in scripts(runs, names, sweep)], None, ""
    for number, script in enumerate(shown):
        if number:
            print()
        group = script["runs"]
        for index in group:
            print_plan(runs[index], data[index] if data else runs[index].data.line(), index == group[0])
        if len(group) > 1:
            print(wrap(f"\n# sbatch script of one job array for {', '.join(names[i] for i in group)} (element i runs "
                       f"the i-th, its directory named with a suffix when submitted; Slurm's own lines in "
                       f"{script['folder']}{where}; split at the cluster's MaxArraySize)", indent="# "))
        else:
            print(wrap(f"\n# sbatch script (submitit folder {script['folder']}{where})", indent="# "))
        print(fold_script(script["text"]))  # still the script sbatch reads, its long commands continued by "\\"


def print_plan(run: ComposedRun, data: str, first: bool = True) -> None:
    """A run's heading, plan table, its step time and memory corrected by the cluster's similar completed runs
    where it has some (launcher/forecast/learned.py), and data line."""
    from launcher.forecast.learned import measured_lines  # lazy: keeps omegaconf out of start-up

    if not first:
        print()
    print(wrap(f"# run {display_name(run)}: {' '.join(run.overrides) or '(defaults)'}", indent="# "))
    rows = [(key, f"{value:,}" if type(value) is int else value) for key, value in run.plan.to_dict().items()]
    print(fit_table(rows, ["plan", ""], {1: 24}))
    for line in measured_lines(run.config, run.plan):
        print(wrap(line))
    print(wrap(data))


def print_submitted(launched: Launched) -> None:
    """What was submitted, with the commands that follow it, as this user runs the launcher."""
    records, sweep_id, launcher = launched.records, launched.sweep_id, invocation()
    if launched.note:
        print(wrap(launched.note))
    if not records:
        return
    if sweep_id is None:
        rec = records[0]
        print(f"Submitted {rec.name} as Slurm job {rec.job_id}: {rec.model} on {rec.nodes} node(s) x "
              f"{rec.gpus_per_node} GPUs, {rec.steps} steps")
        where = f"{launched.remote}:{rec.run_dir}" if launched.remote else str(rec.run_dir)
        print(f"  run dir  {shlex.quote(where)}")
        print(f"  status   {launcher} describe {shlex.quote(rec.name)}")
        print(f"  logs     {launcher} logs {shlex.quote(rec.name)} --follow")
        if not launched.remote:  # a remote run's run.yaml is on its cluster
            print(f"  again    {launcher} -f {shlex.quote(f'{rec.run_dir}/run.yaml')}")
        return
    rows = [(r.name, r.job_id, r.model, f"{r.nodes}x{r.gpus_per_node}", r.steps) for r in records]
    print(f"Submitted sweep {sweep_id}: {len(records)} runs")
    print(fit_table(rows, ["NAME", "JOB ID", "MODEL", "GPUS", "STEPS"], {"NAME": 16}))
    print(f"  status   {launcher} runs --sweep {sweep_id}")
