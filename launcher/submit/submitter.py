"""Submit composed runs to Slurm: check the cluster, record each run, submit its job, return at once.

Every check that can refuse a launch (Slurm reachable, the request fits the partition, the run root is
writable and, like the launcher home its tasks read secrets from, out of other users' reach) runs for every
run of a sweep before the first one is submitted. A run whose submission fails leaves no directory behind.
"""
from __future__ import annotations

import secrets
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple

from omegaconf import OmegaConf

from launcher.compose.catalog import other_clusters
from launcher.compose.composer import ComposedRun
from launcher.errors import LaunchError
from launcher.compose.runfile import dump
from launcher.core.config import tracker_missing
from launcher.core.events import Submitted
from launcher.core.rundir import (CONFIG, FORECAST, PLAN, SOURCE_ROOT, append_event, launcher_home, sweep_dir,
                                  write_atomic, write_json_atomic)
from launcher.core.safepath import check_home
from launcher.core.run_index import (RunRecord, base_name, create_run_dir, ensure_root, remember_root,
                                   ensure_sweep_dir, save_record)
from launcher.core.privacy import RunWriter, group_id
from launcher.core.store import STORE_CREDENTIALS, is_remote, login_credentials
from launcher.forecast.learned import forecast_of
from launcher.job.secret_store import keep_run_credentials, load_all, secrets_dir
from launcher.job.stage import pack
from launcher.slurm.fit import explain_rejection, refusal
from launcher.job.submission import submit_job, watch, watch_array
from launcher.submit.array import submit_array
from launcher.submit.checks import pack_environment
from launcher.slurm.batch import array_script, render_sbatch, stages_code
from launcher.submit.freeze import dirty_note, freeze, source_state
from launcher.slurm.client import Partition, SlurmError, Unreachable, for_cluster, slurm_conf_for


@dataclass(frozen=True)
class Launched:
    """What a launch submitted, for the command to show: the runs' records, the sweep id, a note on the code."""

    records: List[RunRecord]
    sweep_id: Optional[str] = None
    note: Optional[str] = None  # the code had uncommitted changes (launcher/submit/freeze.py)
    remote: Optional[str] = None  # the remote cluster they went to (launcher/remote/): their paths are its own


def launch(runs: List[ComposedRun], sweep: bool) -> Launched:
    """Submit every run and return what was submitted: a sweep's runs of one resource shape as one job array
    (:func:`arrays`), every other run as a Slurm job of its own."""
    roots, parts = check_runs(runs)
    sweep_id = new_sweep_id() if sweep else None
    try:
        batches = arrays(runs, roots, sweep_id) if sweep_id else [[index] for index in range(len(runs))]
    except (SlurmError, ValueError) as err:
        raise LaunchError(str(err)) from None
    records: Dict[int, RunRecord] = {}
    for batch in batches:
        first = batch[0]
        if len(batch) == 1:
            records[first] = submit_one(runs[first], roots[first], sweep_id, parts[first])
        else:
            records.update(zip(batch, submit_elements([runs[i] for i in batch], roots[first], sweep_id, parts[first])))
    return Launched([records[index] for index in range(len(runs))], sweep_id, dirty_note(source_state()))


def check_runs(runs: List[ComposedRun]) -> Tuple[List[Path], List[Partition]]:
    """Every check that can refuse the runs' submission, for all of them before any is submitted (a LaunchError
    in one line); returns each run's root, created if needed, and partition."""
    for missing in filter(None, (tracker_missing(run.config.tracking.backend) for run in runs)):
        raise LaunchError(missing)
    try:
        for run in runs:
            group_id(run.config.share_group)
        check_home(launcher_home())
        roots = [ensure_root(run.config.run_root, run.config.share_group) for run in runs]
        for root in set(roots):
            remember_root(root)  # so that `launcher runs` in any shell lists its runs without --root
        parts = check_cluster(runs)
        for python in {run.config.cluster.python or sys.executable for run in runs
                       if run.config.cluster.stage_env and not run.config.cluster.ssh}:
            pack_environment(python)  # once per version of the environment: nothing to do after
        return roots, parts
    except Unreachable as err:  # perhaps meant for another cluster
        raise LaunchError(str(err) + other_clusters(*{run.config.cluster.name for run in runs})) from None
    except (SlurmError, PermissionError, ValueError) as err:
        raise LaunchError(str(err)) from None


def new_sweep_id() -> str:
    """The id of a sweep (a grid's runs, or a search's trials), as run.json records it."""
    return f"sweep-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def arrays(runs: List[ComposedRun], roots: List[Path], sweep_id: str) -> List[List[int]]:
    """The runs of a sweep (by index) that each job array holds: each of :func:`shapes`, in pieces of the
    cluster's MaxArraySize (0: no arrays)."""
    batches = []
    for indices in shapes(runs, roots, sweep_id):
        size = max(1, for_cluster(runs[indices[0]].config.cluster).max_array_size()) if len(indices) > 1 else 1
        batches += [indices[start:start + size] for start in range(0, len(indices), size)]
    return batches


def shapes(runs: List[ComposedRun], roots: List[Path], sweep_id: str) -> List[List[int]]:
    """The runs of a sweep (by index) whose array script would be the same but for the run directories (the same
    cluster, request, root, interpreter and ``sweep.parallel``), in order. A run alone in its shape, or in a
    container (whose work directory is its run's), is a job of its own (a group of one). Asks nothing of Slurm:
    a dry run shows the arrays with it."""
    groups: Dict[tuple, List[int]] = {}
    for index, (run, root) in enumerate(zip(runs, roots)):
        cfg = run.config
        shape = (index,) if cfg.cluster.container.image is not None else (
            for_cluster(cfg.cluster).conf, cfg.sweep.parallel, cfg.cluster.max_requeues,
            array_script(cfg, run.plan, sweep_id, [], sweep_dir(root, sweep_id)))
        groups.setdefault(shape, []).append(index)
    return list(groups.values())


@dataclass(frozen=True)
class Script:
    """One sbatch script a launch would submit, for a dry run: the runs it holds (their indices), the folder its
    tasks' or Slurm's output goes to, and its text."""

    runs: List[int]
    folder: str
    text: str


def scripts(runs: List[ComposedRun], names: List[str], sweep: bool) -> List[Script]:
    """The scripts a launch of ``runs`` would submit, nothing written and Slurm not asked: one per run, or for a
    sweep one per job array (:func:`shapes`; not split at MaxArraySize, which only Slurm knows). ``names``: the
    runs' directory names as a dry run shows them."""
    roots = [Path(run.config.run_root).expanduser() for run in runs]
    mounts = [str(secrets_dir())]
    sweep_id = new_sweep_id()
    out = []
    for group in shapes(runs, roots, sweep_id) if sweep else [[index] for index in range(len(runs))]:
        run, root = runs[group[0]], roots[group[0]]
        if len(group) == 1:
            folder = root / names[group[0]] / "submitit"
            out.append(Script(group, str(folder), render_sbatch(run.config, run.plan, names[group[0]], folder,
                                                                mounts=mounts)))
        else:
            folder = sweep_dir(root, sweep_id)
            out.append(Script(group, str(folder), array_script(run.config, run.plan, sweep_id,
                                                               [roots[i] / names[i] for i in group], folder,
                                                               mounts=mounts)))
    return out


def check_cluster(runs: List[ComposedRun]) -> List[Partition]:
    """Slurm answers, and each run fits its partition as it could ever be (not as it is now): GPUs, CPUs and
    memory per node, node count, MaxNodes and MaxTime. Returns each run's partition.

    Each cluster is asked once per partition, however many runs of a sweep go there."""
    partitions: Dict[tuple, Partition] = {}
    for run in runs:
        cluster = run.config.cluster
        slurm = for_cluster(cluster)
        key = (slurm.conf, cluster.partition)
        if key not in partitions:
            try:
                partitions[key] = slurm.partition(cluster.partition)
            except SlurmError:
                slurm.ping()  # when the controller is what failed, say so in one line (no extra round trip before)
                raise
        check_fits(run, partitions[key])
    return [partitions[(for_cluster(run.config.cluster).conf, run.config.cluster.partition)] for run in runs]


def check_fits(run: ComposedRun, part: Partition) -> None:
    """SlurmError with one line when the partition can never run this request."""
    message = refusal(run.plan, run.config.cluster, part)
    if message:
        raise SlurmError(message)


def submit_one(run: ComposedRun, root: Path, sweep_id: Optional[str], part: Optional[Partition] = None,
               files: Optional[Mapping[str, Any]] = None) -> RunRecord:
    """Create the run's directory, submit its job, and record it, all the run's files (:class:`RunWriter`); on
    failure remove the directory. ``files``: more JSON files of the run's, written before its job can start (a
    search trial's trial.json)."""
    with RunWriter(run.config.share_group, root) as writer:
        return _submit_one(run, root, sweep_id, part, files or {}, writer)


def _submit_one(run: ComposedRun, root: Path, sweep_id: Optional[str], part: Optional[Partition],
                files: Mapping[str, Any], writer: RunWriter) -> RunRecord:
    cfg, plan = run.config, run.plan
    run_dir = new_run_dir(run, root)
    try:
        prepare(run, run_dir, writer)
        for file, data in files.items():
            write_json_atomic(run_dir / file, data)
        job_id = submit_job(cfg, plan, run_dir)
    except Exception as err:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise refused(err, run, part, run_dir.name) from None
    record = recorded(run, run_dir, job_id, sweep_id, run_dir / "submitit" / f"{job_id}_submission.sh")
    watch(run_dir, job_id)
    return record


def submit_elements(runs: List[ComposedRun], root: Path, sweep_id: str, part: Optional[Partition]) -> List[RunRecord]:
    """Create the runs' directories and submit them as one job array (launcher/submit/array.py), all the runs'
    files (:class:`RunWriter`); each run's record names its element (``123_4``). On failure every directory is
    removed."""
    cfg, plan = runs[0].config, runs[0].plan
    with RunWriter(cfg.share_group, root) as writer:
        folder = sweep_dir(root, sweep_id)
        run_dirs: List[Path] = []
        try:
            ensure_sweep_dir(root, sweep_id)
            for run in runs:
                run_dirs.append(new_run_dir(run, root))
                prepare(run, run_dirs[-1], writer)
            array_id = submit_array(cfg, plan, sweep_id, run_dirs, folder)
        except Exception as err:
            for run_dir in run_dirs:
                shutil.rmtree(run_dir, ignore_errors=True)
            raise refused(err, runs[0], part, sweep_id) from None
        records = [recorded(run, run_dir, f"{array_id}_{index}", sweep_id, folder / f"{array_id}_submission.sh")
                   for index, (run, run_dir) in enumerate(zip(runs, run_dirs))]
        watch_array(run_dirs, array_id, folder)
        return records


def new_run_dir(run: ComposedRun, root: Path) -> Path:
    """The run's new directory in ``root``, named by ``name=`` or after its model and GPUs."""
    cfg, plan = run.config, run.plan
    try:
        return create_run_dir(root, cfg.name or base_name(plan.model, plan.gpus), explicit=cfg.name is not None)
    except FileExistsError as err:
        raise LaunchError(str(err)) from None


def prepare(run: ComposedRun, run_dir: Path, writer: RunWriter) -> None:
    """Everything of a run's directory its job reads, made by ``writer``: private to its owner (or group), its
    files, its code."""
    writer.own(run_dir)
    write_run_files(run, run_dir)
    freeze(run_dir)  # what the job and its requeues import, whatever happens to the checkout meanwhile
    if stages_code(run.config.cluster):
        pack(run_dir, SOURCE_ROOT)  # the copy compiled, from the checkout's cached bytecode, for every node to copy
    if is_remote(run.config.data.path):
        keep_store_credentials(run_dir)


def keep_store_credentials(run_dir: Path) -> None:
    """The object store's credentials for the tasks, when the secrets store has none (launcher/core/store.py): those
    this shell has (its environment, its profile), kept in a 0600 file of the secrets store, never in the run
    directory or Slurm's job."""
    if any(secret.env in STORE_CREDENTIALS for secret in load_all(secrets_dir())):
        return
    found = login_credentials()
    if found is not None:
        keep_run_credentials(secrets_dir(), run_dir, found.to_json().encode())


def refused(err: Exception, run: ComposedRun, part: Optional[Partition], what: str) -> LaunchError:
    """The one line a failed submission ends the launch with: Slurm's reason, explained where it can be."""
    if isinstance(err, LaunchError):
        return err
    if isinstance(err, SlurmError):
        return LaunchError(explain_rejection(str(err), run.plan, run.config.cluster, part))
    return LaunchError(f"submitting {what} failed: {last_line(err)}")


def recorded(run: ComposedRun, run_dir: Path, job_id: str, sweep_id: Optional[str], script: Path) -> RunRecord:
    """Record the submitted run: its ``sbatch.sh`` (a copy of ``script``), ``run.json`` and its first event."""
    cfg, plan = run.config, run.plan
    shutil.copyfile(script, run_dir / "sbatch.sh")
    record = RunRecord(
        name=run_dir.name, run_dir=str(run_dir), model=plan.model, gpus=plan.gpus, nodes=plan.nodes,
        gpus_per_node=plan.gpus_per_node, steps=cfg.train.steps, cluster=cfg.cluster.name,
        submitted_at=time.time(), job_id=job_id, sweep=sweep_id,
        slurm_conf=slurm_conf_for(cfg.cluster.name, cfg.cluster.slurm_conf), argv=list(sys.argv[1:]),
    )
    save_record(record)
    append_event(run_dir, Submitted(job_id=job_id))
    return record


def write_run_files(run: ComposedRun, run_dir: Path) -> None:
    """Write what a run's tasks read (config.yaml, plan.json) and its run.yaml into ``run_dir``, named after
    the directory. The launch writes every run directory with this, and so do the benchmarks and the GPU
    check, which train without Slurm: what they measure is what a launched run runs."""
    resolved = run.resolved.copy()
    resolved.name = run_dir.name
    resolved.run_root = str(run_dir.parent)
    write_atomic(run_dir / CONFIG, OmegaConf.to_yaml(resolved))
    write_atomic(run_dir / "run.yaml", dump(run.run_file))  # `launcher -f RUN_DIR/run.yaml` runs it again
    write_json_atomic(run_dir / PLAN, run.plan.to_dict())
    write_json_atomic(run_dir / FORECAST, forecast_of(run.config, run.plan).to_dict())  # beside what it measures


def last_line(err: BaseException) -> str:
    """The informative last line of an error (sbatch's complaint inside a longer message)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
