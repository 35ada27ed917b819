"""Model FLOPs utilisation and the metrics rows of a run (their types: launcher/core/metrics.py).

MFU follows the convention stated once in launcher/core/gpus.py, which the planner's predicted
MFU follows too, so the two can be set beside each other and beside the public reference numbers.
"""
from __future__ import annotations

import logging
import resource
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from launcher.core import gpus
from launcher.core.metrics import FinalRow, Row
from launcher.core.rundir import append_metrics
from launcher.train.tracking import Tracker

log = logging.getLogger(__name__)

# Each scalar of a metrics row, by its key in metrics.jsonl: its curve in an experiment tracker
# (launcher/train/tracking.py) and its log-line form.
SCALARS = {
    "loss": ("train/loss", "loss {:.4f}"),
    "eval_loss": ("eval/loss", "eval {:.4f}"),
    "lr": ("train/lr", "lr {:.2e}"),
    "grad_norm": ("train/grad_norm", "grad {:.3f}"),
    "step_time": ("perf/step_time_s", "{:.3f} s/step"),
    "tokens_per_s": ("perf/tokens_per_s", "{:,.0f} tok/s"),
    "tokens_per_s_per_gpu": ("perf/tokens_per_s_per_gpu", "{:,.0f} tok/s/gpu"),
    "mfu": ("perf/mfu", "mfu {:.1%}"),
    "peak_mem_gb": ("system/peak_mem_gb", "mem {:.2f} GB"),
}

def peak_flops(device: torch.device, precision: str = "bf16") -> float | None:
    """The device's dense peak FLOP/s in ``precision`` from the GPU table the planner uses
    (launcher/core/gpus.py), or None where unknown (any CPU, a GPU the table lacks)."""
    if device.type != "cuda":
        return None
    return gpus.peak_flops(torch.cuda.get_device_name(device), precision)


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated by this process, or on CPU its peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 1e9
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return rss / 1e9 if sys.platform == "darwin" else rss * 1024 / 1e9


def throughput(tokens: int, seconds: float, world_size: int, flops_per_tok: int,
               peak: float | None) -> dict[str, float | None]:
    """Tokens/s overall and per GPU, and MFU (None without a known peak)."""
    per_s = tokens / seconds
    per_gpu = per_s / world_size
    return {"tokens_per_s": per_s, "tokens_per_s_per_gpu": per_gpu,
            "mfu": per_gpu * flops_per_tok / peak if peak else None}


class MetricsLog:
    """Writes rows to ``metrics.jsonl``, as one line to the log and, but for the final summary (which
    repeats the last step), to the experiment tracker; a no-op where ``path`` is None.

    Only rank 0 gets a path and a tracker: every rank holds the same all-reduced values.
    """

    def __init__(self, path: Path | None, tracker: Tracker | None = None):
        self.path = path
        self.tracker = tracker or Tracker()

    def write(self, row: Row) -> None:
        if self.path is None:
            return
        append_metrics(self.path, replace(row, time=round(time.time(), 3)))  # when: goodput's timeline
        log.info("%s", format_row(row))
        if not isinstance(row, FinalRow):
            self.tracker.log(row.step, {curve: row.value(key) for key, (curve, _) in SCALARS.items()
                                        if row.value(key) is not None})

    def close(self) -> None:
        self.tracker.close()


def format_row(row: Row) -> str:
    """One human line: ``step 40 | loss 3.2100 | ... | mfu 41.2%``; absent values are left out."""
    head = "final" if isinstance(row, FinalRow) else "step"
    parts = [f"{head} {row.step}"] + [fmt.format(row.value(key)) for key, (_, fmt) in SCALARS.items()
                                      if row.value(key) is not None]
    return " | ".join(parts)
