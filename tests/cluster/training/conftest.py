"""The quick tier's shared fixture: the reference run that resumed, damaged and exported runs must reproduce."""
from __future__ import annotations

from pathlib import Path

import pytest

from support.helpers import shared_once


@pytest.fixture(scope="session")
def reference_config(tmp_path_factory) -> dict:
    """A 2-rank run of 6 steps, checkpointed and evaluated every 3 (tests/support/train_harness.py)."""
    from support.train_harness import make_tokens, tiny_config

    tokens = shared_once(tmp_path_factory, "reference-data", lambda d: make_tokens(d / "tokens.bin")) / "tokens.bin"
    return tiny_config(tokens, steps=6, checkpoint_every=3, eval_every=3, keep_checkpoints=2)


@pytest.fixture(scope="session")
def reference_run(tmp_path_factory, reference_config) -> Path:
    """That run, uninterrupted (``python -m launcher.train`` on 2 ranks): made once per session, whichever worker
    asks first, and only read after that."""
    from support.train_harness import check_ok, launch_ranks, make_run_dir

    def train(directory: Path) -> None:
        run_dir = make_run_dir(directory, reference_config, world_size=2, micro_batch=2)
        check_ok(launch_ranks(["-m", "launcher.train", str(run_dir)], world_size=2))

    return shared_once(tmp_path_factory, "reference", train)
