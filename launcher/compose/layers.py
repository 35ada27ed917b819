"""The one directory Hydra composes from, out of the config layers (launcher/compose/catalog.py), and the
check of every file a site, a user or a project adds.

Hydra searches its primary config directory first, so a user's ``cluster/local.yaml`` could never win over
the package's. Where any layer beyond the package has files, composition therefore reads a view: a
directory under the user's cache holding ``config.yaml`` and each option's winning file, made once per set
of files (named by a hash of their paths, sizes and times) and replaced atomically. Where none has, the
package's ``conf/`` is used as it is.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import typing
from pathlib import Path
from typing import Any, Dict, Iterator, Tuple

import yaml

from launcher.compose.catalog import CONF_DIR, GROUPS, option_files
from launcher.compose.schema import field_type
from launcher.core.safepath import check_tree, private_dir
from launcher.errors import LaunchError

GLOBAL = "# @package _global_"  # a file whose keys are the run's own sections (model/, gpus/), not its group's


def conf_dir() -> Path:
    """The directory to compose from: the package's conf/, or the view of every layer."""
    files = {(group, name): path for group in GROUPS for name, path in option_files(group).items()}
    added = {key: path for key, path in files.items() if CONF_DIR not in path.parents}
    if not added:
        return CONF_DIR
    for (group, _), path in added.items():
        check_file(group, path)
    stamp = hashlib.sha256()
    for (group, name), path in sorted(files.items()):
        info = path.stat()
        stamp.update(f"{group}/{name}={path}:{info.st_size}:{info.st_mtime_ns}\n".encode())
    view = cache_dir() / f"conf-{stamp.hexdigest()[:16]}"
    if not view.is_dir():
        build_view(view, files)
    return view


def cache_dir() -> Path:
    """Where views live: ``$XDG_CACHE_HOME/launcher`` (default ``~/.cache/launcher``), a 0700 folder of the user's
    whose path no other user could change or plant (launcher/core/safepath.py): a view is what a launch composes
    from."""
    path = Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "launcher"
    check_tree(path, "cache folder", CACHE)
    path.parent.mkdir(parents=True, exist_ok=True)
    private_dir(path, "cache folder", CACHE)
    return path


CACHE = "set XDG_CACHE_HOME to a folder of your own"


def build_view(view: Path, files: Dict[Tuple[str, str], Path]) -> None:
    """Write the view next to where it goes and rename it into place (a concurrent launch may win the race)."""
    tmp = Path(tempfile.mkdtemp(dir=view.parent, prefix=".view-"))
    try:
        shutil.copyfile(CONF_DIR / "config.yaml", tmp / "config.yaml")
        for (group, name), path in files.items():
            (tmp / group).mkdir(exist_ok=True)
            shutil.copyfile(path, tmp / group / f"{name}.yaml")
        os.rename(tmp, view)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not view.is_dir():
            raise


def check_file(group: str, path: Path) -> None:
    """LaunchError, naming the file, when a layer's file does not parse or sets a key the schema lacks."""
    try:
        text = path.read_text()
        data = yaml.safe_load(text)
    except (OSError, UnicodeDecodeError) as err:
        raise LaunchError(f"{path}: cannot be read ({getattr(err, 'strerror', None) or err})") from None
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise LaunchError(f"{path}: does not parse as YAML{line}: {getattr(err, 'problem', None) or err}") from None
    if data is None:
        return
    if not isinstance(data, dict):
        raise LaunchError(f"{path}: must be a mapping of keys to values, not a {type(data).__name__}")
    prefix = "" if GLOBAL in text.splitlines()[:3] else f"{group}."
    for key in keys_of(data, prefix):
        try:
            field_type(key)
        except LaunchError as err:
            raise LaunchError(f"{path}: {err.message}") from None


def keys_of(data: Dict[str, Any], prefix: str) -> Iterator[str]:
    """The dotted keys a file sets, down to values or to free-form maps (whose keys are the user's)."""
    for name, value in data.items():
        if name == "defaults" and not prefix:
            continue
        key = f"{prefix}{name}"
        if isinstance(value, dict) and value:
            try:
                kind, free = field_type(key)
            except LaunchError:
                kind, free = None, False
            if kind is not None and not free and typing.get_origin(kind) is not dict:
                yield from keys_of(value, f"{key}.")
                continue
        yield key
