"""The values each setting allows beyond its type: the choices of the string settings and the range of every
numeric one. Composition checks them (launcher/compose/validate.py) and docs/configuration.md lists them
(tests/unit/test_config_values.py keeps the two equal). The types themselves are launcher/core/config.py's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, Optional

from launcher.core.config import (CHECKPOINTING, DIRECTIONS, PRECISIONS, PRUNERS, SEARCH_BACKENDS, SHARDINGS,
                                  TRACKER_PACKAGES, WANDB_MODES)


CHOICES = {
    "parallel.sharding": SHARDINGS,
    "parallel.activation_checkpointing": CHECKPOINTING,
    "parallel.precision": PRECISIONS,
    "tracking.backend": tuple(TRACKER_PACKAGES),
    "tracking.mode": WANDB_MODES,
    "search.backend": SEARCH_BACKENDS,
    "search.direction": DIRECTIONS,
    "search.pruner": PRUNERS,
}


@dataclass(frozen=True)
class Range:
    """The values a numeric setting allows: finite, from ``low`` to ``high`` (None: unbounded), an ``open``
    end excluded. ``zero``: what 0 means, where 0 is allowed and means something other than a size."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    zero: str = ""

    def allows(self, value: float) -> bool:
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if self.low is not None and (value < self.low or (value == self.low and self.low_open)):
            return False
        return self.high is None or value < self.high or (value == self.high and not self.high_open)

    def __str__(self) -> str:
        if self.low is not None and self.high is not None:
            text = f"in {'(['[not self.low_open]}{self.low:,}, {self.high:,}{')]'[not self.high_open]}"
        else:
            text = f"{'>' if self.low_open else '>='} {self.low:,}"
        return f"{text} ({self.zero})" if self.zero else text


AT_LEAST_1, POSITIVE, FRACTION = Range(1), Range(0, low_open=True), Range(0, 1, high_open=True)


# Beyond any run ever made (about 10^6 steps), so that a typo such as 10^23 is refused, not run for ever.
MAX_STEPS = 10_000_000


# Every numeric setting's allowed values, checked at composition (launcher/compose/validate.py), listed in
# docs/configuration.md (tests/unit/test_config_values.py keeps the two equal). A null value is not checked.
RANGES: Dict[str, Range] = {
    **{f"model.{key}": AT_LEAST_1 for key in ("d_model", "n_heads", "n_layers", "seq_len", "vocab_size", "mlp_ratio")},
    "layout.gpus": AT_LEAST_1,
    "layout.nodes": AT_LEAST_1,
    "train.steps": Range(1, MAX_STEPS),
    "train.global_batch": AT_LEAST_1,
    "train.batch_per_gpu": AT_LEAST_1,
    "train.lr": POSITIVE,
    "train.min_lr_ratio": Range(0, 1),
    "train.warmup_steps": Range(0, zero="0: no warmup, the full learning rate from the first step"),
    "train.weight_decay": Range(0, zero="0: no weight decay"),
    "train.beta1": FRACTION,
    "train.beta2": FRACTION,
    "train.grad_clip": POSITIVE,
    "train.seed": Range(0, 2**32 - 1),  # numpy's seeds are 32-bit
    "train.log_every": AT_LEAST_1,
    "train.eval_every": Range(0, zero="0: no evaluation"),
    "train.eval_batches": AT_LEAST_1,
    "train.checkpoint_every": Range(0, zero="0: saved only at a time-limit or preemption signal and at the end, "
                                            "so a failure loses every step since"),
    "train.keep_checkpoints": AT_LEAST_1,
    "train.export_every": Range(0, zero="0: no export while training"),
    "train.stall_timeout_s": POSITIVE,
    "train.preflight_timeout_s": POSITIVE,
    "data.val_fraction": Range(0, 1, high_open=True, zero="0: no validation split; needs train.eval_every=0"),
    "data.store.retry_s": POSITIVE,
    "data.store.stall_s": POSITIVE,
    "data.stream_cache_gb": POSITIVE,
    "data.stream_window": AT_LEAST_1,
    "data.read_ahead": Range(0, zero="0: a shard is fetched when a step needs it"),
    "data.stream_connections": AT_LEAST_1,
    "cluster.gpus_per_node": AT_LEAST_1,
    "cluster.gpu_memory_gb": POSITIVE,
    "cluster.cpus_per_gpu": AT_LEAST_1,
    "cluster.time_limit_min": AT_LEAST_1,
    "cluster.signal_delay_s": Range(0, zero="0: the signal comes with the time limit's SIGTERM: a save only if it "
                                            "fits in Slurm's KillWait"),
    "cluster.max_requeues": Range(0, zero="0: a preemption or time limit ends the run"),
    "cluster.max_retries": Range(0, zero="0: a failed attempt is not retried"),
    "cluster.ssh_timeout_s": POSITIVE,
    "cluster.store.retry_s": POSITIVE,
    "cluster.store.stall_s": POSITIVE,
    "sweep.parallel": AT_LEAST_1,
    "search.trials": Range(1, 10_000),
    "search.parallel": AT_LEAST_1,
    "search.max_failures": Range(0, zero="0: the first failed trial ends the search"),
    "search.startup_trials": Range(0, zero="0: any trial may be pruned"),
}
