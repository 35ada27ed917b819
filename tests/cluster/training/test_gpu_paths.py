"""The paths a GPU takes, trained on CPU before any GPU is lent: ``parallel.compile=true`` (inductor, with this
machine's gcc) and ``parallel.precision=bf16`` (parameters gathered in bf16, gradients reduced in fp32; ``auto``
stays fp32 on CPU). Each trains the reference run's config, resumes exactly after a crash at step 5 (the rows of
steps 4 and 5 of the crashed attempt and of the resumed one are equal, float for float), and agrees with the fp32
reference within a stated tolerance: compile 1e-5 relative (the same maths, fused: 2e-7 measured), bf16 5e-3
(bf16 keeps 8 bits of mantissa: 1e-4 measured on these 6 steps). Compiled, one rank resumes and four ranks on two
nodes of two train through; rank 0's log says what ran.

Compiling costs CPU (about 30 s for a cold cache on one rank, docs/development.md): the cache is the test's own, so
the machine's does not decide what is measured, and one rank fills it before four ranks read it.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.helpers import losses
from support.train_harness import check_ok, launch_ranks, make_run_dir

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm

COMPILE_TOLERANCE, BF16_TOLERANCE = 1e-5, 5e-3


def train(run_dir: Path, world_size: int, ranks_per_node: int) -> None:
    check_ok(launch_ranks(["-m", "launcher.train", str(run_dir)], world_size=world_size,
                          local_world_size=ranks_per_node))


def crash_then_resume(run_dir: Path, world_size: int, ranks_per_node: int, monkeypatch) -> None:
    """An attempt that fails at step 5 (after the checkpoint of step 3), then one that resumes from it and ends;
    the two attempts' rows of steps 4 and 5 are equal."""
    with monkeypatch.context() as fault:
        fault.setenv("LAUNCHER_FAULT", "raise@5")
        crashed = launch_ranks(["-m", "launcher.train", str(run_dir)], world_size=world_size,
                               local_world_size=ranks_per_node)
    assert all(r.returncode != 0 for r in crashed)
    train(run_dir, world_size, ranks_per_node)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first, again = ([r["loss"] for r in rows if r["step"] == step and not r.get("final")] for step in (4, 5))
    assert len(first) == len(again) == 2 and first[0] == first[1] and again[0] == again[1]  # exactly
    assert "resumed at step 3" in (run_dir / "logs" / "rank_0.log").read_text()


def assert_close(run_dir: Path, reference_run: Path, rel: float) -> None:
    ours, reference = losses(run_dir), losses(reference_run)
    assert list(ours) == list(reference)
    assert [ours[s] for s in ours] == pytest.approx([reference[s] for s in reference], rel=rel)


def parallelized(run_dir: Path) -> str:
    """What rank 0's log says its newest attempt ran."""
    lines = [line for line in (run_dir / "logs" / "rank_0.log").read_text().splitlines() if "parallelized" in line]
    return lines[-1].split("parallelized: ", 1)[1]


def test_compiled_training_on_one_rank_and_on_two_nodes_of_two(tmp_path, reference_config, reference_run,
                                                               monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    config = {**reference_config, "parallel": {"compile": True}}
    one = make_run_dir(tmp_path / "one", config, world_size=1, micro_batch=2)
    crash_then_resume(one, 1, 1, monkeypatch)
    assert parallelized(one).endswith("precision fp32 activation checkpointing none compile True")
    assert_close(one, reference_run, COMPILE_TOLERANCE)

    four = make_run_dir(tmp_path / "four", config, world_size=4, micro_batch=2)
    train(four, 4, 2)  # resuming is the one rank's to show: each of these ranks traces the model again
    assert parallelized(four).startswith("sharding full mesh (4,) precision fp32")
    assert parallelized(four).endswith("compile True")
    assert_close(four, reference_run, COMPILE_TOLERANCE)


def test_bf16_trains_on_cpu_when_asked_for(tmp_path, reference_config, reference_run, monkeypatch):
    run_dir = make_run_dir(tmp_path / "bf16", {**reference_config, "parallel": {"precision": "bf16"}}, world_size=2,
                           micro_batch=2)
    crash_then_resume(run_dir, 2, 2, monkeypatch)
    assert parallelized(run_dir) == "sharding full mesh (2,) precision bf16 activation checkpointing none compile False"
    assert_close(run_dir, reference_run, BF16_TOLERANCE)
    assert losses(run_dir) != losses(reference_run)  # bf16 did run: its rounding shows
    assert " precision fp32 " in parallelized(reference_run)  # while auto, the default, stays fp32 on CPU
