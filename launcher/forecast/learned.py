"""What a cluster's completed runs teach the forecast: the ratio of what they measured to what the formulas said,
applied to a new run of a similar shape, and how far off each forecast was (``launcher plan --accuracy``).

A run's forecast is written at its launch (:func:`forecast_of`, ``forecast.json``) and kept beside its measurement
when it completes (launcher/core/measured.py). A run is similar to the one planned when it ran on the same cluster
and GPU type and its model is within a factor of :data:`SIMILAR_SIZE` of the size in parameters. The corrected
figure is the formula's times the mean of the similar runs' measured/formula ratios (docs/planning.md).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from launcher.core.config import RunConfig
from launcher.core.measured import Forecast, Measured, measured_clusters, measured_path, read_measured
from launcher.core.plan import Plan
from launcher.forecast.memory import memory
from launcher.forecast.target import GIB, Assumptions, TargetGpu, hardware_for, precision_of
from launcher.forecast.timing import timing

SIMILAR_SIZE = 2.0  # a model within this factor of the planned one's parameters is of a similar shape


@dataclass(frozen=True)
class Ratio:
    """measured/formula over the similar runs: its mean (the correction), standard deviation and number of runs."""

    mean: float
    spread: float
    runs: int

    @classmethod
    def of(cls, ratios: Sequence[float]) -> Optional[Ratio]:
        if not ratios:
            return None
        import statistics  # lazy: a launch whose cluster has no similar runs does without it (and its fractions)

        return cls(statistics.fmean(ratios), statistics.stdev(ratios) if len(ratios) > 1 else 0.0, len(ratios))


@dataclass(frozen=True)
class Correction:
    """What the similar runs of a cluster say of the formulas: the ratio for step time and for memory per GPU
    (None where none of them measured it), and whether their ranks ran on CPUs (the local cluster's stand-in)."""

    step: Optional[Ratio]
    memory: Optional[Ratio]
    stand_in: bool = False

    def step_time(self, formula: Optional[float]) -> Optional[float]:
        return formula * self.step.mean if formula is not None and self.step else formula

    def memory_gib(self, formula: float) -> float:
        return formula * self.memory.mean if self.memory else formula

    def cautious_memory(self, formula: float) -> Optional[float]:
        """The memory the launch gate checks where the measured runs used more than the formula said: the corrected
        figure when their ratio is above 1, on real GPUs; None otherwise (the formula stands: a measurement never
        lets through a run the formula refuses, and a CPU's resident memory says nothing of a GPU's)."""
        if self.stand_in or self.memory is None or self.memory.mean <= 1:
            return None
        return self.memory_gib(formula)

    def lines(self, step_formula: Optional[float], memory_gib: float) -> List[str]:
        """``step time 0.42 s (formula 0.51 s, corrected by 7 runs on this cluster: measured/formula 0.82 +- 0.05)``,
        and the same of memory per GPU."""
        lines = [line for line in (self.step_line(step_formula), self.memory_line(memory_gib)) if line]
        if lines and self.stand_in:
            lines.append("(measured on this cluster's CPU ranks, which stand in for the GPU: a CPU's step time "
                         "and resident memory)")
        return lines

    def step_line(self, formula: Optional[float]) -> Optional[str]:
        if self.step is None or formula is None:
            return None
        return f"step time {seconds(self.step_time(formula))} (formula {seconds(formula)}, {_by(self.step)})"

    def memory_line(self, formula: float) -> Optional[str]:
        if self.memory is None:
            return None
        return (f"memory per GPU {self.memory_gib(formula):,.2f} GiB (formula {formula:,.2f} GiB, "
                f"{_by(self.memory)})")

    def to_dict(self, step_formula: Optional[float], memory_gib: float) -> Dict[str, Any]:
        return {"step_time_s": self.step_time(step_formula), "mem_per_gpu_gib": self.memory_gib(memory_gib),
                "step_ratio": _dict(self.step), "memory_ratio": _dict(self.memory), "stand_in": self.stand_in}


def _dict(ratio: Optional[Ratio]) -> Optional[Dict[str, Any]]:
    return dataclasses.asdict(ratio) if ratio else None


def _by(ratio: Ratio) -> str:
    runs = f"{ratio.runs} run{'s' if ratio.runs > 1 else ''}"
    return f"corrected by {runs} on this cluster: measured/formula {ratio.mean:,.2f} +- {ratio.spread:,.2f}"


def seconds(value: Optional[float]) -> str:
    """A step time in three figures: ``0.42 s``, ``42.1 ms``, ``0.0123 ms`` (a tiny model's on an H100)."""
    if value is None:
        return "-"
    return f"{value:,.3g} s" if value >= 0.1 else f"{value * 1e3:.3g} ms"


def forecast_of(cfg: RunConfig, plan: Plan, hw: Optional[TargetGpu] = None) -> Forecast:
    """The forecast a launch keeps in the run's directory: the planner's figures on the run's cluster's GPU (``hw``,
    where the caller has asked for it already)."""
    hw = hardware_for(cfg.cluster, precision_of(cfg), query_slurm=not cfg.cluster.ssh) if hw is None else hw
    t = timing(cfg, plan, hw, Assumptions())
    return Forecast(cluster=cfg.cluster.name, gpu=hw.gpu_type, stand_in=hw.stand_in, model=plan.model,
                    params=plan.params, gpus=plan.gpus, step_time_s=t.step_s,
                    mem_per_gpu_gib=memory(cfg, plan, hw, Assumptions()).total / GIB,
                    tokens_per_s=t.tokens_per_s_per_gpu * plan.gpus if t.tokens_per_s_per_gpu else None)


def similar(runs: Sequence[Measured], gpu: str, params: int) -> List[Measured]:
    """The runs of the same GPU type whose model is within a factor of :data:`SIMILAR_SIZE` of ``params``."""
    return [m for m in runs if m.forecast.gpu == gpu
            and 1 / SIMILAR_SIZE <= m.forecast.params / max(1, params) <= SIMILAR_SIZE]


def _ratios(runs: Sequence[Measured], measured: Callable[[Measured], Optional[float]],
            formula: Callable[[Forecast], Optional[float]]) -> List[float]:
    pairs = [(measured(m), formula(m.forecast)) for m in runs]
    return [got / said for got, said in pairs if got is not None and said]


def learned(runs: Sequence[Measured], gpu: str, params: int, stand_in: bool) -> Optional[Correction]:
    """The correction the similar runs among ``runs`` give; None where there is none."""
    alike = similar(runs, gpu, params)
    step = Ratio.of(_ratios(alike, lambda m: m.step_time_s, lambda f: f.step_time_s))
    mem = Ratio.of(_ratios(alike, lambda m: m.peak_mem_gib, lambda f: f.mem_per_gpu_gib))
    return Correction(step, mem, stand_in) if step or mem else None


def correction_for(cfg: RunConfig, plan: Plan, hw: TargetGpu) -> Optional[Correction]:
    """What the cluster's completed runs in the run's root say of this run's forecast; None where they say nothing
    (no similar run, or a cluster reached over SSH, whose runs' file is on that cluster)."""
    if cfg.cluster.ssh:
        return None
    root = Path(os.path.expanduser(cfg.run_root))
    return learned(_read(root, cfg.cluster.name), hw.gpu_type, plan.params, hw.stand_in)


class StepTime(NamedTuple):
    """A plan's seconds per step on a GPU: the formula's (forecast/timing.py) and the one corrected by the cluster's
    similar completed runs (the formula's where they say nothing); both None where the GPU's speed is not known."""

    formula: Optional[float]
    corrected: Optional[float]


def corrected_step(cfg: RunConfig, plan: Plan, hw: TargetGpu) -> StepTime:
    """The plan's step time on ``hw``, the formula's and as the run's cluster's similar completed runs correct it
    (:func:`correction_for`)."""
    formula = timing(cfg, plan, hw, Assumptions()).step_s
    correction = correction_for(cfg, plan, hw)
    return StepTime(formula, correction.step_time(formula) if correction is not None else formula)


def measured_lines(cfg: RunConfig, plan: Plan) -> List[str]:
    """What a dry run says below a run's plan: its step time and memory per GPU corrected by the cluster's similar
    completed runs, the formulas' beside them (:meth:`Correction.lines`); nothing without such runs."""
    hw = hardware_for(cfg.cluster, precision_of(cfg), query_slurm=not cfg.cluster.ssh)
    correction = correction_for(cfg, plan, hw)
    if correction is None:
        return []
    forecast = forecast_of(cfg, plan, hw)
    return correction.lines(forecast.step_time_s, forecast.mem_per_gpu_gib)


_READ: Dict[Tuple[Path, str], Tuple[Tuple[int, int], List[Measured]]] = {}


def _read(root: Path, cluster: str) -> List[Measured]:
    """The cluster's completed runs, read once per process while the file stays as it was (a sweep's runs and the
    launch gate ask for the same file)."""
    path = measured_path(root, cluster)
    try:
        info = os.lstat(path) if path else None
    except OSError:  # no run of the cluster completed in this root yet
        return []
    if info is None:
        return []
    key, stamp = (root, cluster), (info.st_mtime_ns, info.st_size)
    if key not in _READ or _READ[key][0] != stamp:
        _READ[key] = (stamp, read_measured(root, cluster))
    return _READ[key][1]


@dataclass(frozen=True)
class Error:
    """One figure of one run: the formula's forecast, the corrected one (leave-one-out: from the similar runs that
    completed before it; the formula's where none did), what it measured, and each forecast's error
    (forecast/measured - 1: above 0, the forecast was high)."""

    formula: float
    corrected: float
    measured: float
    ratio: Optional[Ratio]

    @property
    def before(self) -> float:
        return self.formula / self.measured - 1

    @property
    def after(self) -> float:
        return self.corrected / self.measured - 1

    def to_dict(self) -> Dict[str, Any]:
        return {"formula": self.formula, "corrected": self.corrected, "measured": self.measured,
                "error_before": self.before, "error_after": self.after,
                "ratio": _dict(self.ratio)}


@dataclass(frozen=True)
class RunAccuracy:
    """How far one completed run's forecasts were from what it measured."""

    run: Measured
    step: Optional[Error]
    memory: Optional[Error]

    @property
    def over_memory(self) -> bool:
        """Whether it used more memory than the formula said: the run that would have run out of memory on a
        bigger layout, filled to what the formula allowed."""
        return self.memory is not None and self.memory.measured > self.memory.formula

    def to_dict(self) -> Dict[str, Any]:
        f = self.run.forecast
        return {"run": self.run.run, "finished": self.run.finished, "model": f.model, "params": f.params,
                "gpus": f.gpus, "gpu": f.gpu, "over_memory": self.over_memory,
                "step_time_s": self.step.to_dict() if self.step else None,
                "mem_per_gpu_gib": self.memory.to_dict() if self.memory else None,
                "tokens_per_s": {"formula": f.tokens_per_s, "measured": self.run.tokens_per_s}}


@dataclass(frozen=True)
class Summary:
    """The median and the worst (the largest in size, with its sign) of a figure's errors over a cluster's runs,
    before and after the correction."""

    median_before: float
    worst_before: float
    median_after: float
    worst_after: float

    @classmethod
    def of(cls, errors: Sequence[Error]) -> Summary:
        """The summary of one or more errors."""
        import statistics  # lazy: as above

        before, after = [e.before for e in errors], [e.after for e in errors]
        return cls(statistics.median(map(abs, before)), max(before, key=abs),
                   statistics.median(map(abs, after)), max(after, key=abs))


@dataclass(frozen=True)
class ClusterAccuracy:
    """A cluster's completed runs, those that used more memory than the formula said first, then as they
    completed, and the summary of their errors."""

    cluster: str
    runs: List[RunAccuracy]

    @property
    def step(self) -> Optional[Summary]:
        errors = [r.step for r in self.runs if r.step]
        return Summary.of(errors) if errors else None

    @property
    def memory(self) -> Optional[Summary]:
        errors = [r.memory for r in self.runs if r.memory]
        return Summary.of(errors) if errors else None

    def to_dict(self) -> Dict[str, Any]:
        step, mem = self.step, self.memory
        return {"cluster": self.cluster, "runs": [r.to_dict() for r in self.runs],
                "step_time_s": dataclasses.asdict(step) if step else None,
                "mem_per_gpu_gib": dataclasses.asdict(mem) if mem else None}


def _error(formula: Optional[float], measured: Optional[float], ratio: Optional[Ratio]) -> Optional[Error]:
    if not formula or not measured:
        return None
    return Error(formula, formula * ratio.mean if ratio else formula, measured, ratio)


def accuracy(cluster: str, runs: Sequence[Measured]) -> ClusterAccuracy:
    """Each of a cluster's completed runs (in the order they completed) against its forecasts, corrected by the
    similar runs that completed before it only."""
    rows = []
    for index, run in enumerate(runs):
        f = run.forecast
        before = learned(runs[:index], f.gpu, f.params, f.stand_in) or Correction(None, None)
        rows.append(RunAccuracy(run, _error(f.step_time_s, run.step_time_s, before.step),
                                _error(f.mem_per_gpu_gib, run.peak_mem_gib, before.memory)))
    return ClusterAccuracy(cluster, sorted(rows, key=lambda r: not r.over_memory))


def accuracies(roots: Sequence[Path], cluster: Optional[str] = None) -> List[ClusterAccuracy]:
    """Every cluster's completed runs in ``roots`` (or ``cluster``'s alone) against their forecasts, by cluster."""
    by_cluster: Dict[str, List[Measured]] = {}
    for root in dict.fromkeys(roots):
        for name in measured_clusters(root):
            if cluster in (None, name):
                by_cluster.setdefault(name, []).extend(read_measured(root, name))
    return [accuracy(name, sorted(runs, key=lambda m: m.finished)) for name, runs in sorted(by_cluster.items())]

