"""The training loop: accumulation, eval, checkpoints, metrics (the optimizer is launcher/train/optim.py).

One optimizer step consumes ``global_batch`` sequences: each rank takes its share
in ``grad_accum`` micro-batches of ``micro_batch`` (values from plan.json). Each
micro-batch loss is divided by ``grad_accum`` and FSDP averages gradients over
ranks, so the update equals that of one big batch (the parity tests check it).
FSDP reduce-scatters every micro-batch's gradients and adds them into the sharded
gradients (as torchtitan does), so no unsharded gradient outlives its micro-batch.
Everything that decides the numbers — init, data order, LR — is a function of the
seed and the step, so a resumed run repeats an uninterrupted one exactly.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from launcher.core.config import RunConfig, TrainConfig, compute_precision
from launcher.core.heartbeats import SLOW_PHASE_S
from launcher.core.plan import Plan, flops_per_token, halved_micro_batch
from launcher.train import faults
from launcher.train.checkpoint import save_checkpoint
from launcher.train.export import Exports
from launcher.train.data import StepSampler, TokenData, token_file, val_indices
from launcher.train.dist import DistEnv, global_mean
from launcher.train.guard import check_finite
from launcher.train.metrics import MetricsLog, peak_flops, peak_memory_gb, throughput
from launcher.train.interrupt import Interrupt, Requeue
from launcher.train.model import GPT
from launcher.train.tracking import open_tracker
from launcher.train.trial import Pruning
from launcher.train.optim import build_optimizer, optimizer_step
from launcher.train.parallel import parallelize
from launcher.train.resume import Starter
from launcher.train.watchdog import Watchdog
from launcher.core.rundir import METRICS

log = logging.getLogger(__name__)

# With micro_batch "auto", the first steps after a (re)start are where memory
# peaks first: activations in step 1, activations on top of optimizer state in 2.
AUTO_PROBE_STEPS = 2

Batch = tuple[torch.Tensor, torch.Tensor]


@dataclass
class Batching:
    """How the global batch is split: ``global_batch = world_size * micro_batch * grad_accum``."""

    global_batch: int
    micro_batch: int
    grad_accum: int
    auto: bool  # halve micro_batch on out-of-memory

    @classmethod
    def from_plan(cls, plan: Plan, cfg: TrainConfig, world_size: int) -> "Batching":
        if plan.world_size != world_size:
            raise RuntimeError(f"plan.json was made for {plan.world_size} ranks but the job has {world_size}")
        batching = cls(plan.global_batch, plan.micro_batch, plan.grad_accum, cfg.micro_batch == "auto")
        if batching.micro_batch * batching.grad_accum * world_size != batching.global_batch:
            raise ValueError(f"plan.json: micro_batch {batching.micro_batch} x grad_accum {batching.grad_accum} "
                             f"x world_size {world_size} != global_batch {batching.global_batch}")
        return batching

    def halve(self) -> None:
        """The largest micro-batch at most half the current one that still divides the rank's share."""
        per_rank = self.micro_batch * self.grad_accum
        self.micro_batch = halved_micro_batch(per_rank, self.micro_batch)
        self.grad_accum = per_rank // self.micro_batch


def forward_backward(model: nn.Module, micro_batches: list[Batch]) -> torch.Tensor:
    """Accumulate gradients of this rank's mean loss over ``micro_batches``; returns that loss (detached).

    Every micro-batch's backward reduce-scatters its gradients across ranks (and,
    with hybrid sharding, all-reduces them across nodes), and FSDP adds the result
    into the sharded fp32 gradients: between micro-batches a rank holds only its
    gradient shard, never a whole unsharded gradient. The price is one
    reduce-scatter per micro-batch instead of one per step, each overlapped with
    that micro-batch's backward. Each loss is divided by the number of
    micro-batches, so the sum is the gradient of the mean over all of them.
    """
    total = torch.zeros((), device=micro_batches[0][0].device)
    for x, y in micro_batches:
        loss = model(x, y) / len(micro_batches)
        loss.backward()
        total += loss.detach()
    return total


@torch.no_grad()
def evaluate(model: nn.Module, data: TokenData, env: DistEnv, micro_batch: int, batches: int) -> float:
    """Mean loss over ``batches`` fixed val micro-batches per rank (the same ones at every evaluation)."""
    model.eval()
    total = torch.zeros((), device=env.device)
    for b in range(batches):
        indices = val_indices(b, env.rank, env.world_size, micro_batch, data.num_samples("val"))
        total += model(*_to_device(data.batch("val", indices), env.device))
    model.train()
    return global_mean(total / batches, env)


def build_model(cfg: RunConfig, env: DistEnv) -> nn.Module:
    """The GPT of ``cfg.model``, built on the meta device and materialised sharded."""
    with torch.device("meta"):
        model = GPT(cfg.model)
    return parallelize(model, cfg.parallel, env, seed=cfg.train.seed)


def train(cfg: RunConfig, plan: Plan, run_dir: Path, env: DistEnv, watchdog: Watchdog,
          interrupt: Interrupt, exports: Exports | None = None) -> dict[str, Any]:
    """Train to ``cfg.train.steps``, resuming from the newest good checkpoint; returns the final record.

    ``exports`` (the main rank's) starts the Hugging Face exports asked for after their checkpoints' saves.
    ``watchdog`` hears of every step (the step a failure is recorded at, launcher/train/task.py). When
    ``interrupt`` says Slurm's signal came, every rank saves the step just done and :class:`Requeue` ends the
    loop. A first step after a resume that does not fit the checkpoint's record sets that checkpoint aside and
    starts again from the one before (launcher/train/resume.py)."""
    tc = cfg.train
    batching = Batching.from_plan(plan, tc, env.world_size)
    data = TokenData(token_file(cfg.data), cfg.data.dtype, cfg.model.seq_len, cfg.data.val_fraction,
                     cfg.model.vocab_size)
    if tc.eval_every > 0:
        data.require("val")
    sampler = StepSampler(data.num_samples("train"), batching.global_batch, tc.seed)
    starter = Starter(run_dir, env, tc.seed, functools.partial(_build, cfg, env))
    begun = starter.start()
    model, optimizer, scheduler, start = begun.model, begun.optimizer, begun.scheduler, begun.step
    if start >= tc.steps:
        log.info("nothing to do: step %d of %d already reached", start, tc.steps)
        return {"final": True, "step": start, "steps_run": 0}

    metrics = MetricsLog(Path(run_dir) / METRICS, open_tracker(cfg, run_dir, start)) if env.is_main \
        else MetricsLog(None)
    fpt = flops_per_token(cfg.model)
    peak = peak_flops(env.device, compute_precision(cfg.parallel.precision, env.device.type == "cuda"))
    tokens_per_step = batching.global_batch * cfg.model.seq_len
    intervals: list[dict[str, Any]] = []
    record: dict[str, Any] = {}
    timer = _IntervalTimer(env.device)
    pruning = Pruning.of(run_dir, env.is_main)  # a search trial whose study may stop it early
    try:
        step = start
        while step < tc.steps:
            watchdog.step(step)
            faults.at_step(step, env.rank)
            batches = functools.partial(_rank_batches, data, sampler, env, step)
            lr = scheduler.get_last_lr()[0]
            if batching.auto and step < start + AUTO_PROBE_STEPS:
                loss, grad_norm = _step_fitting_memory(model, optimizer, scheduler, batches, batching, tc, env)
            else:
                loss = forward_backward(model, batches(batching.micro_batch))
                grad_norm = optimizer_step(model, optimizer, scheduler, tc.grad_clip)
            problem = begun.judge_first_step(step, loss, grad_norm, env)
            if problem:  # the checkpoint resumed from is damaged
                model = optimizer = scheduler = None  # freed before the previous checkpoint is loaded
                begun = starter.fall_back(begun, problem)
                model, optimizer, scheduler, start = begun.model, begun.optimizer, begun.scheduler, begun.step
                step = start
                timer.reset()
                continue
            check_finite(step, loss, grad_norm)  # before anything of this step is saved
            done, last = step + 1, step + 1 == tc.steps
            timer.steps += 1

            eval_loss = None
            if tc.eval_every > 0 and (done % tc.eval_every == 0 or last):
                with timer.paused():
                    eval_loss = evaluate(model, data, env, batching.micro_batch, tc.eval_batches)

            if last or eval_loss is not None or (tc.log_every > 0 and done % tc.log_every == 0):
                steps, seconds = timer.steps, timer.seconds()
                record = {"step": done, "loss": global_mean(loss, env), "eval_loss": eval_loss, "lr": lr,
                          "grad_norm": grad_norm.item(), "step_time": seconds / steps,
                          **throughput(tokens_per_step * steps, seconds, env.world_size, fpt, peak),
                          "peak_mem_gb": peak_memory_gb(env.device)}
                metrics.write(record)
                watchdog.measured(record["step_time"])
                intervals.append({"steps": steps, "seconds": seconds})
                timer.reset()
            if pruning and eval_loss is not None and pruning_said(pruning, done, record, env) and not last:
                record = {**record, "pruned": True}
                break

            interrupted = not last and interrupt.agreed()  # Slurm's time-limit or preemption signal
            if last or interrupted or (tc.checkpoint_every > 0 and done % tc.checkpoint_every == 0):
                with timer.paused(), watchdog.phase(SLOW_PHASE_S):
                    save_checkpoint(run_dir, done, model, optimizer, scheduler, env, tc.keep_checkpoints,
                                    record={"loss": global_mean(loss, env), "grad_norm": grad_norm.item()})
                if exports and not interrupted and ((tc.export_every and done % tc.export_every == 0)
                                                    or (last and tc.export_final)):
                    exports.start(done)
            if interrupted:
                raise Requeue(done)
            step = done

        final = {"final": True, **record, **_overall(intervals, tokens_per_step, env, fpt, peak),
                 "steps_run": record.get("step", tc.steps) - start,
                 "resumed_from": start if begun.checkpoint is not None else None,
                 "micro_batch": batching.micro_batch, "grad_accum": batching.grad_accum}
        metrics.write(final)
        return final
    finally:
        metrics.close()


def pruning_said(pruning: Pruning, step: int, record: dict[str, Any], env: DistEnv) -> bool:
    """Whether the main rank's study pruned the trial at this evaluation, the same answer on every rank (a
    broadcast: every rank leaves the loop together, or none does)."""
    said = torch.tensor([pruning.pruned(step, record)], dtype=torch.int32, device=env.device)
    dist.broadcast(said, src=0)
    return bool(said.item())


def _build(cfg: RunConfig, env: DistEnv) -> tuple[nn.Module, torch.optim.Optimizer,
                                                 torch.optim.lr_scheduler.LRScheduler]:
    model = build_model(cfg, env)
    return (model, *build_optimizer(model, cfg.train))


def _step_fitting_memory(model: nn.Module, optimizer: torch.optim.Optimizer,
                         scheduler: torch.optim.lr_scheduler.LRScheduler, batches: Callable[[int], list[Batch]],
                         batching: Batching,
                         tc: TrainConfig, env: DistEnv) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step, halving the micro-batch until every rank fits it in memory.

    All ranks vote after each attempt (an all-reduced flag), so they halve
    together and keep running the same collectives. This relies on ranks running
    out of memory alike, which they do since they run the same shapes; a lone
    out-of-memory in the middle of FSDP's collectives would hang the job instead.
    """
    while True:
        result, failed = None, torch.zeros(1, device=env.device)
        try:
            loss = forward_backward(model, batches(batching.micro_batch))
            result = loss, optimizer_step(model, optimizer, scheduler, tc.grad_clip)
        except torch.OutOfMemoryError:
            failed += 1
            optimizer.zero_grad(set_to_none=True)
            if env.device.type == "cuda":
                torch.cuda.empty_cache()
        dist.all_reduce(failed)
        if not failed.item():
            log.info("micro_batch auto: %d (grad_accum %d) fits", batching.micro_batch, batching.grad_accum)
            return result
        if batching.micro_batch == 1:
            raise RuntimeError(f"out of memory on {int(failed.item())} rank(s) even at micro_batch 1: "
                               "use a smaller model or seq_len, more GPUs, or activation checkpointing")
        batching.halve()
        log.warning("out of memory on %d rank(s): micro_batch now %d, grad_accum %d",
                    int(failed.item()), batching.micro_batch, batching.grad_accum)


def _overall(intervals: list[dict[str, Any]], tokens_per_step: int, env: DistEnv, fpt: int,
             peak: float | None) -> dict[str, Any]:
    """Throughput of the whole run, leaving out the first interval (warm-up, compilation) when there are others."""
    steady = intervals[1:] or intervals
    steps, seconds = sum(i["steps"] for i in steady), sum(i["seconds"] for i in steady)
    return {**throughput(tokens_per_step * steps, seconds, env.world_size, fpt, peak),
            "step_time": seconds / steps, "train_seconds": sum(i["seconds"] for i in intervals),
            "peak_mem_gb": peak_memory_gb(env.device)}


def _rank_batches(data: TokenData, sampler: StepSampler, env: DistEnv, step: int, micro_batch: int) -> list[Batch]:
    """This rank's micro-batches of ``step``, on its device."""
    return [_to_device(data.batch("train", idx), env.device)
            for idx in sampler.micro_batches(step, env.rank, env.world_size, micro_batch)]


def _to_device(batch: tuple[np.ndarray, np.ndarray], device: torch.device) -> Batch:
    x, y = batch
    return torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)


class _IntervalTimer:
    """Training time and steps since the last metrics record, evaluation and checkpointing left out."""

    def __init__(self, device: torch.device):
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.start, self.excluded, self.steps = time.perf_counter(), 0.0, 0

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        start = _synced_time(self.device)
        yield
        self.excluded += time.perf_counter() - start

    def seconds(self) -> float:
        return _synced_time(self.device) - self.start - self.excluded


def _synced_time(device: torch.device) -> float:
    """Wall time once queued GPU work is done, so intervals measure work, not launches."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()
