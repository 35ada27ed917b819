"""What the config schema and conf/ accept, asked without Hydra: the type of a dotted key, the free-form maps
``+`` may add keys to, the options of a config group, and a GPU count. The command line's overrides
(launcher/compose/overrides.py) and run files (launcher/compose/runfile.py) are both checked here.
"""
from __future__ import annotations

import dataclasses
import typing
from typing import Any, List, Tuple

from launcher.compose.catalog import GROUPS, gpu_presets, options
from launcher.core.config import RunConfig
from launcher.errors import LaunchError, did_you_mean


def gpu_count(value: object) -> int:
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        presets = ", ".join(map(str, gpu_presets()))
        raise LaunchError(
            f"gpus must be a GPU count (presets: {presets}; any other count is laid out as custom), got '{value}'"
        )
    if value <= 0:
        raise LaunchError(f"gpus must be a positive number of GPUs, got {value}")
    return value


def check_option(group: str, value: object) -> None:
    valid = options(group)
    if value not in valid:
        raise LaunchError(f"unknown {group} '{value}'{did_you_mean(str(value), valid)}; valid: {', '.join(valid)}")


def free_form_keys(node: Any = RunConfig, prefix: str = "") -> List[str]:
    """The settings whose value is a free-form mapping (typed ``Dict``): the only ones ``+`` adds keys to."""
    keys = []
    for name, kind in typing.get_type_hints(node).items():
        if typing.get_origin(kind) is dict:
            keys.append(prefix + name)
        elif dataclasses.is_dataclass(kind):
            keys += free_form_keys(kind, f"{prefix}{name}.")
    return keys


def field_type(key: str) -> Tuple[Any, bool]:
    """The RunConfig type of ``key``, and whether ``key`` lies inside a free-form mapping (any sub-key
    goes there, typed Any); a LaunchError, with the closest valid name, if there is no such key."""
    node: Any = RunConfig
    path: List[str] = []
    for part in key.split("."):
        if typing.get_origin(node) is dict:
            return Any, True
        if not dataclasses.is_dataclass(node):
            raise LaunchError(f"unknown key '{key}': '{'.'.join(path)}' is a value, not a section")
        fields = typing.get_type_hints(node)
        if part not in fields:
            candidates = [".".join(path + [name]) for name in fields] + ([] if path else list(GROUPS))
            raise LaunchError(f"unknown key '{key}'{did_you_mean('.'.join(path + [part]), candidates)}")
        node = fields[part]
        path.append(part)
    return node, False
