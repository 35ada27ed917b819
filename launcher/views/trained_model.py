"""A run's trained model as the commands that read it in one process find it (``sample``, ``eval``, ``export``): its
config, the checkpoint to read, its tokenizer, and torch on this machine.

The checkpoint: ``--step N``'s, refused when it is not complete or its files do not match its manifests (naming
the file); by default the newest complete one whose files do, saying which newer one was passed over and why.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Optional, Tuple

from launcher.dataset import tokenizer
from launcher.train.manifest import checkpoint_problems
from launcher.views.lookup import lookup, roots_of
from launcher.core.checkpoints import complete_checkpoints, step_dir, step_of
from launcher.core.config import DataConfig, RunConfig, load_run_config
from launcher.core.dataset import DatasetError, described
from launcher.core.store import StoreError
from launcher.errors import LaunchError
from launcher.core.run_index import RunRecord
from launcher.views.width import to_stderr


def with_checkpoint(args: argparse.Namespace, command: str) -> Tuple[RunRecord, RunConfig, Path]:
    """The run ``args.name`` names, its config, and the checkpoint of ``args.step`` (or the newest good one), for
    ``command``, which needs torch here."""
    need_torch(command)
    rec = lookup(roots_of(args), args.name)
    cfg = run_config(rec)
    return rec, cfg, chosen_checkpoint(rec, cfg, args.step, command)


def need_torch(command: str) -> None:
    """LaunchError when this machine's Python has no torch (a laptop's install without the [train] extra)."""
    if importlib.util.find_spec("torch") is None:
        raise LaunchError(f"launcher {command} needs torch, missing from {sys.executable}: "
                          "pip install 'slurm-gpt-launcher[train]'")


def run_config(rec: RunRecord) -> RunConfig:
    path = Path(rec.run_dir) / "config.yaml"
    try:
        return load_run_config(path)
    except Exception as err:  # missing or damaged: OSError, YAML and OmegaConf errors
        raise LaunchError(f"{rec.name}: cannot read {path} ({type(err).__name__})") from None


def chosen_checkpoint(rec: RunRecord, cfg: RunConfig, step: Optional[int], command: str) -> Path:
    """The checkpoint to read (see the module's docstring); a one-line LaunchError when there is none."""
    run_dir = Path(rec.run_dir)
    complete = complete_checkpoints(run_dir)
    if step is not None:
        path = step_dir(run_dir, step)
        if path not in complete:
            steps = ", ".join(str(step_of(p)) for p in complete) or "none yet"
            raise LaunchError(f"{rec.name} has no complete checkpoint at step {step} (its checkpoints: {steps})")
        found = checkpoint_problems(path)
        if found:
            raise LaunchError(f"{rec.name}'s checkpoint at step {step} is damaged: {found[0]}")
        return path
    for path in reversed(complete):
        found = checkpoint_problems(path)
        if not found:
            return path
        to_stderr(f"warning: {rec.name}'s checkpoint at step {step_of(path)} is damaged ({found[0]}); "
                  "reading the one before it")
    if complete:
        raise LaunchError(f"every checkpoint of {rec.name} is damaged; the newest: "
                          f"{checkpoint_problems(complete[-1])[0]}")
    raise LaunchError(f"{rec.name} has no complete checkpoint yet (train.checkpoint_every="
                      f"{cfg.train.checkpoint_every}); {command} once one is saved")


def run_tokenizer(data: DataConfig):
    """The tokenizer of the run's data: its dataset's, or byte-level (the default corpus; a single token
    file, which records no tokenizer)."""
    if data.path is None:
        return tokenizer.BYTE
    try:
        found = described(data)
        return tokenizer.load(found[0]["tokenizer"], found[1]) if found else tokenizer.BYTE
    except (DatasetError, StoreError) as err:
        raise LaunchError(f"the run's data.path: {err}") from None
