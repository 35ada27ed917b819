"""What the config groups offer, and where each option comes from.

Each group (``cluster/``, ``model/``, ``gpus/``, ``tracking/``, ``search/``) is searched in four layers, later ones
adding options and overriding an earlier file of the same name:

1. the package's ``conf/`` (the project's own choices);
2. a site directory, ``$LAUNCHER_SITE_CONFIG`` (an administrator's, e.g. ``/etc/launcher``);
3. the user's directory, ``$XDG_CONFIG_HOME/launcher`` (default ``~/.config/launcher``);
4. a project directory, ``.launcher/conf`` in the current directory.

So ``~/.config/launcher/cluster/mysite.yaml`` is all it takes to make ``cluster=mysite`` valid. Validation
messages and ``--help`` list the choices from here, ``launcher clusters`` says where each cluster comes from,
and composition (launcher/compose/composer.py) composes from the winning files.

Beside its groups, a site's, a user's or a project's layer may hold a ``config.yaml`` of settings: today one,
``cluster: NAME``, the cluster a launch uses when it names none (``launcher clusters default NAME`` writes the
user's). A later layer's wins; ``cluster=`` on the command line or in a run file wins over all of them.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional

from launcher.core.rundir import SOURCE_ROOT
from launcher.errors import LaunchError

# An installed package carries its config groups inside (launcher/conf, pyproject.toml); a checkout has them
# at the top, beside launcher/.
CONF_DIR = SOURCE_ROOT / "launcher" / "conf" if (SOURCE_ROOT / "launcher" / "conf" / "config.yaml").is_file() \
    else SOURCE_ROOT / "conf"
SITE_VARIABLE = "LAUNCHER_SITE_CONFIG"
PROJECT_DIR = Path(".launcher") / "conf"

# The config groups a user chooses from, in the order of conf/config.yaml.
GROUPS = ("model", "gpus", "cluster", "tracking", "search")

# The gpus option that takes its count from ``layout.gpus``.
CUSTOM_GPUS = "custom"
# The cluster choice that is no cluster file: the run goes to the candidate where it starts first
# (launcher/service/auto.py).
AUTO_CLUSTER = "auto"


@dataclass(frozen=True)
class Layer:
    """One directory of config groups: which layer it is, and where."""

    name: str  # package, site, user or project
    path: Path


def user_dir() -> Path:
    """The user's layer: ``$XDG_CONFIG_HOME/launcher``, default ``~/.config/launcher`` (``clusters add`` writes
    there)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or "~/.config").expanduser().absolute() / "launcher"


def layers() -> List[Layer]:
    """The layers in search order (later wins), the package's always, the others where their directory exists.
    Asked anew each time: the environment and the current directory decide."""
    user = user_dir()
    site = os.environ.get(SITE_VARIABLE)
    found = [Layer("package", CONF_DIR)]
    for name, path in (("site", Path(site).expanduser() if site else None), ("user", user),
                       ("project", Path.cwd() / PROJECT_DIR)):
        if path is not None and path.is_dir() and path.resolve() != CONF_DIR:
            found.append(Layer(name, path.absolute()))
    return found


def option_files(group: str) -> Dict[str, Path]:
    """Each option of ``group`` and the file that defines it (the last layer that has one)."""
    files: Dict[str, Path] = {}
    for layer in layers():
        for path in sorted((layer.path / group).glob("*.yaml")):
            files[path.stem] = path
    return files


SETTINGS_FILE = "config.yaml"
SETTINGS = ("cluster",)  # what a layer's config.yaml may set


def settings_file(layer: Layer) -> Path:
    return layer.path / SETTINGS_FILE


def layer_settings() -> Dict[str, tuple]:
    """Each setting the layers' config.yaml files give, with the file that gave it (the last layer's wins); a file
    that is not a mapping of known settings to names is a LaunchError naming it."""
    found: Dict[str, tuple] = {}
    for layer in layers()[1:]:  # the package's config.yaml is Hydra's primary config, not settings
        path = settings_file(layer)
        if not path.is_file():
            continue
        import yaml  # lazy: keeps yaml out of start-up

        try:
            data = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise LaunchError(f"{path} cannot be read: {' '.join(str(err).split())}") from None
        if not isinstance(data, dict) or set(data) - set(SETTINGS) or \
                not all(isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9._-]{1,64}", v) for v in data.values()):
            raise LaunchError(f"{path} must set only {', '.join(SETTINGS)} (cluster: NAME), got {data!r}")
        found.update({key: (value, path) for key, value in data.items()})
    return found


SITE_TEMPLATE = "slurm"  # the package's cluster file a site copies and edits: no cluster of its own


def cluster_choices(*excluded: str) -> List[str]:
    """The clusters configured (their files' names, sorted) besides ``excluded`` and the site template: what a run
    may be placed on or moved to, without reading the files."""
    return [name for name in sorted(option_files("cluster")) if name not in {*excluded, SITE_TEMPLATE}]


def other_clusters(*excluded: str) -> str:
    """The clusters configured besides ``excluded`` (:func:`cluster_choices`), as a hint to end a message with:
    `` (configured: a, b; cluster=a?)``, or "" where there are none."""
    others = cluster_choices(*excluded)
    return f" (configured: {', '.join(others)}; cluster={others[0]}?)" if others else ""


def default_cluster() -> tuple:
    """The cluster a launch uses when it names none, and where that comes from (a config.yaml, or the package)."""
    name, path = layer_settings().get("cluster", (package_default("cluster"), None))
    return name, str(path) if path else "the package's default"


def beside(value: str, path: Optional[Path]) -> str:
    """A path a config file gives, absolute: a relative one is relative to the file's own directory (to the
    current directory where no file gave it)."""
    value = os.path.expanduser(value)
    return os.path.normpath(os.path.join(path.parent if path is not None else Path.cwd(), value))


def origin(path: Path) -> str:
    """Which layer a config file belongs to, as ``launcher clusters`` shows it."""
    for layer in reversed(layers()):
        if layer.path in path.parents:
            return layer.name
    return "?"


def _natural_key(name: str) -> list:
    """Sort ``2`` before ``16`` and ``gpt_7b`` before ``gpt_13b``."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]


def options(group: str) -> List[str]:
    """The option names of a config group (its YAML files in every layer, without suffix)."""
    return sorted(option_files(group), key=_natural_key)


def option_path(group: str, option: str) -> Optional[Path]:
    """The file that defines ``group=option``, or None."""
    return option_files(group).get(option)


@functools.lru_cache(maxsize=None)
def _defaults() -> Dict[str, Any]:
    from omegaconf import OmegaConf  # lazy: keeps omegaconf out of start-up

    entries = OmegaConf.to_container(OmegaConf.load(CONF_DIR / "config.yaml"))["defaults"]
    return {key: value for entry in entries if isinstance(entry, dict) for key, value in entry.items()}


def package_default(group: str) -> Any:
    """A group's default in the package's conf/config.yaml."""
    return _defaults()[group]


def default_choices() -> Dict[str, Any]:
    """Each group's default option: the defaults list of conf/config.yaml, the cluster's as the layers set it."""
    return {**{group: _defaults()[group] for group in GROUPS}, "cluster": default_cluster()[0]}


def gpu_presets() -> List[int]:
    """The GPU counts that have a preset file in ``conf/gpus/``."""
    return [int(name) for name in options("gpus") if name.isdigit()]


def model_micro_batch(model: str) -> int | None:
    """The micro-batch a model's size file sets, where ``train.micro_batch=auto``
    starts its search; None if the file is absent or sets no integer."""
    from omegaconf import OmegaConf  # lazy: keeps omegaconf out of start-up

    path = option_path("model", model)
    if path is None:
        return None
    value = OmegaConf.select(OmegaConf.load(path), "train.micro_batch")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def auto_asked(overrides: List[str]) -> bool:
    """Whether the overrides say ``cluster=auto`` (a string test: a launch of one cluster pays nothing for it)."""
    return f"cluster={AUTO_CLUSTER}" in overrides
