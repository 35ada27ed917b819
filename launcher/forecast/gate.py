"""The launch gate: refuse, before anything is submitted, a run that cannot fit its GPUs' memory, or on
the local cluster this machine's memory (docs/planning.md, "Refusal at launch")."""
from __future__ import annotations

from typing import Any, Iterator, List, Optional, Sequence, Tuple

from launcher.core.config import LOCAL_CLUSTER
from launcher.errors import LaunchError
from launcher.forecast.advice import MAX_GPUS
from launcher.forecast.disk import checkpoint_room
from launcher.forecast.estimate import Estimate, estimate
from launcher.forecast.target import Assumptions, hardware_for, precision_of
from launcher.forecast.host import host_memory, machine_memory, to_fit
from launcher.forecast.timing import timing


def refusal(est: Estimate, overrides: Sequence[str] = ()) -> str:
    """The one-line reason a launch is refused, with the changes that would fit."""
    fixes = "; or ".join(str(s) for s in est.suggestions) or f"no change found up to {MAX_GPUS} GPUs"
    return f"{est.summary()}; to fit: {fixes}; {_anyway(overrides)}"


def _anyway(overrides: Sequence[str]) -> str:
    """The end of a refusal: force=true, and the ``launcher plan`` command that shows the details."""
    command = " ".join(["launcher plan", *(o for o in overrides if o.split("=", 1)[0] not in ("dry_run", "force"))])
    return f"or add force=true to launch anyway (details: '{command}')"


def _findings(run: Any, dry_run: bool, machine: Optional[int]) -> Iterator[Tuple[str, str]]:
    """(summary, refusal) for each memory the run does not fit: its GPUs', and on the local cluster this
    machine's RAM, which all of the cluster's nodes and ranks share (forecast/host.py)."""
    cfg = run.config
    hw = hardware_for(cfg.cluster, precision_of(cfg), query_slurm=not dry_run)
    if hw.enforce:
        est = estimate(cfg, run.plan, hw)
        if not est.fits:
            yield est.summary(), refusal(est, run.overrides)
    if cfg.cluster.name == LOCAL_CLUSTER and machine:
        host = host_memory(cfg, run.plan, machine)
        if not host.fits:
            yield host.summary(), (f"{host.summary()}; to fit: {to_fit(cfg, run.plan, machine)}; "
                                   f"{_anyway(run.overrides)}")


def time_budget(run: Any) -> Optional[str]:
    """Why the run cannot finish within its time budget, ``cluster.max_requeues + 1`` time limits, at the
    planned step time; None if it can. A warning, not a refusal: the step time is an estimate (on the local
    cluster, of the GPU its CPU ranks stand in for), and ``launcher resume`` can continue a run past it."""
    cfg = run.config
    hw = hardware_for(cfg.cluster, precision_of(cfg))
    step_s = timing(cfg, run.plan, hw, Assumptions()).step_s
    attempts, limit_min = cfg.cluster.max_requeues + 1, cfg.cluster.time_limit_min
    if cfg.train.steps * step_s <= attempts * limit_min * 60:
        return None
    return (f"train.steps={cfg.train.steps} at the planned {step_s:.3g} s per step ({hw.gpu_type}) take "
            f"{cfg.train.steps * step_s / 3600:,.1f} h, more than the {attempts * limit_min / 60:,.1f} h of "
            f"(cluster.max_requeues+1) x cluster.time_limit_min = {attempts} x {limit_min} min: the run would end "
            "unfinished; lower train.steps or raise cluster.max_requeues or cluster.time_limit_min")


def sweep_label(run: Any, runs: Sequence[Any]) -> str:
    """What starts a line about one run of a sweep: its overrides (nothing for a single run)."""
    return f"[{' '.join(run.overrides)}] " if len(runs) > 1 else ""


def check_launch(runs: Sequence[Any], dry_run: bool) -> List[str]:
    """Refuse (LaunchError) before anything is submitted if a run cannot fit its GPUs' memory, or on the
    local cluster this machine's memory.

    GPU memory is checked only where it is known (cluster.gpu_memory_gb, the GPU type, or the local
    cluster's documented stand-in). A run that cannot finish within its time budget, whose run root cannot
    hold its checkpoints (forecast/disk.py), is only warned of. A run with ``force=true`` passes with a warning;
    in a dry run nothing is refused, and the warnings say what a launch would do. Returns the warnings (the
    caller prints them to stderr).
    """
    warnings, refused = [], []  # refused: each refused run's first reason
    machine = machine_memory() if any(run.config.cluster.name == LOCAL_CLUSTER for run in runs) else None
    for run in runs:
        label = sweep_label(run, runs)
        late = time_budget(run)
        if late:
            warnings.append(label + late)
        reasons = []
        for summary, refusal_line in _findings(run, dry_run, machine):
            if run.config.force:
                warnings.append(f"{label}{summary}; force=true: " + ("a launch would go ahead" if dry_run
                                                                     else "launching anyway"))
            elif dry_run:
                warnings.append(f"{label}{summary}; a launch would be refused (force=true overrides)")
            else:
                reasons.append(label + refusal_line)
        refused += reasons[:1]
        room = checkpoint_room(run.config, run.plan)
        if room:
            warnings.append(label + room)
    if refused:
        more = f" ({len(refused)} of {len(runs)} runs do not fit; nothing was submitted)" if len(runs) > 1 else ""
        raise LaunchError(refused[0] + more)
    return warnings
