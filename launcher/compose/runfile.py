"""Run files: a run as YAML, what a user would type (group choices and values together), as mcli does.

    model: gpt_1b
    gpus: 16
    cluster: local
    train: {steps: 2000, lr: 3e-4}
    cluster.partition: gpu

``launcher -f run.yaml [key=value ...]`` turns the file into the same override list the command line
produces (nested keys flattened, values quoted for Hydra's override grammar), so there is one composition
path; the command line's overrides win over the file's. Every run directory keeps its run in this form
as ``run.yaml`` (see :func:`run_file_data`), so ``launcher -f RUN_DIR/run.yaml`` runs it again, and a copy
with ``gpus: 16`` instead of ``gpus: 8`` scales it.
"""
from __future__ import annotations

import dataclasses
import math
import re
import typing
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Sequence, Tuple

import yaml

from launcher.compose.catalog import CUSTOM_GPUS, GROUPS
from launcher.compose.schema import check_option, field_type, gpu_count
from launcher.errors import LaunchError

# Keys a run file leaves out: they name or steer one submission, not the run (a search's trial is a plain run,
# whose run.yaml runs it again alone).
NOT_RECORDED = ("name", "dry_run", "force", "sweep.parallel", "search")

_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_0-9][\w-]*)*")
# A string Hydra reads back, unquoted, as the same string (not a number, bool, null, inf or nan).
_PLAIN = re.compile(r"[A-Za-z_/][\w\-./]*")
_NOT_PLAIN = {"null", "true", "false", "inf", "nan"}
_FLOAT = re.compile(r"[-+]?([0-9][0-9_]*)?(\.[0-9_]*)?[eE][-+]?[0-9]+")


def read_run_file(path: Path) -> List[str]:
    """The overrides the run file at ``path`` describes; a one-line LaunchError naming the file if it is
    missing, unreadable, not YAML, or holds an unknown key or a value of the wrong type."""
    try:
        text = Path(path).expanduser().read_text()
    except (OSError, UnicodeDecodeError) as err:
        reason = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
        raise LaunchError(f"cannot read run file {path}: {reason}") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise LaunchError(f"run file {path}: invalid YAML{where}: {problem}") from None
    try:
        return to_overrides({} if data is None else data)
    except LaunchError as err:
        raise LaunchError(f"run file {path}: {err.message}") from None


def load_yaml(text: str) -> Any:
    """YAML's safe load, but ``3e-4`` is a number (YAML 1.1 wants ``3.0e-4``), as a user means it."""
    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            """A key given twice is an error (PyYAML keeps the last silently)."""
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key '{key}'", key_node.start_mark)
                seen.add(key)
            return super().construct_mapping(node, deep)

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT, list("-+0123456789."))
    return yaml.load(text, Loader=Loader)


# A search's space in a run file, as Hydra's Optuna sweeper reads ``hydra.sweeper.params``: each setting and its
# expression in the sweep grammar, ``train.lr: tag(log, interval(1e-4, 3e-3))`` (launcher/search/space.py).
SEARCH_PARAMS = "search.params"


def to_overrides(data: Any) -> List[str]:
    """A run file's mapping as Hydra override strings, checked key by key against RunConfig."""
    if not isinstance(data, dict):
        raise LaunchError(f"expected a mapping of key: value, got {type(data).__name__}")
    lines = []
    for key, value in flatten(data):
        lines += search_params(value) if key == SEARCH_PARAMS else [override(key, value)]
    return lines


def search_params(params: Any) -> List[str]:
    """``search.params``' settings and expressions as the overrides typed on the command line would be."""
    if not isinstance(params, dict):
        raise LaunchError(f"{SEARCH_PARAMS} must map settings to expressions, e.g. "
                          f"{{train.lr: 'tag(log, interval(1e-4, 3e-3))'}}; got {params!r}")
    lines = []
    for key, value in flatten(params):
        field_type(key)  # an unknown key, with the closest name
        if not isinstance(value, str) or not value.strip():
            raise LaunchError(f"{SEARCH_PARAMS}.{key} must be an expression such as 'interval(1e-4, 3e-3)', "
                              f"'range(0, 200, 50)' or 'choice(a, b)'; got {value!r}")
        lines.append(f"{key}={value}")
    return lines


def flatten(data: Mapping, prefix: str = "") -> Iterator[Tuple[str, Any]]:
    """``{train: {steps: 2}}`` as ``("train.steps", 2)``; dotted keys may also be written as they are."""
    for key, value in data.items():
        if not isinstance(key, str):
            raise LaunchError(f"key {key!r} is not a name")
        full = prefix + key
        if isinstance(value, dict) and not full.startswith(("~", "+")) and full != SEARCH_PARAMS:
            yield from flatten(value, full + ".")
        else:
            yield full, value


def override(key: str, value: Any) -> str:
    """One ``key=value`` override; ``~key`` deletes, ``+key``/``++key`` pass as written."""
    if key.startswith("~"):
        return key if value is None else f"{key}={hydra_value(value)}"
    bare = key.lstrip("+")
    if not _KEY.fullmatch(bare):
        raise LaunchError(f"invalid key '{key}'")
    if key.startswith("+"):
        return f"{key}={hydra_value(value)}"
    if key in GROUPS:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise LaunchError(f"{key} must be an option name, got {value!r}")
        if key != "gpus":
            check_option(key, value)
        elif value != CUSTOM_GPUS:
            gpu_count(value)
        return f"{key}={hydra_value(value)}"
    kind, free = field_type(key)
    check_type(key, kind, value)
    return f"{'++' if free else ''}{key}={hydra_value(value)}"


def check_type(key: str, kind: Any, value: Any) -> None:
    """A LaunchError unless ``value`` is of the RunConfig type ``kind`` (Optional allows null)."""
    args = typing.get_args(kind)
    if typing.get_origin(kind) is typing.Union:
        if value is None and type(None) in args:
            return
        kind = next(arg for arg in args if arg is not type(None))
    origin = typing.get_origin(kind) or kind
    allowed = {int: (int,), float: (int, float), str: (str,), bool: (bool,), list: (list,), dict: (dict,)}
    if kind is Any:
        return
    if dataclasses.is_dataclass(kind):
        raise LaunchError(f"'{key}' is a section; give its keys, e.g. {key}: {{key: value}}")
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", list: "a list",
             dict: "a mapping"}
    wanted = allowed.get(origin)
    if wanted and (not isinstance(value, wanted) or (isinstance(value, bool) and origin is not bool)):
        raise LaunchError(f"{key} must be {names[origin]}, got {value!r}")


def hydra_value(value: Any) -> str:
    """``value`` in Hydra's override grammar, read back as the same value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isfinite(value):
            return repr(value)
        return "nan" if math.isnan(value) else f"{'-' if value < 0 else ''}inf"
    if isinstance(value, str):
        return value if _PLAIN.fullmatch(value) and value.lower() not in _NOT_PLAIN else quote(value)
    if isinstance(value, list):
        return "[" + ",".join(hydra_value(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{quote(str(k))}:{hydra_value(v)}" for k, v in value.items()) + "}"
    raise LaunchError(f"unsupported value {value!r} ({type(value).__name__}); use a string, number, bool, "
                      "null, list or mapping")


def quote(text: str) -> str:
    """A single-quoted Hydra string: backslashes before a quote or at the end doubled, quotes escaped."""
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, text)
    return "'" + escaped.replace("'", "\\'") + "'"


def key_of(line: str) -> str:
    """The key an override string sets: ``+a.b=1`` -> ``a.b``."""
    return line.split("=", 1)[0].lstrip("~+").split("@", 1)[0]


def without_cluster(lines: Sequence[str]) -> List[str]:
    """A run file's lines but those that choose its cluster or set one of the cluster's settings (``cluster.*``):
    what a run keeps when it is placed on another cluster, whose own settings then apply."""
    return [line for line in lines if key_of(line) != "cluster" and not key_of(line).startswith("cluster.")]


def merge(file_overrides: Sequence[str], typed: Sequence[str]) -> List[str]:
    """The file's overrides, less those whose key the command line sets, then the command line's."""
    keys = {key_of(line) for line in typed}
    return [line for line in file_overrides if key_of(line) not in keys] + list(typed)


def run_file_data(choices: Mapping[str, Any], values: Sequence[Tuple[str, Any]]) -> Dict[str, Any]:
    """A run file's mapping: the group choices first, then the overridden values, nested by section
    (keys under a group name stay dotted, since the group's key holds its choice)."""
    data: Dict[str, Any] = dict(choices)
    for key, value in values:
        if key.startswith("~") or key.split(".", 1)[0] in GROUPS or "." not in key:
            data[key] = value
            continue
        node = data
        *sections, leaf = key.split(".")
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return data


def dump(data: Mapping[str, Any]) -> str:
    return yaml.safe_dump(dict(data), sort_keys=False, default_flow_style=False)
