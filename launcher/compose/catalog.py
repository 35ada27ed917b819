"""What ``conf/`` offers: the config groups and their options.

Validation messages list the valid choices, and ``--help`` shows them; both
read them here from the files on disk, so adding ``conf/cluster/mysite.yaml``
is all it takes to make ``cluster=mysite`` valid.
"""
from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any, Dict, List

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"

# The config groups a user chooses from, in the order of conf/config.yaml.
GROUPS = ("model", "gpus", "cluster", "tracking")

# The gpus option that takes its count from ``layout.gpus``.
CUSTOM_GPUS = "custom"


def _natural_key(name: str) -> list:
    """Sort ``2`` before ``16`` and ``gpt_7b`` before ``gpt_13b``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def options(group: str) -> List[str]:
    """The option names of a config group (its YAML files, without suffix)."""
    return sorted((p.stem for p in (CONF_DIR / group).glob("*.yaml")), key=_natural_key)


@functools.lru_cache(maxsize=None)
def _defaults() -> Dict[str, Any]:
    from omegaconf import OmegaConf

    entries = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))["defaults"]
    return {key: value for entry in entries if isinstance(entry, dict) for key, value in entry.items()}


def default_choices() -> Dict[str, Any]:
    """Each group's default option, from the defaults list of conf/config.yaml."""
    return {group: _defaults()[group] for group in GROUPS}


def gpu_presets() -> List[int]:
    """The GPU counts that have a preset file in ``conf/gpus/``."""
    return [int(name) for name in options("gpus") if name.isdigit()]


def model_micro_batch(model: str) -> int | None:
    """The micro-batch a model's size file sets, where ``train.micro_batch=auto``
    starts its search; None if the file is absent or sets no integer."""
    from omegaconf import OmegaConf

    path = CONF_DIR / "model" / f"{model}.yaml"
    if not path.is_file():
        return None
    value = OmegaConf.select(OmegaConf.load(path), "train.micro_batch")
    return value if isinstance(value, int) and not isinstance(value, bool) else None
