"""The launch gate: refuse, before anything is submitted, a run that cannot fit its GPUs' memory
(docs/planning.md, "Refusal at launch")."""
from __future__ import annotations

from typing import Any, List, Sequence

from launcher.errors import LaunchError
from launcher.planning.advice import MAX_GPUS
from launcher.planning.estimate import Estimate, estimate
from launcher.planning.hardware import hardware_for, precision_of


def refusal(est: Estimate, overrides: Sequence[str] = ()) -> str:
    """The one-line reason a launch is refused, with the changes that would fit."""
    fixes = "; or ".join(str(s) for s in est.suggestions) or f"no change found up to {MAX_GPUS} GPUs"
    command = " ".join(["launcher plan", *(o for o in overrides if o.split("=", 1)[0] not in ("dry_run", "force"))])
    return f"{est.summary()}; to fit: {fixes}; or add force=true to launch anyway (details: '{command}')"


def check_launch(runs: Sequence[Any], dry_run: bool) -> List[str]:
    """Refuse (LaunchError) before anything is submitted if a run cannot fit its GPUs' memory.

    Checked only where the memory is known (cluster.gpu_memory_gb, the GPU type, or the local
    cluster's documented stand-in). A run with ``force=true`` passes with a warning; in a dry run
    nothing is refused, and the warnings say what a launch would do. Returns the warnings (the
    caller prints them to stderr).
    """
    warnings, refused = [], []
    for run in runs:
        cfg = run.config
        hw = hardware_for(cfg.cluster, precision_of(cfg), query_slurm=not dry_run)
        if not hw.enforce:
            continue
        est = estimate(cfg, run.plan, hw)
        if est.fits:
            continue
        label = f"[{' '.join(run.overrides)}] " if len(runs) > 1 else ""
        if cfg.force:
            warnings.append(f"{label}{est.summary()}; force=true: " + ("a launch would go ahead" if dry_run
                                                                       else "launching anyway"))
        elif dry_run:
            warnings.append(f"{label}{est.summary()}; a launch would be refused (force=true overrides)")
        else:
            refused.append(label + refusal(est, run.overrides))
    if refused:
        more = f" ({len(refused)} of {len(runs)} runs do not fit; nothing was submitted)" if len(runs) > 1 else ""
        raise LaunchError(refused[0] + more)
    return warnings
