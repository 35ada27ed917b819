"""The launch gate: refuse, before anything is submitted, a run that cannot fit its GPUs' memory, or on
the local cluster this machine's memory (docs/planning.md, "Refusal at launch")."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from launcher.core.config import LOCAL_CLUSTER
from launcher.forecast.advice import MAX_GPUS
from launcher.forecast.disk import checkpoint_room
from launcher.forecast.estimate import Estimate, estimate
from launcher.forecast.learned import corrected_step, correction_for
from launcher.forecast.target import GIB, hardware_for, precision_of
from launcher.forecast.host import host_memory, machine_memory, to_fit


def refusal(est: Estimate, overrides: Sequence[str] = ()) -> str:
    """The one-line reason a launch is refused, with the changes that would fit."""
    fixes = "; or ".join(str(s) for s in est.suggestions) or f"no change found up to {MAX_GPUS} GPUs"
    return f"{est.summary()}; to fit: {fixes}; {_anyway(overrides)}"


def _anyway(overrides: Sequence[str]) -> str:
    """The end of a refusal: force=true, and the ``launcher plan`` command that shows the details."""
    command = " ".join(["launcher plan", *(o for o in overrides if o.split("=", 1)[0] not in ("dry_run", "force"))])
    return f"or add force=true to launch anyway (details: '{command}')"


def _findings(run: Any, machine: Optional[int]) -> Iterator[Tuple[str, str]]:
    """(summary, refusal) for each memory the run does not fit: its GPUs', and on the local cluster this
    machine's RAM, which all of the cluster's nodes and ranks share (forecast/host.py)."""
    cfg = run.config
    hw = hardware_for(cfg.cluster, precision_of(cfg), query_slurm=not cfg.cluster.ssh)  # a remote one: asked there
    if hw.enforce:
        est = estimate(cfg, run.plan, hw)
        if not est.fits:
            yield est.summary(), refusal(est, run.overrides)
        else:
            yield from _measured_need(est, run.overrides)
    if cfg.cluster.name == LOCAL_CLUSTER and machine:
        host = host_memory(cfg, run.plan, machine)
        if not host.fits:
            yield host.summary(), (f"{host.summary()}; to fit: {to_fit(cfg, run.plan, machine)}; "
                                   f"{_anyway(run.overrides)}")


def _measured_need(est: Estimate, overrides: Sequence[str]) -> Iterator[Tuple[str, str]]:
    """(summary, refusal) for a run the formula fits but which, corrected by the cluster's similar completed runs
    that used more memory than the formula said, does not (forecast/learned.py: only ever more cautious). A run
    with ``train.micro_batch=auto`` is left to training, which halves its micro-batch on running out of memory."""
    if est.cfg.train.micro_batch == "auto":
        return
    correction = correction_for(est.cfg, est.plan, est.hardware)
    formula = est.memory.total / GIB
    need = correction.cautious_memory(formula) if correction else None
    if need is None or need <= est.memory.capacity / GIB:
        return
    summary = (f"{est.plan.model} on {est.plan.gpus} GPUs: {correction.memory_line(formula)}, more than the GPU's "
               f"{est.hardware.memory_gib:g} GiB ({est.hardware.memory_source})")
    yield summary, f"{summary}; to fit: more GPUs, a smaller micro-batch or more checkpointing; {_anyway(overrides)}"


def time_budget(run: Any) -> Optional[str]:
    """Why the run cannot finish within its time budget, ``cluster.max_requeues + 1`` time limits, at the
    planned step time, corrected by the cluster's similar completed runs where it has some (forecast/learned.py);
    None if it can, or where no step time is planned (a GPU of unknown type). A warning, not a refusal: the step
    time is an estimate (on the local cluster, of the GPU its CPU ranks stand in for, corrected by what those ranks
    measured), and ``launcher resume`` can continue a run past it."""
    cfg = run.config
    hw = hardware_for(cfg.cluster, precision_of(cfg))
    formula, step_s = corrected_step(cfg, run.plan, hw)
    measured = ", corrected by its cluster's completed runs" if step_s != formula else ""
    attempts, limit_min = cfg.cluster.max_requeues + 1, cfg.cluster.time_limit_min
    if step_s is None or cfg.train.steps * step_s <= attempts * limit_min * 60:
        return None
    return (f"train.steps={cfg.train.steps} at the planned {step_s:.3g} s per step ({hw.gpu_type}{measured}) take "
            f"{cfg.train.steps * step_s / 3600:,.1f} h, more than the {attempts * limit_min / 60:,.1f} h of "
            f"(cluster.max_requeues+1) x cluster.time_limit_min = {attempts} x {limit_min} min: the run would end "
            "unfinished; lower train.steps or raise cluster.max_requeues or cluster.time_limit_min")


def sweep_label(run: Any, runs: Sequence[Any]) -> str:
    """What starts a line about one run of a sweep: its overrides (nothing for a single run)."""
    return f"[{' '.join(run.overrides)}] " if len(runs) > 1 else ""


@dataclass(frozen=True)
class Finding:
    """What a check before submitting found about one run of a launch (``run``: its index): a reason the launch
    is refused (``refuses``), or a warning. The same findings refuse a launch, end a dry run with exit 2 and mark
    a plan's row (launcher/submit/checks.py)."""

    run: int
    text: str
    refuses: bool = True


def fit_findings(index: int, run: Any, machine: Optional[int]) -> List[Finding]:
    """The memory gate and the run's budgets: a run that cannot fit its GPUs' memory, or on the local cluster
    this machine's memory, is refused, unless ``force=true`` (then warned of). A run that cannot finish within its
    time budget, or whose run root cannot hold its checkpoints (forecast/disk.py), is only warned of.

    GPU memory is checked only where it is known (cluster.gpu_memory_gb, the GPU type, or the local cluster's
    documented stand-in)."""
    found = [Finding(index, late, refuses=False) for late in filter(None, [time_budget(run)])]
    for summary, refusal_line in _findings(run, machine):
        found.append(Finding(index, f"{summary}; force=true overrides the refusal", refuses=False) if run.config.force
                     else Finding(index, refusal_line))
    room = checkpoint_room(run.config, run.plan)
    return found + ([Finding(index, room, refuses=False)] if room else [])


def machine_for(runs: Sequence[Any]) -> Optional[int]:
    """This machine's memory where a run goes to the local cluster (whose ranks all share it), else None."""
    return machine_memory() if any(run.config.cluster.name == LOCAL_CLUSTER for run in runs) else None
