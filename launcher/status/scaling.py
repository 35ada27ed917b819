"""How fast runs trained and how they scaled, from their own ``metrics.jsonl``, ``run.json`` and ``config.yaml``:
the figures ``launcher compare`` tabulates and plots.

- step time: the median over log intervals, leaving out the first (warm-up, compilation) when there are
  others; tokens/s, tokens/s/GPU and MFU are taken at that same median step time (what an interval does
  per step, divided by it), so tokens/s x step time is exactly the tokens of one step;
- MFU: none, with the reason, where training measured none (a CPU has no peak FLOP/s to divide by);
- speedup: tokens/s against the run of the same model with the fewest GPUs; scaling efficiency is the
  speedup divided by the GPU ratio (1.0 is linear scaling);
- time to the same step: the training time each run needed to reach the highest step all runs reached.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from launcher.core.damage import DamagedRun, read_yaml_mapping
from launcher.core.metrics import FinalRow, Row
from launcher.core.rundir import CONFIG, read_metrics
from launcher.core.run_index import RunRecord
from launcher.status.job_state import job_states


LOCAL_HARDWARE = "local cluster: CPU processes stand in for GPUs"


@dataclass
class RunStats:
    name: str
    model: str
    gpus: int
    nodes: int
    status: str
    steps_done: int
    steps_total: int
    median_step_time: Optional[float]
    tokens_per_step: Optional[float]
    tokens_per_s: Optional[float]
    tokens_per_s_per_gpu: Optional[float]
    mfu: Optional[float]
    mfu_note: Optional[str]  # why mfu is None
    final_loss: Optional[float]
    hardware: str
    sweep: Optional[str]
    time_to_common_step: Optional[float] = None
    speedup: Optional[float] = None
    scaling_efficiency: Optional[float] = None
    loss_curve: List[List[float]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status == "COMPLETED"


@dataclass(frozen=True)
class TrainedOn:
    """What a run trained on, as far as its record and config.yaml tell."""

    cluster: str
    gpu_type: Optional[str]

    @classmethod
    def of(cls, rec: RunRecord) -> "TrainedOn":
        try:
            cluster = read_yaml_mapping(Path(rec.run_dir), CONFIG).get("cluster")
        except DamagedRun:  # the GPU type is then not known, as for a config that does not name it
            cluster = None
        return cls(rec.cluster, cluster.get("gpu_type") if isinstance(cluster, dict) else None)

    @property
    def local(self) -> bool:
        return self.cluster == "local" and not self.gpu_type

    def describe(self, mfu_measured: bool = False) -> str:
        """For a title: the cluster and GPU type; on the local cluster, whether its "GPUs" were CPU processes
        (no MFU measured) or the machine's real GPUs (training found their peak FLOP/s)."""
        if self.local:
            return "local cluster: real GPUs" if mfu_measured else LOCAL_HARDWARE
        return f"cluster {self.cluster}: " + (f"{self.gpu_type} GPUs" if self.gpu_type else "GPU type not set")

    def mfu_missing(self) -> str:
        """Why training reported no MFU: it does only where the device's peak FLOP/s is known."""
        if self.local:
            return "on the local cluster CPU processes stand in for GPUs, and a CPU has no peak FLOP/s to divide by"
        return ("no peak FLOP/s known for the device it trained on (a CPU, or a GPU missing from "
                "launcher/core/gpus.py)")


def intervals(rows: List[Row]) -> List[tuple[int, int, Row]]:
    """(first step, last step, row) of each log interval, in order."""
    out, prev = [], 0
    for row in rows:
        out.append((prev, row.step, row))
        prev = row.step
    return out


def steady(rows: List[Row]) -> List[Row]:
    return rows[1:] if len(rows) > 1 else rows


RATES = ("tokens_per_s", "tokens_per_s_per_gpu", "mfu")


def median_figures(logged: List[Row]) -> Dict[str, Optional[float]]:
    """The median step time of the steady intervals, and every rate at that step time.

    A rate times its interval's step time is what one step does (tokens, or a share of peak FLOPs), the
    same in every interval; dividing it by the median step time makes the columns agree exactly, where
    a median of each column on its own would not (nor would a whole-run mean beside a median)."""
    rows = steady(logged)
    if not rows:
        return {"median_step_time": None, "tokens_per_step": None, **{key: None for key in RATES}}
    step_time = statistics.median(r.step_time for r in rows)
    per_step = {key: [r.value(key) * r.step_time for r in rows if r.value(key) is not None] for key in RATES}
    figures = {key: statistics.median(v) / step_time if v else None for key, v in per_step.items()}
    tokens = statistics.median(per_step["tokens_per_s"]) if per_step["tokens_per_s"] else None
    return {"median_step_time": step_time, "tokens_per_step": tokens, **figures}


def stats_of(rec: RunRecord, status: str) -> tuple[RunStats, List[Row]]:
    """The run's figures, and its interval rows (for the time to a step)."""
    rows = read_metrics(Path(rec.run_dir))
    final = next((r for r in rows if isinstance(r, FinalRow)), None)
    logged = [r for r in rows if not isinstance(r, FinalRow) and r.step_time]
    last = final or (logged[-1] if logged else None)
    figures = median_figures(logged)
    hardware = TrainedOn.of(rec)
    note = None
    if figures["mfu"] is None:
        note = hardware.mfu_missing() if logged else "no metrics logged yet"
    return RunStats(
        name=rec.name, model=rec.model, gpus=rec.gpus, nodes=rec.nodes, status=status,
        steps_done=last.step if last else 0, steps_total=rec.steps, **figures, mfu_note=note,
        final_loss=last.loss if last else None, hardware=hardware.describe(figures["mfu"] is not None),
        sweep=rec.sweep, loss_curve=[[r.step, r.loss] for r in logged if r.loss is not None],
    ), logged


def time_to_step(logged: List[Row], step: int) -> Optional[float]:
    """Training seconds to reach ``step``, from the intervals' mean step times."""
    total = 0.0
    for first, last, row in intervals(logged):
        if first >= step:
            break
        total += (min(last, step) - first) * row.step_time
    return total if logged and logged[-1].step >= step else None


def compare(records: List[RunRecord]) -> List[RunStats]:
    states = job_states(records)
    pairs = [stats_of(rec, states[rec.name].state) for rec in records]
    common = min((s.steps_done for s, _ in pairs), default=0)
    for s, logged in pairs:
        s.time_to_common_step = time_to_step(logged, common) if common else None
    stats = [s for s, _ in pairs]
    for s in stats:
        same = [o for o in stats if o.model == s.model and o.tokens_per_s]
        base = min(same, key=lambda o: (o.gpus, o.name), default=None)
        if base is not None and s.tokens_per_s:
            s.speedup = s.tokens_per_s / base.tokens_per_s
            s.scaling_efficiency = s.speedup / (s.gpus / base.gpus)
    return sorted(stats, key=lambda s: (s.model, s.gpus, s.name))
