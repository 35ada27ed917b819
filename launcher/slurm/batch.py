"""The Slurm request of a run: its sbatch parameters and the exact sbatch script they produce.

:func:`sbatch_script` writes each parameter as an ``#SBATCH --key=value`` line (quoted) and the ``setup`` lines
verbatim into a bash script, in the form submitit's scripts have, by submitit's names for the parameters. A
newline inside any value would start a new shell line, so every value that reaches the script is checked here:
flag values must be plain tokens (no quotes, ``$``, backticks, ``;``, whitespace), and setup lines, which are
shell commands by design (written by whoever configures the cluster), must each be a single line. Paths and the
srun command are quoted. Every task runs the launcher's own entry point, ``python -m launcher.job.task FOLDER``
(:func:`task_command`), which launcher/job/task.py submits and runs.
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from launcher.core.config import ClusterConfig, RunConfig
from launcher.core.events import EXIT_NOT_OURS
from launcher.errors import LaunchError
from launcher.core.plan import Plan
from launcher.core.preemption import KILL_WAIT, SIGNAL
from launcher.core.privacy import umask_line
from launcher.core.nodelocal import TASK_PYTHON
from launcher.core.rundir import CODE, code_dir
from launcher.core.store import is_remote

# Characters a Slurm option value needs (constraints use & | [ ] *, images : / #).
_TOKEN = re.compile(r"[A-Za-z0-9._,:=@%/+#&|*\[\]-]+")
_FLAG_KEY = re.compile(r"[a-z][a-z0-9_-]*")
# Options written into every script by sbatch_script or executor_params.
_LAUNCHER_FLAGS = {"signal", "output", "error", "open-mode", "array", "wckey", "job-name", "comment", "no-requeue"}
# What every task's environment has unless cluster.env says otherwise: Python's stacks on a fatal signal
# (a hung or crashed rank's log says where), and NCCL's warnings (not its info flood) in the rank's log.
TASK_ENV = {"PYTHONFAULTHANDLER": "1", "NCCL_DEBUG": "WARN"}
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def request_params(cfg: RunConfig, plan: Plan) -> Dict[str, Any]:
    """The parameters that follow from the config alone (all but the job name).

    One task per GPU: ``ntasks_per_node`` tasks on each of ``nodes`` nodes
    (``--ntasks`` in all when the cluster overcommits CPUs),
    each with ``cluster.cpus_per_gpu`` CPUs (none asked when null). USR2 arrives ``signal_delay_s``
    before the time limit so rank 0 can checkpoint and requeue. Composition
    calls this too, so an unsafe cluster value fails before any run of a sweep
    is submitted. Raises LaunchError.
    """
    cluster = cfg.cluster
    params: Dict[str, Any] = {"nodes": plan.nodes, "time": cluster.time_limit_min,
                              "signal_delay_s": cluster.signal_delay_s, **gpu_request(cluster, plan)}
    srun_args: list = []
    if cluster.cpus_per_gpu is not None:
        params["cpus_per_task"] = cluster.cpus_per_gpu
        # srun no longer inherits sbatch's --cpus-per-task (Slurm 22.05): without this every rank gets one CPU.
        srun_args.append(f"--cpus-per-task={cluster.cpus_per_gpu}")
    params["setup"] = [env_line(cluster.env), *(_setup_line(line) for line in cluster.setup)]
    # None writes no --wckey (submitit would write a made-up one, which sites that enforce wckeys reject).
    params["wckey"] = None if cluster.wckey is None else _token("cluster.wckey", cluster.wckey)
    memory = ("mem",) if cluster.mem is not None else ("mem_per_gpu",)  # sbatch refuses both at once
    for key in ("partition", "account", "qos", "constraint", *memory):
        value = getattr(cluster, key)
        if value is not None:
            params[key] = _token(f"cluster.{key}", value)
    if cluster.exclusive:
        params["exclusive"] = True
    extra: Dict[str, Any] = {}
    if cluster.overcommit:
        # Slurm checks --ntasks-per-node against the node's CPUs even with --overcommit, but not
        # --ntasks, which it then spreads evenly over the nodes.
        extra.update(overcommit=True, ntasks=plan.nodes * plan.tasks_per_node)
    else:
        params["ntasks_per_node"] = plan.tasks_per_node
    managed = {key.replace("_", "-") for key in [*params, *extra, "ntasks_per_node", "gpus_per_node", "gres",
                                                  "mem", "mem_per_gpu"]} | _LAUNCHER_FLAGS
    extra.update(_sbatch_flags(cluster.sbatch_flags, managed))
    extra["requeue"] = True  # requeued by Slurm after a lost node, and at a time limit, whatever JobRequeue says
    if "exclude" in extra:  # merged with a retry's exclusions (executor_params), never replacing them
        params["exclude"] = extra.pop("exclude")
    params["additional_parameters"] = extra
    srun_args += [*container_args(cfg, None), *map(_setup_line, cluster.srun_args)]
    if srun_args:
        params["srun_args"] = srun_args
    return params


def gpu_request(cluster: ClusterConfig, plan: Plan) -> Dict[str, Any]:
    """How the GPUs of a node are asked for: ``--gpus-per-node=[TYPE:]N``, or ``--gres=GRES:N`` with
    ``cluster.gres``."""
    if cluster.gres is not None:
        gres = _token("cluster.gres", cluster.gres)
        if gres.rpartition(":")[2].isdigit():
            raise LaunchError(f"cluster.gres={gres} names a count; give the gres without it (e.g. gpu or gpu:h100): "
                              "the launcher appends the GPUs each node runs")
        return {"gres": f"{gres}:{plan.gpus_per_node}"}
    if cluster.gpu_type is not None:
        return {"gpus_per_node": f"{_token('cluster.gpu_type', cluster.gpu_type)}:{plan.gpus_per_node}"}
    return {"gpus_per_node": plan.gpus_per_node}


def container_args(cfg: RunConfig, run_dir: Path | None, mounts: Sequence[str] = ()) -> list:
    """pyxis's srun options for ``cluster.container``: the image (or a pre-imported .sqsh), the container's
    name, the mounts that make the run root, the data and ``mounts`` (the secrets store) visible at the same
    paths inside, plus the cluster's own, and the working directory (the run directory unless set)."""
    box = cfg.cluster.container
    if box.image is None:
        return []
    args = [f"--container-image={_token('cluster.container.image', box.image)}"]
    if box.name is not None:
        args.append(f"--container-name={_token('cluster.container.name', box.name)}")
    root = Path(run_dir).absolute().parent if run_dir is not None else Path(os.path.expanduser(cfg.run_root))
    # A bucket's dataset is read over the network into the node's cache: only a cache folder set by the user is
    # mounted.
    data = [cfg.data.stream_cache_dir] if is_remote(cfg.data.path) else [cfg.data.path or cfg.data.cache_dir]
    host = [str(Path(os.path.expanduser(path)).absolute()) for path in (root, *data, *mounts) if path]
    listed = [*dict.fromkeys(f"{path}:{path}" for path in host), *box.mounts]
    args.append(f"--container-mounts={_token('cluster.container.mounts', ','.join(listed))}")
    workdir = box.workdir or (str(Path(run_dir).absolute()) if run_dir is not None else None)
    if workdir is not None:
        args.append(f"--container-workdir={_token('cluster.container.workdir', workdir)}")
    return args


def host_python(cluster: ClusterConfig) -> str:
    """The interpreter of the batch script's own steps on the cluster's hosts: ``cluster.python``, else the one
    that submits (which must then exist at the same path on the compute nodes)."""
    return shlex.quote(cluster.python or sys.executable)


def task_python(cluster: ClusterConfig) -> str:
    """The interpreter every task runs: the container's, or the hosts', or where the environment is staged, the batch
    shell's :data:`TASK_PYTHON` (the hosts' unless every node has the environment's copy: launcher/job/stage.py)."""
    if cluster.container.image is not None:
        return cluster.container.python
    return f'"${TASK_PYTHON}"' if cluster.stage_env else host_python(cluster)


def env_line(env: Dict[str, Any]) -> str:
    """The setup line that exports the tasks' variables: TASK_ENV under ``cluster.env`` (null drops one)."""
    merged = {**TASK_ENV, **env}
    for name in merged:
        if not _ENV_NAME.fullmatch(name):
            raise LaunchError(f"cluster.env.{name}: not a variable name; use letters, digits and _, "
                              "not starting with a digit")
    exports = [f"{name}={shlex.quote(_setup_line(str(value)))}" for name, value in merged.items()
               if value is not None]
    return f"export {' '.join(exports)}" if exports else ":"


def executor_params(cfg: RunConfig, plan: Plan, run_name: str, run_dir: Path | None = None,
                    exclude: Sequence[str] = (), mounts: Sequence[str] = (), begin_s: int = 0) -> Dict[str, Any]:
    """The parameters of the run's batch script, keyword arguments of :func:`sbatch_script`.

    With the run's directory, the job also records its attempt around the ranks and recovers from a
    failure (launcher/job/recovery.py): ``begin`` before srun, ``end`` with srun's exit status after it (which
    also requeues the job when the ranks saved on Slurm's signal), and the progress comment beside srun
    (launcher/job/comment.py), all, like the tasks, importing the run's frozen code (:func:`frozen_code_line`); and
    srun ends every rank as soon as one dies (``--kill-on-bad-exit``), so an attempt fails in seconds, not
    after a collective's timeout. ``exclude``: nodes the job must not run on (an earlier attempt's culprits).
    ``begin_s``: the job is eligible only that many seconds from now (``--begin``).
    """
    check_run_name(run_name)
    params = {**request_params(cfg, plan), "job_name": run_name, "comment": f"launcher:{run_name}"}
    if run_dir is not None:
        where = shlex.quote(str(Path(run_dir).absolute()))
        # The umask first: every file of the job (Slurm's output, logs, checkpoints) is the run's alike.
        params["setup"] = [umask_line(cfg.share_group), *params.get("setup", []), *host_steps(cfg, where)]
        params["teardown"] = host_end(cfg, where)
        inside = container_args(cfg, run_dir, mounts)
        outside = [arg for arg in params.get("srun_args", []) if not arg.startswith("--container-")]
        params["srun_args"] = ["--kill-on-bad-exit=1", *outside, *inside]
    if exclude:
        params["exclude"] = _token("exclude", ",".join([*filter(None, [params.get("exclude")]), *exclude]))
    if begin_s:
        params["additional_parameters"] = {**params.get("additional_parameters", {}), "begin": f"now+{begin_s}"}
    return params


def host_steps(cfg: RunConfig, where: str) -> list:
    """The setup lines, after the cluster's own, of the run whose directory the shell word ``where`` names: its
    frozen code on PYTHONPATH, the attempt's record (launcher/job/recovery.py), the progress comment, set
    from here, the host, beside the ranks (launcher/job/comment.py), and the code's copy to every node, which the
    ranks and the end step then import instead where every node has one (launcher/job/stage.py). The begin step's
    EXIT_NOT_OURS (another job of the run holds it: launcher/job/claim.py) ends the script there; another failure
    of it lets the attempt go on.
    The begin step prints Slurm's KillWait, which it asks on the host, and the tasks get it in their environment
    (srun passes the script's on; launcher/core/preemption.py), empty where Slurm could not say."""
    python = host_python(cfg.cluster)
    steps = [_frozen_code_export(where), f"{KILL_WAIT}=$({python} -m launcher.job.recovery begin {where})",
             f"[ $? -ne {EXIT_NOT_OURS} ] || exit {EXIT_NOT_OURS}", f"export {KILL_WAIT}"]
    if cfg.cluster.progress_comment:  # a site may turn it off (cluster.progress_comment: false)
        steps.append(f"{python} -m launcher.job.comment {where} & {PROGRESS}=$!")
    staged = [kind for kind, wanted in (("code", stages_code(cfg.cluster)), ("env", cfg.cluster.stage_env)) if wanted]
    if "env" in staged:
        steps.append(f"export {TASK_PYTHON}={python}")
    if staged:  # the ranks import the code, and run the environment, from their node's copies where every node has one
        steps.append(f'{STAGED}=$({python} -m launcher.job.stage {where} {" ".join(staged)}) && eval "${STAGED}"')
    return steps


# The batch shell's variable holding the stage step's assignments (launcher/job/stage.py): the ranks' PYTHONPATH
# with the code's copy, and TASK_PYTHON, the environment copy's interpreter.
STAGED = "LAUNCHER_STAGED"


def stages_code(cluster: ClusterConfig) -> bool:
    """Whether the run's code is staged to node-local storage (``cluster.stage_code``; unset: where the GPUs are real,
    as a cluster of virtual ones is the local cluster, whose nodes share one machine's disk): never in a container,
    whose ranks see neither the host's /dev/shm nor its /tmp."""
    wanted = not cluster.virtual_gpus if cluster.stage_code is None else cluster.stage_code
    return wanted and cluster.container.image is None


# The batch shell's variable holding the progress follower's pid, so that the shell reaps it before it ends: an
# orphan left to notice its shell gone would outlive its job (a search's "nothing runs between trials").
PROGRESS = "LAUNCHER_PROGRESS"


def host_end(cfg: RunConfig, where: str) -> list:
    """The teardown lines after srun: the attempt's end with srun's exit status (launcher/job/recovery.py), then
    the progress follower stopped and reaped, the script ending with the end step's status."""
    return [f"{host_python(cfg.cluster)} -m launcher.job.recovery end {where} $?",
            f"ENDED=$?; kill ${PROGRESS} 2>/dev/null; wait ${PROGRESS} 2>/dev/null; exit $ENDED"]


WATCHER_MINUTES = 10  # the watcher reads the run's record and Slurm's account of the job, and may submit a retry
WATCHER_SUFFIX = ".watch"  # a watcher's job name: its run's (or job array's) name and this


def watcher(cfg: RunConfig, watched: Sequence[Tuple[Path, str]], after: str, name: str,
            output: Path) -> Tuple[str, List[str]]:
    """The script and sbatch flags of the job that watches the jobs ``watched`` ((run directory, job id) each): it
    runs only if job ``after`` ends in any state but COMPLETED (``afternotok``; Slurm drops it otherwise, and a
    requeue leaves it waiting), on one CPU of the run's partition, account and QOS, and for each watched job judges an
    attempt whose batch step died before its end step could (``python -m launcher.job.recovery watch``). A plain
    job watches itself; a job array is ``after`` for all its elements, which Slurm counts as failed once every
    element has ended and one did not complete. The cluster's setup lines come first, as in the run's own script:
    they may be what puts the cluster's Python on PATH."""
    cluster = cfg.cluster
    lines = ["#!/bin/bash", umask_line(cfg.share_group), env_line(cluster.env),
             *(_setup_line(line) for line in cluster.setup)]
    for run_dir, job_id in watched:  # each with its run's own frozen code
        where = shlex.quote(str(Path(run_dir).absolute()))
        lines += [_frozen_code_export(where),
                  f"{host_python(cluster)} -m launcher.job.recovery watch {where} {_token('job id', job_id)}"]
    flags = [f"--job-name={name}{WATCHER_SUFFIX}", f"--dependency=afternotok:{after}", "--kill-on-invalid-dep=yes",
             "--ntasks=1", f"--time={WATCHER_MINUTES}", "--no-requeue", f"--comment=launcher-watch:{name}",
             f"--output={Path(output).absolute()}", "--open-mode=append"]
    for key in ("partition", "account", "qos", "wckey"):
        value = getattr(cluster, key)
        if value is not None:
            flags.append(f"--{key}={_token(f'cluster.{key}', value)}")
    return "\n".join(lines) + "\n", flags


def frozen_code_line(run_dir: Path) -> str:
    """The setup line that makes the job import the run's frozen code (launcher/submit/freeze.py): its copy first on
    PYTHONPATH, and PYTHONSAFEPATH so that ``python -m`` does not put the working directory (often the
    checkout the job was submitted from) before it."""
    return _frozen_code_export(shlex.quote(str(code_dir(run_dir).parent)))


def _frozen_code_export(where: str) -> str:
    """:func:`frozen_code_line` for the run directory the shell word ``where`` names."""
    return f"export PYTHONPATH={where}/{CODE}${{PYTHONPATH:+:$PYTHONPATH}} PYTHONSAFEPATH=1"


# The shell words that hold an array element's run directory, and its submitit folder, in the batch script of a
# job array.
ELEMENT_DIR, ELEMENT_FOLDER = '"$RUN_DIR"', '"$RUN_DIR/submitit"'
# The launcher's own entry point, which every task runs (launcher/job/task.py).
TASK_MODULE = "launcher.job.task"


def task_command(python: str, folder: str) -> str:
    """The command every task runs: the task pickled in the run's submitit folder, named by the shell word
    ``folder``, run by the launcher's entry point with unbuffered output."""
    return f"{python} -u -m {TASK_MODULE} {folder}"


def array_script(cfg: RunConfig, plan: Plan, job_name: str, run_dirs: Sequence[Path], folder: Path,
                 mounts: Sequence[str] = ()) -> str:
    """The sbatch script of one job array whose element ``i`` runs the run in ``run_dirs[i]``, at most
    ``cfg.sweep.parallel`` at once; the runs share ``cfg``'s request (launcher/submit/submitter.py groups them by
    this script, given no run directory).

    Slurm writes an array's ``--output`` by pattern, which cannot name a run directory: Slurm's own lines go to
    ``folder`` (the sweep's), and the element's first line finds its run directory by ``SLURM_ARRAY_TASK_ID``
    and sends the batch shell's output to that run's files, named as a plain job's are but by element
    (``123_4_0_log.err`` in ``RUN/submitit``). From there it is a run's job as :func:`executor_params` writes one:
    the same steps around srun, with ``$RUN_DIR`` for the directory, and the ranks' files and the task's pickle in
    the run's own submitit folder (launcher/job/task.py writes the pickles)."""
    params = executor_params(cfg, plan, job_name)
    elements = " ".join(shlex.quote(str(Path(run_dir).absolute())) for run_dir in run_dirs)
    own = '"$RUN_DIR/submitit/${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}_0_log'
    setup = [umask_line(cfg.share_group), f"RUN_DIRS=({elements}) && RUN_DIR=${{RUN_DIRS[$SLURM_ARRAY_TASK_ID]}}",
             f'exec >>{own}.out" 2>>{own}.err"', *params.pop("setup"), *host_steps(cfg, ELEMENT_DIR)]
    folders = [f'"$RUN_DIR/submitit/%A_%a_%t_log.{kind}"' for kind in ("out", "err")]
    srun = " ".join(["srun --unbuffered --output", folders[0], "--error", folders[1], "--kill-on-bad-exit=1",
                     *map(shlex.quote, params.pop("srun_args", []))])
    count = max(1, len(run_dirs))
    return sbatch_script(f"{srun} {task_command(task_python(cfg.cluster), ELEMENT_FOLDER)}", Path(folder),
                         use_srun=False, setup=setup, teardown=host_end(cfg, ELEMENT_DIR),
                         array=f"0-{count - 1}%{min(count, cfg.sweep.parallel or len(run_dirs))}", **params)


def render_sbatch(cfg: RunConfig, plan: Plan, run_name: str, folder: str | Path, mounts: Sequence[str] = (),
                  exclude: Sequence[str] = (), begin_s: int = 0) -> str:
    """The sbatch script of this run's job, its tasks' files in ``folder`` (the run's submitit folder), from the
    parameters :func:`executor_params` gives (``exclude``, ``begin_s``: a retry's)."""
    folder = Path(folder).expanduser().absolute()
    if any(ord(char) < 32 for char in str(folder)):
        raise LaunchError(f"run folder {str(folder)!r} contains a control character")
    return sbatch_script(task_command(task_python(cfg.cluster), shlex.quote(str(folder))), folder,
                         **executor_params(cfg, plan, run_name, folder.parent, exclude, mounts, begin_s))


def sbatch_script(command: str, folder: Path, *, signal_delay_s: int, setup: Optional[List[str]] = None,
                  teardown: Optional[List[str]] = None, srun_args: Sequence[str] = (),
                  additional_parameters: Optional[Mapping[str, Any]] = None, array: Optional[str] = None,
                  use_srun: bool = True, **options: Any) -> str:
    """The batch script that runs ``command`` (through ``srun --unbuffered``, every task's output in ``folder`` by
    job and task, ``%j_%t_log.out``, unless ``use_srun`` is off), line for line as submitit writes one from the same
    parameters, by the same names: the ``#SBATCH`` lines (``options``, then ``additional_parameters`` as given;
    None writes none) in order of their names, the ``setup`` lines, the command, the ``teardown`` lines.
    ``array``: sbatch's ``--array``, each element's output named by array and element (``%A_%a_%t``). The
    signal that warns of the time limit is the one the tasks listen for (launcher/core/preemption.py)."""
    job = "%A_%a" if array else "%j"
    stdout, stderr = (str(Path(folder).expanduser().absolute() / f"{job}_%t_log.{kind}") for kind in ("out", "err"))
    flags = {**{key: value for key, value in options.items() if value is not None},
             "signal": f"{SIGNAL.name.removeprefix('SIG')}@{signal_delay_s}", "output": stdout.replace("%t", "0"),
             "error": stderr.replace("%t", "0"), "open-mode": "append", **({"array": array} if array else {}),
             **(additional_parameters or {})}
    lines = ["#!/bin/bash", "", "# Parameters", *(_sbatch_line(key, flags[key]) for key in sorted(flags))]
    if setup is not None:
        lines += ["", "# setup", *setup]
    if use_srun:
        srun = ["srun", "--unbuffered", "--output", stdout, "--error", stderr, *srun_args]
        command = " ".join([*map(shlex.quote, srun), command])
    # submitit's JobEnvironment reads Slurm's variables in a task where this names its executor.
    lines += ["", "# command", "export SUBMITIT_EXECUTOR=slurm", command, ""]
    if teardown is not None:
        lines += ["", "# teardown", *teardown]
    return "\n".join(lines)


def _sbatch_line(key: str, value: Any) -> str:
    key = key.replace("_", "-")
    return f"#SBATCH --{key}" if value is True else f"#SBATCH --{key}={shlex.quote(str(value))}"


def _token(key: str, value: Any) -> str:
    text = str(value)
    if not _TOKEN.fullmatch(text):
        raise LaunchError(
            f"{key}={text!r} is not allowed in an sbatch script; "
            "use letters, digits and . _ , : = @ % / + # & | * [ ] -"
        )
    return text


def _setup_line(line: str) -> str:
    if any(char in line for char in "\n\r\0"):
        raise LaunchError(f"cluster.setup line {line!r} must be a single line")
    return line


def _sbatch_flags(flags: Dict[str, Any], managed: set) -> Dict[str, Any]:
    """``cluster.sbatch_flags`` as :func:`sbatch_script`'s additional_parameters: ``true`` is a
    bare flag, false/null omit it; the launcher's own options cannot be replaced."""
    out: Dict[str, Any] = {}
    for key, value in flags.items():
        if not _FLAG_KEY.fullmatch(key):
            raise LaunchError(f"cluster.sbatch_flags key {key!r} is not an sbatch option name")
        if key.replace("_", "-") in managed:
            raise LaunchError(f"cluster.sbatch_flags.{key} is set by the launcher; change the cluster or layout")
        if value is True:
            out[key] = True
        elif isinstance(value, (list, tuple)):
            joined = ",".join(map(str, value))
            raise LaunchError(f"cluster.sbatch_flags.{key} is a list ({joined}); an sbatch option takes one value: "
                              f"quote it to keep its commas, \"+cluster.sbatch_flags.{key}='{joined}'\"")
        elif value is not None and value is not False:
            out[key] = _token(f"cluster.sbatch_flags.{key}", value)
    return out


# Run names become directory names, Slurm job names and #SBATCH values.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_run_name(name: str) -> None:
    if not RUN_NAME.fullmatch(name):  # fullmatch: '$' would accept a trailing newline
        raise LaunchError(
            f"invalid run name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )
