"""Value checks the typed schema cannot express.

The dataclasses in launcher/core/config.py catch wrong types; this module catches
wrong values (an unknown sharding mode, a zero batch, a run name that is not
safe as a directory and job name) with a one-line message naming the key.
"""
from __future__ import annotations

import re
from operator import attrgetter

from launcher.core.config import CHOICES, RunConfig
from launcher.errors import LaunchError, did_you_mean

# Run names become directory names, Slurm job names and #SBATCH values.
RUN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")

POSITIVE = (
    "model.d_model", "model.n_heads", "model.n_layers", "model.seq_len", "model.vocab_size", "model.mlp_ratio",
    "layout.gpus", "layout.nodes", "train.steps", "train.global_batch", "train.batch_per_gpu",
    "cluster.gpus_per_node", "cluster.cpus_per_gpu", "cluster.time_limit_min",
)  # fmt: skip


def check_run_name(name: str) -> None:
    if not RUN_NAME.fullmatch(name):  # fullmatch: '$' would accept a trailing newline
        raise LaunchError(
            f"invalid run name {name!r}: use 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
        )


def validate(cfg: RunConfig) -> None:
    """Raise LaunchError for the first value that is out of range."""
    if cfg.name is not None:
        check_run_name(cfg.name)
    for key, allowed in CHOICES.items():
        value = attrgetter(key)(cfg)
        if value not in allowed:
            hint = did_you_mean(str(value), allowed)
            raise LaunchError(f"{key} must be one of {', '.join(allowed)}; got '{value}'{hint}")
    for key in POSITIVE:
        value = attrgetter(key)(cfg)
        if value is not None and value <= 0:
            raise LaunchError(f"{key} must be positive, got {value}")
    micro = cfg.train.micro_batch
    if micro != "auto" and (not _is_int(micro) or micro <= 0):
        raise LaunchError(f"train.micro_batch must be a positive integer or auto, got '{micro}'")
    if not (cfg.dry_run is True or cfg.dry_run is False or cfg.dry_run == "json"):
        raise LaunchError(f"dry_run must be false, true or json; got '{cfg.dry_run}'")
    limit_s, delay_s = cfg.cluster.time_limit_min * 60, cfg.cluster.signal_delay_s
    if limit_s <= delay_s:
        raise LaunchError(f"cluster.time_limit_min={cfg.cluster.time_limit_min} ({limit_s} s) leaves no time to train: "
                          f"the checkpoint signal comes cluster.signal_delay_s={delay_s} s before the limit; "
                          "raise the time limit or lower the delay")
    if cfg.model.d_model % cfg.model.n_heads:
        raise LaunchError(f"model.d_model={cfg.model.d_model} is not divisible by model.n_heads={cfg.model.n_heads}")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
