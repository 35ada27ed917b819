"""On a cluster whose GPUs are real, a rank whose torch sees no CUDA device (a CPU build of torch, a driver
it cannot use) fails its preflight check with that cause, a node problem, instead of training on the CPU
over gloo at a fraction of the speed. Only a cluster whose file says its GPUs are virtual (the local ones)
trains on CPU processes."""
from __future__ import annotations


import torch
from omegaconf import OmegaConf

import pytest

from support.helpers import REPO
from support.helpers import events as read_events
from launcher.compose.composer import compose_runs
from support.train_harness import launch_ranks, make_run_dir, make_tokens, tiny_config

# The cluster tier without Slurm: real multi-rank training on gloo, seconds of CPU a test (docs/development.md).
pytestmark = pytest.mark.slurm


def test_a_rank_without_cuda_on_a_real_gpu_cluster_fails_preflight_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # the ranks (fresh processes) see none of this machine's GPUs
    config = {**tiny_config(make_tokens(tmp_path / "tokens.bin")), "cluster": {"virtual_gpus": False}}
    run_dir = make_run_dir(tmp_path / "run", config, world_size=1, micro_batch=2)
    (result,) = launch_ranks(["-m", "launcher.train", str(run_dir)], world_size=1)
    assert result.returncode != 0
    events = read_events(run_dir)
    (failed,) = [e for e in events if e["event"] == "preflight_failed"]
    assert failed["problem"].startswith(f"torch {torch.__version__} sees no CUDA device on ")
    assert failed["problem"].endswith("this cluster's GPUs are real (cluster.virtual_gpus=false), so it does "
                                      "not train on the CPU")
    assert not (run_dir / "metrics.jsonl").exists()  # not a single step on the CPU


def test_only_the_local_clusters_say_their_gpus_are_virtual(monkeypatch):
    monkeypatch.setenv("LAUNCHER_SITE_CONFIG", str(REPO / "slurm" / "site"))  # where local2 lives
    virtual = {name: compose_runs([f"cluster={name}", "gpus=2"])[0].config.cluster.virtual_gpus
               for name in ("local", "local2", "slurm")}
    assert virtual == {"local": True, "local2": True, "slurm": False}
    assert OmegaConf.structured(compose_runs(["gpus=2"])[0].config).cluster.virtual_gpus is True  # the default
