"""Compose validated, typed run configs from ``conf/`` and the command line.

Uses Hydra's compose API rather than ``@hydra.main``: the launcher runs its own
sweeps (one submission per concrete override list, see launcher/compose/overrides.py)
and must return as soon as jobs are submitted, while ``@hydra.main`` owns the
process (working directory, logging) and its launchers block on their jobs.

Every run of a sweep is composed, validated and planned before any is
submitted, so one bad combination fails the whole command up front.
"""
from __future__ import annotations

import os
import threading
from dataclasses import dataclass, fields
from typing import Any, Dict, List, Sequence

from hydra import compose, initialize_config_dir
from hydra.conf import HydraConf
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from launcher.compose import overrides as ov
from launcher.compose.catalog import GROUPS, beside, default_choices, option_path
from launcher.compose.layers import conf_dir
from launcher.core.config import RunConfig, StoreConfig
from launcher.core.rundir import DEFAULT_ROOT
from launcher.core.store import ADDRESSING, StoreError, resolve, is_remote as is_remote_path
from launcher.dataset.check import DataSummary, check_data
from launcher.errors import LaunchError
from launcher.core.plan import Plan
from launcher.compose.runfile import NOT_RECORDED, run_file_data
from launcher.slurm.batch import request_params
from launcher.compose.validate import validate
from launcher.compose.layout import plan_of

# Hydra's global state holds one composition at a time: the console's threads (a waiting run's page asks where it
# would start sooner, launcher/service/auto.py) compose one after another.
_COMPOSING = threading.Lock()
# What Hydra and OmegaConf raise for bad input (Hydra also raises bare ValueError).
_CONFIG_ERRORS = (HydraException, OmegaConfBaseException, ValueError)


@dataclass(frozen=True)
class ComposedRun:
    """One concrete run: what the user typed, the typed config, and its plan."""

    overrides: List[str]  # this run's overrides as typed (sweeps expanded)
    config: RunConfig
    resolved: DictConfig  # the fully resolved config, for the run's config.yaml
    plan: Plan
    run_file: Dict[str, Any]  # the run as a run file, for the run's run.yaml (launcher/compose/runfile.py)
    data: DataSummary  # what it trains on: checked before anything is submitted


def compose_runs(overrides: Sequence[str], multirun: bool = False) -> List[ComposedRun]:
    """Compose every run the overrides describe (several only with ``multirun``).

    Raises LaunchError, with a one-line message, for any user mistake.
    """
    store = ConfigStore.instance()
    store.store(name="base", node=RunConfig)
    store.store(group="hydra", name="config", node=hydra_node(), provider="hydra")
    try:
        with _COMPOSING, initialize_config_dir(config_dir=str(conf_dir()), version_base="1.3", job_name="launcher"):
            # With the config loader, glob() sweeps can list a group's options.
            parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
            runs = ov.expand(ov.parse(parser, overrides), multirun)
            return [_compose_one(parser, run, label=multirun and len(runs) > 1) for run in runs]
    except _CONFIG_ERRORS as exc:
        raise LaunchError(one_line(exc)) from exc


def hydra_node() -> HydraConf:
    """Hydra's own config, without its defaults list: its output dirs, logging, help, launcher and
    sweeper (six YAML files, a third of a composition's time) serve ``@hydra.main``, which we do not
    use, and ``compose()`` drops the ``hydra`` node anyway. The app's config groups compose as before."""
    return HydraConf(defaults=[])


def _compose_one(parser: OverridesParser, typed: List[str], label: bool) -> ComposedRun:
    try:
        parsed = ov.parse(parser, typed)
        ov.check(parsed)
        hydra_overrides = ov.normalise(parsed)
        cfg = compose(config_name="config", overrides=hydra_overrides)
        remote = cfg.cluster.ssh is not None  # its paths (slurm.conf, run root, data) are the cluster's
        if not remote:
            anchor_slurm_conf(cfg, hydra_overrides)
        # $LAUNCHER_RUN_ROOT is this machine's; a remote cluster's runs go to its run_root, else its user's default.
        chose_root = user_set("run_root", hydra_overrides) or (not remote and os.environ.get("LAUNCHER_RUN_ROOT"))
        if (cfg.cluster.run_root or remote) and not chose_root:
            cfg.run_root = cfg.cluster.run_root or DEFAULT_ROOT  # the cluster's scratch, unless the user named a root
        if not remote and cfg.data.path and not is_remote_path(cfg.data.path) \
                and not os.path.isabs(os.path.expanduser(cfg.data.path)):
            # Relative to where the command runs, typed or in a run file; recorded absolute (config.yaml,
            # run.yaml), so the run and `launcher -f RUN/run.yaml` find it from anywhere.
            cfg.data.path = os.path.abspath(os.path.expanduser(cfg.data.path))
        config: RunConfig = OmegaConf.to_object(cfg)  # type: ignore[assignment]
        if is_remote_path(config.data.path) and not remote:
            config.data.store = resolved_store(config)
            cfg.data.store = OmegaConf.structured(config.data.store)
        validate(config)
        plan = plan_of(config)
        data = remote_data(config) if remote else check_data(config, plan)
        request_params(config, plan)  # rejects values unsafe in an sbatch script
    except (LaunchError, *_CONFIG_ERRORS) as exc:
        message = exc.message if isinstance(exc, LaunchError) else one_line(exc)
        raise LaunchError(f"[{' '.join(typed)}] {message}" if label else message) from exc
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    return ComposedRun(overrides=list(typed), config=config, resolved=resolved, plan=plan,
                       run_file=run_file_of(parsed, resolved, plan), data=data)


def resolved_store(cfg: RunConfig) -> StoreConfig:
    """The object store of a bucket's data as its tasks will reach it: the run's ``data.store`` over the cluster
    file's ``cluster.store``, over what botocore resolves here (launcher/core/store.py ``resolve``)."""
    run, site = cfg.data.store, cfg.cluster.store
    merged = StoreConfig(**{f.name: getattr(run, f.name) if getattr(run, f.name) != getattr(StoreConfig(), f.name)
                            else getattr(site, f.name) for f in fields(StoreConfig)})
    if merged.addressing_style not in (None, *ADDRESSING):
        raise LaunchError(f"data.store.addressing_style must be one of {', '.join(ADDRESSING)}, "
                          f"not {merged.addressing_style!r}")
    try:
        return resolve(merged)
    except StoreError as err:
        raise LaunchError(str(err)) from None


def remote_data(cfg: RunConfig) -> DataSummary:
    """A remote cluster's data, as far as this machine can tell: its paths are the cluster's, checked there
    before the run is submitted (launcher/remote/agent.py)."""
    return DataSummary(source=f"{cfg.data.path or 'the standard-library corpus'} on cluster {cfg.cluster.name}",
                       tokenizer="checked on the cluster", vocab_size=cfg.model.vocab_size, tokens=None, epochs=None)


def user_set(key: str, hydra_overrides: List[str]) -> bool:
    """Whether the user set ``key`` (on the command line or in a run file), rather than a config file."""
    return any(line.split("=", 1)[0].lstrip("+") == key for line in hydra_overrides)


def anchor_slurm_conf(cfg: DictConfig, hydra_overrides: List[str]) -> None:
    """A relative ``cluster.slurm_conf`` is relative to the cluster file that gives it (a site's file may name
    its slurm.conf beside it), or to the current directory where it was typed; the composed config holds it
    absolute, so the run's record and its jobs find the same file from anywhere."""
    value = cfg.cluster.slurm_conf
    if not value or os.path.isabs(os.path.expanduser(value)):
        return
    choice = next((line.split("=", 1)[1] for line in hydra_overrides if line.startswith("cluster=")),
                  default_choices()["cluster"])
    cfg.cluster.slurm_conf = beside(value, None if user_set("cluster.slurm_conf", hydra_overrides)
                                    else option_path("cluster", choice))


def run_file_of(parsed: List[Override], resolved: DictConfig, plan: Plan) -> Dict[str, Any]:
    """The run as a run file: every group choice (explicit even when defaulted; gpus as the count,
    which also stands for ``layout.gpus``) and each overridden value as composed."""
    choices: Dict[str, Any] = {group: choice for group, choice in default_choices().items()
                               if group not in NOT_RECORDED}
    values = []
    for override in parsed:
        key = override.key_or_group
        if override.package is not None or key in NOT_RECORDED or key == "layout.gpus":
            continue
        if override.is_delete():
            values.append((f"~{key}", None))
        elif key in GROUPS:
            choices[key] = override.value()
        else:
            value = OmegaConf.select(resolved, key)
            values.append((key, OmegaConf.to_container(value) if OmegaConf.is_config(value) else value))
    choices["gpus"] = plan.gpus
    return run_file_data(choices, values)


def one_line(exc: BaseException) -> str:
    """Hydra's and OmegaConf's messages (and their causes) on one line, without
    the indented ``full_key:``/``object_type=`` detail lines."""
    parts: List[str] = []
    current: BaseException | None = exc
    while current is not None:
        lines = [line.strip() for line in str(current).splitlines() if line.strip() and not line[0].isspace()]
        text = " ".join(lines)
        if text and text not in parts:
            parts.append(text)
        current = current.__cause__
    return ": ".join(parts) or type(exc).__name__
