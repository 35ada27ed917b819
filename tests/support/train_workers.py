"""Rank bodies for the tests, run in forked processes by train_harness.launch_forked."""
from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from launcher.core.config import DataConfig, ModelConfig, ParallelConfig, RunConfig, TrainConfig
from launcher.train import checkpoint, task
from launcher.train.data import StepSampler, TokenData
from launcher.train.dist import check_allreduce, init_distributed
from launcher.train.loop import build_model, forward_backward, global_mean
from launcher.train.optim import build_optimizer, clip_grad_norm, optimizer_step


def run_config(raw: dict) -> RunConfig:
    return RunConfig(model=ModelConfig(**raw["model"]), train=TrainConfig(**raw["train"]),
                     data=DataConfig(**raw["data"]), parallel=ParallelConfig(**raw.get("parallel", {})))


def _full(grad: torch.Tensor) -> torch.Tensor:
    return grad.full_tensor() if isinstance(grad, DTensor) else grad


def parity(raw: dict, micro_batch: int, out_dir: Path) -> None:
    """A few optimizer steps through launcher/train/'s own pieces; rank 0 saves, per step, the global
    loss, the gradient norm and every full (unsharded) gradient, plus the all-reduce check."""
    cfg = run_config(raw)
    task.setup_logging(out_dir, int(os.environ["RANK"]))
    env = init_distributed(timeout_s=60)
    allreduce = check_allreduce(env)
    data = TokenData(cfg.data.path, cfg.data.dtype, cfg.model.seq_len, cfg.data.val_fraction, cfg.model.vocab_size)
    sampler = StepSampler(data.num_samples("train"), cfg.train.global_batch, cfg.train.seed)
    model = build_model(cfg, env)
    optimizer, scheduler = build_optimizer(model, cfg.train)
    steps = []
    for step in range(cfg.train.steps):
        batches = [tuple(torch.from_numpy(a) for a in data.batch("train", idx))
                   for idx in sampler.micro_batches(step, env.rank, env.world_size, micro_batch)]
        loss = forward_backward(model, batches)
        # clone: with one rank full_tensor() (or the unwrapped model's own gradient, launcher/train/parallel.py) is
        # the gradient itself, which clipping scales in place.
        grads = {name.replace("_checkpoint_wrapped_module.", ""): _full(p.grad).clone()
                 for name, p in model.named_parameters()}
        grad_norm = optimizer_step(model, optimizer, scheduler, cfg.train.grad_clip)
        steps.append({"loss": global_mean(loss, env), "grad_norm": grad_norm.item(), "grads": grads})
    if env.rank == 0:
        torch.save({"steps": steps, "allreduce": allreduce, "nodes": env.nodes}, out_dir / "parity.pt")
    dist.destroy_process_group()


def clipping(raw: dict, micro_batch: int, out_dir: Path) -> None:
    """One batch's gradients clipped twice from the same values, by torch's ``clip_grad_norm_`` (on the DTensors)
    and by launcher/train/optim.py's (on the local shards), at a bound below their norm and one above it; rank 0
    saves both norms and both full gradients of each bound."""
    cfg = run_config(raw)
    task.setup_logging(out_dir, int(os.environ["RANK"]))
    env = init_distributed(timeout_s=60)
    data = TokenData(cfg.data.path, cfg.data.dtype, cfg.model.seq_len, cfg.data.val_fraction, cfg.model.vocab_size)
    sampler = StepSampler(data.num_samples("train"), cfg.train.global_batch, cfg.train.seed)
    model = build_model(cfg, env)
    forward_backward(model, [tuple(torch.from_numpy(a) for a in data.batch("train", idx))
                             for idx in sampler.micro_batches(0, env.rank, env.world_size, micro_batch)])
    params = list(model.parameters())
    before = [p.grad.detach().clone() for p in params]
    results = {}
    for bound in (1e-3, 1e9):
        for name, clip in (("torch", torch.nn.utils.clip_grad_norm_), ("ours", clip_grad_norm)):
            for p, g in zip(params, before):
                p.grad = g.clone()
            norm = clip(params, bound)
            results[(name, bound)] = {"norm": _full(norm).item(), "grads": [_full(p.grad) for p in params]}
    if env.rank == 0:
        torch.save(results, out_dir / "clipping.pt")
    dist.destroy_process_group()


def train_run(run_dir: Path) -> None:
    """``python -m launcher.train RUN_DIR`` in this (forked) process."""
    task.run(run_dir)


def train_run_counting_reads(run_dir: Path) -> None:
    """Like :func:`train_run`; then writes how often this rank's host read the device (RUN/reads_<rank>). The
    ranks' agreements on Slurm's signal are not held to 10 s of steps (with a long ``cluster.signal_delay_s``), so
    that they come at the steps their doubling sets, whatever the machine's load: 1, 2, 4, 8, 16, 32..."""
    from launcher.train import host_sync, interrupt

    interrupt.CHECK_WITHIN_S = 1e9
    host_sync.reads = 0  # what the forking process counted is not this rank's
    task.run(run_dir)
    (run_dir / f"reads_{os.environ['RANK']}").write_text(str(host_sync.reads))


def train_run_preempted_in_export(run_dir: Path, step: int) -> None:
    """Like :func:`train_run`, but Slurm's preemption signal reaches the main rank just after the export of
    ``step`` has started, as a preemption would while it runs: the attempt saves and ends requeued. The export
    sleeps a minute before it begins, so that it is surely running when the attempt ends."""
    import signal
    import subprocess
    import sys

    from launcher.core import preemption
    from launcher.train.hf_export import Exports

    real_start, real_popen = Exports.start, subprocess.Popen

    def slow_export(argv, **kwargs):
        if argv[1:3] == ["-m", "launcher.train.hf_export"]:
            argv = [sys.executable, "-c", "import runpy, sys, time; time.sleep(60); sys.argv[0] = 'export'; "
                    "runpy.run_module('launcher.train.hf_export', run_name='__main__')", *argv[3:]]
        return real_popen(argv, **kwargs)

    def start_then_preempted(self, done):
        real_start(self, done)
        if done == step:
            signal.raise_signal(preemption.SIGNAL)

    subprocess.Popen, Exports.start = slow_export, start_then_preempted
    task.run(run_dir)


def train_run_killed_in_save(run_dir: Path, crash_step: int) -> None:
    """Like :func:`train_run`, but the save of ``crash_step`` dies after a partial write.

    Every rank finishes its DCP shard write, cuts its shard file in half and
    exits at once (like a SIGKILL): no RNG files, no meta.json, no rename.
    """
    real_save = checkpoint.dcp.save

    def save_then_die(state, *, checkpoint_id):
        real_save(state, checkpoint_id=checkpoint_id)
        if Path(checkpoint_id).name == f"step_{crash_step:08d}.tmp":
            shard = next(Path(checkpoint_id).glob(f"__{int(os.environ['RANK'])}_*.distcp"))
            shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
            os._exit(9)

    checkpoint.dcp.save = save_then_die
    task.run(run_dir)


def train_run_peer_lost_in_save(run_dir: Path, lost_step: int) -> None:
    """Like :func:`train_run`, but rank 1 dies at once (as if SIGKILLed) as the save of ``lost_step`` begins,
    while rank 0 enters the save's collectives. Run it with train_harness.launch_ranks, which lets rank 0 go on
    to its own end, not with launch_forked, which would kill it when rank 1 dies."""
    real_save = checkpoint.dcp.save

    def die_in_save(state, *, checkpoint_id):
        if Path(checkpoint_id).name == f"step_{lost_step:08d}.tmp" and os.environ["RANK"] == "1":
            os._exit(9)
        real_save(state, checkpoint_id=checkpoint_id)

    checkpoint.dcp.save = die_in_save
    task.run(run_dir)


def train_run_oom_above(run_dir: Path, max_rows: int) -> None:
    """Like :func:`train_run`, but every block raises out-of-memory on micro-batches above ``max_rows``,
    after FSDP has gathered its parameters, as a real one would."""
    from launcher.train.model import Block

    real_forward = Block.forward

    def forward(self, x):
        if x.shape[0] > max_rows:
            raise torch.OutOfMemoryError(f"fake: {x.shape[0]} rows")
        return real_forward(self, x)

    Block.forward = forward
    task.run(run_dir)


def allreduce_with_watchdog(run_dir: Path, stop_rank: int, stop_at: int, timeout_s: float,
                            watch_neighbours: bool = False) -> None:
    """All-reduce steps under a watchdog; rank ``stop_rank`` stops itself (SIGSTOP) at step ``stop_at``,
    as a hung rank would: the others wait in the collective until the watchdog ends them. With
    ``watch_neighbours`` each watchdog also watches the other ranks' processes (all on this node)."""
    import signal
    import time

    from launcher.core.events import Stalled
    from launcher.core.rundir import append_event
    from launcher.train.watchdog import Watchdog

    env = init_distributed(timeout_s=300)
    task.setup_logging(run_dir, env.rank)

    def on_stall(cause, stuck):
        append_event(run_dir, Stalled(cause=cause, ranks=[p.rank for p in stuck]))

    watchdog = Watchdog(run_dir, env.rank, env.node, timeout_s, on_stall, interval_s=0.5,
                        neighbours=range(env.world_size) if watch_neighbours else ()).start(0)
    for step in range(1000):
        watchdog.step(step)
        if env.rank == stop_rank and step == stop_at:
            time.sleep(1.0)  # its watchdog beats once more, with this step
            os.kill(os.getpid(), signal.SIGSTOP)
        dist.all_reduce(torch.ones(1))
        time.sleep(0.01)


def spoil_checkpoint(run_dir: Path, step: int, factor: float) -> None:
    """Multiply the weights saved in ``run_dir``'s checkpoint of ``step`` by ``factor`` and save it again in
    its place through launcher/train/checkpoint.py, so that its manifests (launcher/train/manifest.py) match the spoiled
    files and its meta.json keeps the step's record: damage no checksum can find, only the first step."""
    import shutil

    from launcher.core.checkpoints import step_dir
    from launcher.core.config import load_run_config

    cfg = load_run_config(run_dir / "config.yaml")
    env = init_distributed(timeout_s=60)
    model = build_model(cfg, env)
    optimizer, scheduler = build_optimizer(model, cfg.train)
    path = step_dir(run_dir, step)
    checkpoint.load_checkpoint(path, model, optimizer, scheduler, env)
    with torch.no_grad():
        for param in model.parameters():
            param.mul_(factor)
    spoiled = run_dir / "spoiled"
    checkpoint.save_checkpoint(spoiled, step, model, optimizer, scheduler, env, keep=1,
                               reference=checkpoint.reference(path))
    if env.rank == 0:
        shutil.rmtree(path)
        step_dir(spoiled, step).rename(path)
        shutil.rmtree(spoiled)
    dist.barrier()
    dist.destroy_process_group()
