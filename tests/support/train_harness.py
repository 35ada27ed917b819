"""Shared helpers of the test_train_* tests: tiny run directories and real multi-process launches.

Ranks are separate processes given torchrun-style variables (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) and one thread each, on
gloo: what launcher/train/dist.py reads without Slurm. :func:`launch` starts fresh
interpreters (``python -m launcher.train``, the real entry); :func:`launch_forked` forks
them from the test process, which has already imported torch, so a 4-rank run
costs no 4 x 4 s of imports on a 2-core machine.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf

from launcher.core.config import RunConfig, load_run_config
from launcher.core.plan import PLAN, Plan
from launcher.compose.layout import single_node_plan
from launcher.core.run_index import RunRecord, save_record
from launcher.train.data import encode_bytes, stdlib_sources, write_tokens

ROOT = Path(__file__).resolve().parents[2]


def tiny_config(token_path: Path, **train) -> dict:
    """A config small enough that a step takes milliseconds on one CPU thread."""
    return {
        "model": {"name": "test_tiny", "d_model": 32, "n_heads": 2, "n_layers": 2, "seq_len": 32, "vocab_size": 256},
        "train": {"steps": 4, "global_batch": 8, "micro_batch": 2, "lr": 1e-3, "warmup_steps": 2, "log_every": 1,
                  "eval_every": 0, "checkpoint_every": 0, **train},
        "data": {"path": str(token_path), "dtype": "uint16"},
        "cluster": {"virtual_gpus": True},  # ranks on the CPU, as on the local cluster
    }


def make_tokens(path: Path, files: int = 20) -> Path:
    """Byte-level tokens of a few standard-library sources: real text, written in well under a second."""
    write_tokens(path, (encode_bytes(f.read_bytes(), "uint16") for f in stdlib_sources()[:files]), "uint16")
    return path


def make_run_dir(run_dir: Path, config: dict, world_size: int, micro_batch: int) -> Path:
    """config.yaml and plan.json as the launcher would write them, for ``world_size`` ranks on one node
    starting at ``micro_batch``."""
    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(OmegaConf.merge(OmegaConf.structured(RunConfig), config), run_dir / "config.yaml")
    (run_dir / PLAN).write_text(json.dumps(plan_for(run_dir, world_size, micro_batch).to_dict()))
    return run_dir


def plan_for(run_dir: Path, world_size: int, micro_batch: int) -> Plan:
    """The plan of ``run_dir``'s config.yaml on ``world_size`` ranks at ``micro_batch`` (``auto`` kept)."""
    cfg = load_run_config(run_dir / "config.yaml")
    fixed = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, micro_batch=micro_batch))
    return dataclasses.replace(single_node_plan(fixed, world_size), micro_batch_auto=cfg.train.micro_batch == "auto")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_environ(rank: int, world_size: int, local_world_size: int, port: int) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank % local_world_size),
            "LOCAL_WORLD_SIZE": str(local_world_size), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1"}


def launch_forked(target, args: tuple, world_size: int, local_world_size: int | None = None,
                  timeout: float = 600) -> None:
    """Run ``target(*args)`` in ``world_size`` forked rank processes; raises with a failing rank's traceback."""
    port = free_port()
    ctx = mp.start_processes(_forked_rank, (target, args, world_size, local_world_size or world_size, port),
                             nprocs=world_size, join=False, start_method="fork")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(max(0.0, deadline - time.monotonic())):  # raises if a rank failed
            if time.monotonic() >= deadline:
                raise TimeoutError(f"ranks still running after {timeout} s: {target.__name__}")
    finally:
        for proc in ctx.processes:
            if proc.is_alive():
                proc.kill()
                proc.join()


def _forked_rank(rank: int, target, args: tuple, world_size: int, local_world_size: int, port: int) -> None:
    for var in [v for v in os.environ if v.startswith("SLURM_")]:
        del os.environ[var]
    os.environ.update(rank_environ(rank, world_size, local_world_size, port))
    torch.set_num_threads(1)
    target(*args)


def start_ranks(argv: list[str], world_size: int, local_world_size: int | None = None) -> list[subprocess.Popen]:
    """Start ``python argv...`` as ``world_size`` ranks on this machine (their output piped)."""
    local_world_size = local_world_size or world_size
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = {**os.environ, **rank_environ(rank, world_size, local_world_size, port),
               "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
        for var in [v for v in env if v.startswith("SLURM_")]:
            del env[var]
        procs.append(subprocess.Popen([sys.executable, *argv], cwd=ROOT, env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return procs


def launch_ranks(argv: list[str], world_size: int, local_world_size: int | None = None,
           timeout: float = 600) -> list[subprocess.CompletedProcess]:
    """Run ``python argv...`` as ``world_size`` ranks on this machine; returns each rank's result."""
    procs = start_ranks(argv, world_size, local_world_size)
    results = []
    try:
        for rank, proc in enumerate(procs):
            out, _ = proc.communicate(timeout=timeout)
            results.append(subprocess.CompletedProcess(proc.args, proc.returncode, out))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def check_ok(results: list[subprocess.CompletedProcess]) -> None:
    failed = [(rank, r) for rank, r in enumerate(results) if r.returncode != 0]
    assert not failed, "\n".join(f"--- rank {rank} exit {r.returncode}\n{r.stdout[-4000:]}" for rank, r in failed)


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def as_run(root: Path, name: str, source: Path) -> Path:
    """A copy of a training harness run directory, recorded as a launcher run named ``name``."""
    run_dir = root / name
    shutil.copytree(source, run_dir)
    save_record(RunRecord(name=name, run_dir=str(run_dir), model="test_tiny", gpus=2, nodes=1, gpus_per_node=2,
                          steps=6, cluster="local", submitted_at=time.time()))
    return run_dir
