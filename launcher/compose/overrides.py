"""From the overrides a user types to the override lists Hydra can compose.

Hydra's compose API takes one concrete list of overrides. Three things between
the command line and that list are ours:

* Sweeps: ``-m gpus=8,16 model=a,b`` becomes the cartesian product of concrete
  lists, in a stable order (the first override varies slowest), as Hydra's
  BasicSweeper would do under ``@hydra.main``, which we do not use because it
  owns the process and blocks on its jobs.
* GPU counts: options of the ``gpus`` group are named by count, and Hydra
  rejects ``gpus=16`` as typed ("Config group override must be a string or a
  list. Got int"). A count with a preset file selects that preset; any other
  positive count selects ``custom`` with ``layout.gpus=N``.
* Early, precise errors: an unknown key or group option is reported with the
  closest valid name before Hydra's multi-line message could be.
"""
from __future__ import annotations

import itertools
import re
from typing import Any, List, Optional, Sequence

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import OverrideParseException

from launcher.compose.catalog import CUSTOM_GPUS, GROUPS, default_cluster, gpu_presets, package_default
from launcher.compose.runfile import key_of
from launcher.compose.schema import check_option, field_type, free_form_keys, gpu_count
from launcher.errors import LaunchError


def parse(parser: OverridesParser, overrides: Sequence[str]) -> List[Override]:
    """Parse override strings, turning Hydra's grammar errors into a LaunchError. A value Hydra's grammar cannot
    read unquoted but can quoted (an enroot image as the docs write it, ``nvcr.io#nvidia/pytorch:25.01-py3``: the
    ``#``) is taken as the quoted string it can only mean."""
    parsed = []
    for line in overrides:
        try:
            parsed.extend(parser.parse_overrides([line]))
        except OverrideParseException as exc:
            quoted = _quoted(line)
            if quoted == line:
                raise LaunchError(f"cannot parse override {line!r}: {str(exc).splitlines()[0]}") from exc
            parsed.extend(parser.parse_overrides([quoted]))
    return parsed


def _quoted(line: str) -> str:
    """``key=value`` with the value in single quotes where it reads as an image reference with a ``#`` (letters,
    digits and ``.@/:+-_``), else the line as it is."""
    key, sep, value = line.partition("=")
    if not sep or "#" not in value or not re.fullmatch(r"[\w.@/:+#-]+", value) or \
            not re.fullmatch(r"\+{0,2}[\w.@/-]+", key):
        return line
    return f"{key}='{value}'"


def expand(parsed: Sequence[Override], multirun: bool) -> List[List[str]]:
    """The concrete override lists of a (multi)run, each as the user would type it."""
    axes = []
    for override in parsed:
        if not override.is_sweep_override():
            axes.append([override.input_line])
            continue
        if not multirun:
            whole = f", or quote the value to keep it whole: {kept_whole(override)}" if takes_text(override) else ""
            raise LaunchError(f"'{override.input_line}' is a sweep; add -m (--multirun) to launch one run per value"
                              + whole)
        if not override.is_discrete_sweep():
            raise LaunchError(
                f"'{override.input_line}' cannot be enumerated; sweep over a list (a=1,2), range() or choice()"
            )
        key = override.get_key_element()
        axes.append([f"{key}={value}" for value in override.sweep_string_iterator()])
    return [list(combination) for combination in itertools.product(*axes)]


def check(parsed: Sequence[Override]) -> None:
    """Reject unknown keys (and keys ``+`` would add outside a free-form map) and unknown options of the groups
    other than gpus, with a suggestion."""
    for override in parsed:
        key = override.key_or_group
        if override.package is not None or override.is_delete():
            continue
        if key in ("model", "cluster", "tracking", "search"):  # gpus also takes counts: see normalise()
            check_option(key, override.value())
        elif key not in GROUPS:
            kind = _check_key(key, adding=override.is_add() or override.is_force_add())
            if kind is bool and not override.is_sweep_override() and not isinstance(override.value(), bool):
                # OmegaConf would take 2 (or 0) for true (false).
                raise LaunchError(f"{key} must be true or false, got '{override.value()}'")


def check_given_once(lines: Sequence[str]) -> None:
    """Reject a key the user gave twice, which Hydra would silently settle by keeping the last. (The
    planner's suggestions do append to a run's overrides to change a value; they do not come here.)"""
    seen: dict = {}
    for line in lines:
        key = key_of(line)
        if key in seen:
            raise LaunchError(f"{key} is given twice ('{seen[key]}' and '{line}'); give it once")
        seen[key] = line


def normalise(parsed: Sequence[Override]) -> List[str]:
    """The override strings to hand to Hydra, with ``gpus=N`` made composable, and the layers' default cluster
    (launcher/compose/catalog.py default_cluster) where the overrides choose none."""
    cluster = default_cluster()[0]
    hydra_overrides = [] if any(o.key_or_group == "cluster" for o in parsed) or cluster == package_default("cluster") \
        else [f"cluster={cluster}"]
    for override in parsed:
        if override.key_or_group != "gpus" or override.package is not None or override.is_delete():
            hydra_overrides.append(override.input_line)
        elif override.value() == CUSTOM_GPUS:
            if not any(o.key_or_group == "layout.gpus" for o in parsed):
                raise LaunchError("gpus=custom needs layout.gpus=N (or type the count: gpus=N)")
            hydra_overrides.append(f"gpus={CUSTOM_GPUS}")
        else:
            count = gpu_count(override.value())
            if count in gpu_presets():
                hydra_overrides.append(f"gpus='{count}'")  # a quoted string is a valid group choice
            else:
                hydra_overrides += [f"gpus={CUSTOM_GPUS}", f"layout.gpus={count}"]
    return hydra_overrides


def _check_key(key: str, adding: bool) -> Any:
    try:
        return field_type(key)[0]
    except LaunchError as err:
        if not adding:
            raise
        maps = ", ".join(free_form_keys())
        raise LaunchError(f"{err.message}; '+' adds a key only inside a free-form map ({maps})") from None


def takes_text(override: Override) -> bool:
    """Whether the override's key holds a string (or anything, inside a free-form map such as
    ``cluster.sbatch_flags``), where a value with commas may be meant as one string."""
    key = override.key_or_group
    if key in GROUPS:
        return False
    try:
        kind, free = field_type(key)
    except LaunchError:
        return False
    return free or kind in (str, Optional[str])


def kept_whole(override: Override) -> str:
    """The override with its value quoted for Hydra, as it is typed in a shell, so that commas and brackets
    stay part of one string value: ``"+cluster.sbatch_flags.mail-type='END,FAIL'"``."""
    prefix, _, value = override.input_line.partition("=")
    return f"\"{prefix}='{value.strip(chr(39) + chr(34))}'\""
