"""Value checks the typed schema cannot express.

The dataclasses in launcher/core/config.py catch wrong types; this module catches
wrong values (an unknown sharding mode, a zero batch, a negative or non-finite
number, an empty or multi-line string, a run name that is not safe as a directory
and job name) with a one-line message naming the key and what it allows, so that
no bad value costs a queue wait and GPU hours before it fails on a node.
"""
from __future__ import annotations

import dataclasses
import math
import re
from operator import attrgetter
from typing import Any, Iterator, Tuple

from launcher.core import preemption
from launcher.core.config import RunConfig
from launcher.core.privacy import group_id
from launcher.compose.ranges import CHOICES, RANGES
from launcher.errors import LaunchError, did_you_mean
from launcher.slurm.batch import check_run_name

# No value has a use for these: a newline in a log line, an sbatch script or a job name splits it in two.
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# The least time an attempt must have before its checkpoint signal can come: start, resume, train a step.
MIN_ATTEMPT_S = 30


def validate(cfg: RunConfig) -> None:
    """Raise LaunchError for the first value that is out of range."""
    if cfg.name is not None:
        check_run_name(cfg.name)
    for key, allowed in CHOICES.items():
        value = attrgetter(key)(cfg)
        if value not in allowed:
            hint = did_you_mean(str(value), allowed)
            raise LaunchError(f"{key} must be one of {', '.join(allowed)}; got '{value}'{hint}")
    for key, value in leaves(cfg):
        check_value(key, value)
    micro = cfg.train.micro_batch
    if micro != "auto" and (not _is_int(micro) or micro <= 0):
        raise LaunchError(f"train.micro_batch must be a positive integer or auto, got '{micro}'")
    if not (cfg.dry_run is True or cfg.dry_run is False or cfg.dry_run == "json"):
        raise LaunchError(f"dry_run must be false, true or json; got '{cfg.dry_run}'")
    limit_s, delay_s = cfg.cluster.time_limit_min * 60, cfg.cluster.signal_delay_s
    if limit_s - delay_s - preemption.TICK_S < MIN_ATTEMPT_S:
        raise LaunchError(f"cluster.time_limit_min={cfg.cluster.time_limit_min} ({limit_s} s) leaves no time to train: "
                          f"Slurm sends the checkpoint signal up to cluster.signal_delay_s={delay_s} s + "
                          f"{preemption.TICK_S} s before the limit, and an attempt needs at least {MIN_ATTEMPT_S} s; "
                          "raise the time limit or lower the delay")
    every, saved = cfg.train.export_every, cfg.train.checkpoint_every
    if every and (saved == 0 or every % saved):
        raise LaunchError(f"train.export_every={every} must be a multiple of train.checkpoint_every={saved}: an export "
                          "converts a checkpoint just saved")
    if cfg.data.val_fraction == 0 and cfg.train.eval_every > 0:
        raise LaunchError(f"data.val_fraction=0 leaves no validation data for train.eval_every={cfg.train.eval_every}; "
                          "set train.eval_every=0 (no evaluation) or a fraction in (0, 1)")
    if cfg.cluster.container_image is not None:
        raise LaunchError(f"cluster.container_image is now cluster.container.image; set "
                          f"cluster.container.image={cfg.cluster.container_image} (and cluster.container.python, "
                          "the interpreter inside it, if it is not python)")
    if cfg.cluster.stage_env and cfg.cluster.container.image is not None:
        raise LaunchError(f"cluster.stage_env=true with cluster.container.image={cfg.cluster.container.image}: the "
                          "image is on every node already; set cluster.stage_env=false (docs/site.md, which to choose)")
    if cfg.model.d_model % cfg.model.n_heads:
        raise LaunchError(f"model.d_model={cfg.model.d_model} is not divisible by model.n_heads={cfg.model.n_heads}")
    if cfg.share_group and cfg.cluster.ssh is None:  # a remote cluster's groups are its own, checked there
        try:
            group_id(cfg.share_group)  # plan and dry runs too, not only a submission
        except ValueError as err:
            raise LaunchError(str(err)) from None


def check_value(key: str, value: Any) -> None:
    """One setting's value against its range (launcher/compose/ranges.py's RANGES), and any string against
    emptiness and control characters."""
    if isinstance(value, str):
        if not value.strip():
            raise LaunchError(f"{key} must not be empty; give a value (or null where the default is null)")
        if CONTROL.search(value):
            raise LaunchError(f"{key}={value!r} contains a control character (a newline, tab, ...); "
                              "use a single line of printable text")
        return
    rule = RANGES.get(key)
    if isinstance(value, float) and not math.isfinite(value):
        raise LaunchError(f"{key} must be a finite number{f' {rule}' if rule else ''}, got {value}")
    if rule is not None and value is not None and not isinstance(value, bool) and not rule.allows(value):
        raise LaunchError(f"{key} must be {rule}, got {value}")


def leaves(node: Any, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """Every setting of a composed config as (dotted key, value), into sections, maps and lists."""
    items = ((f.name, getattr(node, f.name)) for f in dataclasses.fields(node)) if dataclasses.is_dataclass(node) \
        else node.items() if isinstance(node, dict) else ((str(i), v) for i, v in enumerate(node))
    for name, value in items:
        key = f"{prefix}{name}"
        if dataclasses.is_dataclass(value) or isinstance(value, (dict, list)):
            yield from leaves(value, f"{key}.")
        else:
            yield key, value


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
