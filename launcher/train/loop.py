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
import itertools
import logging
import os
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
from launcher.train import faults, host_sync
from launcher.train.checkpoint import save_checkpoint
from launcher.train.hf_export import Exports
from launcher.train.data import StepSampler, Stream, TokenData, open_stream, rank_eval_batches, token_file
from launcher.train.shard_cache import Counters
from launcher.train.dist import DistEnv, global_mean
from launcher.train.guard import Checks
from launcher.train.metrics import MetricsLog, peak_flops, peak_memory_gb, throughput
from launcher.train.interrupt import Interrupt, Interrupted
from launcher.train.model import GPT
from launcher.train.tracking import open_tracker
from launcher.train.trial import Pruning
from launcher.train.optim import build_optimizer, optimizer_step
from launcher.train.parallel import parallelize
from launcher.train.resume import Start, Starter
from launcher.train.watchdog import Watchdog
from launcher.core.events import Ready
from launcher.core.metrics import EvalRow, FinalRow, PrunedRow, Row
from launcher.core.rundir import METRICS, append_event

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
def evaluate(model: nn.Module, data: TokenData, env: DistEnv, micro_batch: int, windows: np.ndarray) -> float:
    """The mean loss per token over the val ``windows`` (``TokenData.eval_windows``), which the ranks split; a rank
    whose share runs out first still takes part in every sharded forward pass, on a window it then weighs 0."""
    model.eval()
    total = torch.zeros(1, dtype=torch.float64, device=env.device)  # the windows' losses summed
    for batch in rank_eval_batches(windows, env.rank, env.world_size, micro_batch):
        loss = model(*_to_device(data.batch("val", batch if len(batch) else windows[:1]), env.device))
        total += loss.double() * len(batch)
    model.train()
    dist.all_reduce(total)
    return host_sync.read(total)[0] / len(windows)


def build_model(cfg: RunConfig, env: DistEnv) -> nn.Module:
    """The GPT of ``cfg.model``, built on the meta device and materialised sharded."""
    with torch.device("meta"):
        model = GPT(cfg.model)
    return parallelize(model, cfg.parallel, env, seed=cfg.train.seed)


def train(cfg: RunConfig, plan: Plan, run_dir: Path, env: DistEnv, watchdog: Watchdog,
          interrupt: Interrupt, exports: Exports | None = None) -> FinalRow:
    """Train to ``cfg.train.steps``, resuming from the newest good checkpoint; returns the final metrics row.

    The loop is the step; the components around it own their cadence: :class:`Guards` (the watchdog's beat,
    fault drills, finiteness), :class:`Evaluator`, :class:`Metrics` (timing and the rows of metrics.jsonl) and
    :class:`Checkpointer` (saves, exports, and Slurm's signals or a user's stop, on which every rank saves the step
    just done and :class:`Interrupted` ends the loop). The first step after a resume is checked before the loop
    (:func:`first_step`), so the loop never rewinds."""
    tc = cfg.train
    batching = Batching.from_plan(plan, tc, env.world_size)
    stream = open_stream(cfg.data, env.world_size // env.nodes)
    data = TokenData(token_file(cfg.data), cfg.data.dtype, cfg.model.seq_len, cfg.data.val_fraction,
                     cfg.model.vocab_size, stream)
    if tc.eval_every > 0:
        data.require("val")
    starter = Starter(run_dir, env, tc.seed, functools.partial(_build, cfg, env))
    begun = starter.start()
    if begun.checkpoint is not None:  # until this attempt saves, a save is taken to last as long as this load
        interrupt.saved_in(begun.load_s)
    if begun.step >= tc.steps:
        log.info("nothing to do: step %d of %d already reached", begun.step, tc.steps)
        return FinalRow(step=begun.step, steps_run=0)
    guards = Guards(watchdog, env, Checks(env.device))
    steps = Steps(begun, batching, data, data.sampler(batching.global_batch, tc.seed), tc, env, guards)
    metrics = Metrics(cfg, batching, env, watchdog, MetricsLog(Path(run_dir) / METRICS, open_tracker(
        cfg, run_dir, begun.step)) if env.is_main else MetricsLog(None), stream)
    evaluator, pruning = Evaluator(tc, data, env, batching, metrics.timer), Pruning.of(run_dir, env.is_main)
    checkpointer = Checkpointer(run_dir, tc, env, interrupt, watchdog, exports, metrics.timer)
    try:
        began = time.perf_counter()
        first = first_step(starter, steps, metrics.timer)
        if env.is_main:  # the rest of the bring-up (launcher/train/task.py recorded the start of it)
            append_event(run_dir, Ready(job_id=os.environ.get("SLURM_JOB_ID"), build_s=round(steps.begun.build_s, 3),
                                        load_s=round(steps.begun.load_s, 3),
                                        first_step_s=round(time.perf_counter() - began, 3)))
        for result in itertools.chain([first], map(steps.run, range(first.step + 1, tc.steps))):
            done, last = result.step + 1, result.step + 1 == tc.steps
            # read on the host only where a component reads the device anyway: before anything is written
            guards.check(result, read=any(c.due(done, last) for c in (evaluator, metrics, checkpointer)))
            eval_loss = evaluator.after(done, last, steps.begun.model)
            row = metrics.after(result, done, last, eval_loss)
            if pruning and eval_loss is not None and pruning_said(pruning, done, row, env) and not last:
                metrics.pruned = True
                break
            checkpointer.after(result, done, last, steps.begun)
        return metrics.final(steps.begun, batching)
    finally:
        metrics.close()
        if stream is not None:
            stream.cache.close()


@dataclass
class StepResult:
    """One optimizer step: which (``step`` optimizer steps were done before it), its learning rate, this rank's
    loss and the gradient norm (the same on every rank), and the CRC sum of this rank's samples
    (launcher/train/data.py ``TokenData.crc``)."""

    step: int
    lr: float
    loss: torch.Tensor
    grad_norm: torch.Tensor
    crc: int


@dataclass
class Guards:
    """What every step is checked by: the watchdog hears it begin and a fault drill may strike (before), and
    its loss and gradient norm must be finite (after: noted on the device, read by the host when ``read``,
    launcher/train/guard.py)."""

    watchdog: Watchdog
    env: DistEnv
    finite: Checks

    def before(self, step: int) -> None:
        self.watchdog.step(step)
        faults.at_step(step, self.env.rank)

    def check(self, result: StepResult, read: bool) -> None:
        self.finite.note(result.step, result.loss, result.grad_norm)
        if read:
            self.finite.read()


@dataclass
class Steps:
    """Trains one step of ``begun``'s model at a time: this rank's micro-batches, forward and backward, the
    optimizer's step. With ``micro_batch`` auto, the first steps after the start halve the micro-batch until it
    fits in memory."""

    begun: Start
    batching: Batching
    data: TokenData
    sampler: StepSampler
    tc: TrainConfig
    env: DistEnv
    guards: Guards

    prepared: tuple[int, int, list[Batch]] | None = None  # the next step's batches: its step, micro-batch, them

    def run(self, step: int) -> StepResult:
        self.guards.before(step)
        self.data.ahead(self.sampler, step, self.tc.steps)
        begun, batching = self.begun, self.batching
        lr = begun.scheduler.get_last_lr()[0]
        if batching.auto and step < begun.step + AUTO_PROBE_STEPS:
            loss, grad_norm = _step_fitting_memory(begun.model, begun.optimizer, begun.scheduler,
                                                   functools.partial(self.batches, step), batching, self.tc, self.env)
        else:
            loss = forward_backward(begun.model, self.batches(step, batching.micro_batch))
            if step + 1 < self.tc.steps:  # read and copied while this step's work runs on the GPU
                self.prepared = step + 1, batching.micro_batch, self.batches(step + 1, batching.micro_batch)
            grad_norm = optimizer_step(begun.model, begun.optimizer, begun.scheduler, self.tc.grad_clip)
        crc = self.data.crc("train", self.sampler.share(step, self.env.rank, self.env.world_size))
        return StepResult(step, lr, loss, grad_norm, crc)

    def batches(self, step: int, micro_batch: int) -> list[Batch]:
        """This rank's micro-batches of ``step``, on its device: those prepared during the step before, if any."""
        prepared, self.prepared = self.prepared, None
        if prepared and prepared[:2] == (step, micro_batch):
            return prepared[2]
        return [_to_device(self.data.batch("train", idx), self.env.device)
                for idx in self.sampler.micro_batches(step, self.env.rank, self.env.world_size, micro_batch)]


def first_step(starter: Starter, steps: Steps, timer: _IntervalTimer) -> StepResult:
    """Train the first step from where ``steps`` begins, checked against the checkpoint resumed from
    (launcher/train/resume.py): a step that does not fit sets that checkpoint aside, and training starts again
    from the one before, until a first step fits. The step that fits is the first trained step."""
    while True:
        result = steps.run(steps.begun.step)
        problem = steps.begun.judge_first_step(result.step, result.loss, result.grad_norm, steps.env)
        if not problem:
            return result
        del result
        steps.begun = starter.fall_back(steps.begun, problem)
        timer.reset()


class Evaluator:
    """Evaluates every ``train.eval_every`` steps and after the last one, its time left out of the step times."""

    def __init__(self, tc: TrainConfig, data: TokenData, env: DistEnv, batching: Batching, timer: _IntervalTimer):
        self.tc, self.data, self.env, self.batching, self.timer = tc, data, env, batching, timer
        self.windows = data.eval_windows(tc.eval_batches * batching.global_batch) \
            if tc.eval_every > 0 else np.empty(0, dtype=np.int64)

    def due(self, done: int, last: bool) -> bool:
        every = self.tc.eval_every
        return every > 0 and (done % every == 0 or last)

    def after(self, done: int, last: bool, model: nn.Module) -> float | None:
        """The held-out loss after ``done`` steps, when one is due."""
        if not self.due(done, last):
            return None
        with self.timer.paused():
            return evaluate(model, self.data, self.env, self.batching.micro_batch, self.windows)


class Metrics:
    """The run's timing and its metrics rows (launcher/core/metrics.py): one every ``train.log_every`` steps, at each
    evaluation and after the last step, and the final summary."""

    def __init__(self, cfg: RunConfig, batching: Batching, env: DistEnv, watchdog: Watchdog, writer: MetricsLog,
                 stream: Stream | None = None):
        self.tc, self.env, self.watchdog, self.writer, self.stream = cfg.train, env, watchdog, writer, stream
        self.fpt = flops_per_token(cfg.model)
        self.peak = peak_flops(env.device, compute_precision(cfg.parallel.precision, env.device.type == "cuda"))
        self.tokens_per_step = batching.global_batch * cfg.model.seq_len
        self.timer = _IntervalTimer(env.device)
        self.intervals: list[dict[str, Any]] = []
        self.row: Row | None = None
        self.pruned = False  # a search's pruner stopped the trial at the newest row's step

    def due(self, done: int, last: bool) -> bool:
        """Whether a row is due after ``done`` steps (at an evaluation too: :meth:`after`)."""
        return last or (self.tc.log_every > 0 and done % self.tc.log_every == 0)

    def after(self, result: StepResult, done: int, last: bool, eval_loss: float | None) -> Row | None:
        """Count the step; write a row of metrics.jsonl when one is due (an evaluation's where ``eval_loss`` is
        set). Returns the newest row."""
        self.timer.steps += 1
        if eval_loss is not None or self.due(done, last):
            steps, seconds = self.timer.steps, self.timer.seconds()
            loss, crc = loss_and_batch(result, self.env)
            kind = Row if eval_loss is None else EvalRow
            self.row = kind(step=done, loss=loss, eval_loss=eval_loss, lr=result.lr,
                            grad_norm=host_sync.read(result.grad_norm), batch_crc=crc, step_time=seconds / steps,
                            **throughput(self.tokens_per_step * steps, seconds, self.env.world_size, self.fpt,
                                         self.peak),
                            peak_mem_gb=peak_memory_gb(self.env.device),
                            **(stream_row(self.stream.cache.counters, self.env) if self.stream is not None else {}))
            self.writer.write(self.row)
            self.watchdog.measured(seconds / steps)
            self.intervals.append({"steps": steps, "seconds": seconds})
            self.timer.reset()
        return self.row

    def final(self, begun: Start, batching: Batching) -> FinalRow:
        """The final row (written, and returned): the last row, the whole run's throughput, where it
        resumed from and the micro-batch it trained with."""
        last = self.row if self.row is not None else Row(step=self.tc.steps)
        kind = PrunedRow if self.pruned else FinalRow
        final = kind.after(last, **_overall(self.intervals, self.tokens_per_step, self.env, self.fpt, self.peak),
                           steps_run=last.step - begun.step,
                           resumed_from=begun.step if begun.checkpoint is not None else None,
                           micro_batch=batching.micro_batch, grad_accum=batching.grad_accum)
        self.writer.write(final)
        return final

    def close(self) -> None:
        self.writer.close()


class Checkpointer:
    """Saves every ``train.checkpoint_every`` steps, after the last step, and when Slurm's signal came or a user
    asked the run to stop (the ranks agree on it at every save and every few seconds of steps,
    launcher/train/interrupt.py: then the step just done is saved and :class:`Interrupted` ends training); times
    each save, which a save on Slurm's SIGTERM must fit; starts the exports asked for after their checkpoints'
    saves."""

    def __init__(self, run_dir: Path, tc: TrainConfig, env: DistEnv, interrupt: Interrupt, watchdog: Watchdog,
                 exports: Exports | None, timer: _IntervalTimer):
        self.run_dir, self.tc, self.env, self.interrupt, self.watchdog = run_dir, tc, env, interrupt, watchdog
        self.exports, self.timer = exports, timer

    def saves(self, done: int, last: bool) -> bool:
        return last or (self.tc.checkpoint_every > 0 and done % self.tc.checkpoint_every == 0)

    def due(self, done: int, last: bool) -> bool:
        """Whether this boundary saves, or the ranks agree at it on Slurm's signals and a user's stop."""
        return self.saves(done, last) or self.interrupt.due(done)

    def after(self, result: StepResult, done: int, last: bool, begun: Start) -> None:
        tc = self.tc
        # Slurm's signals or a user's stop, agreed on at every save and every few seconds of steps
        why = self.interrupt.agreed(done) if not last and self.due(done, last) else None
        if why is not None or self.saves(done, last):
            began = time.perf_counter()
            with self.timer.paused(), self.watchdog.phase(SLOW_PHASE_S):
                save_checkpoint(self.run_dir, done, begun.model, begun.optimizer, begun.scheduler, self.env,
                                tc.keep_checkpoints, reference={"loss": global_mean(result.loss, self.env),
                                                                "grad_norm": host_sync.read(result.grad_norm)})
            self.interrupt.saved_in(time.perf_counter() - began)  # what a save on Slurm's SIGTERM must fit
            if self.exports and ((tc.export_every and done % tc.export_every == 0) or (last and tc.export_final)):
                (self.exports.start if why is None else self.exports.defer)(done)  # the attempt ends: the next
        if why is not None:
            raise Interrupted(done, why)


def loss_and_batch(result: StepResult, env: DistEnv) -> tuple[float, int]:
    """The step's loss, the mean over the ranks, and its global batch as one number whatever the world size (the
    ranks' CRC sums of their samples, added, modulo 2**32: metrics.jsonl's ``batch_crc``, on which two runs that
    read the same tokens at a step agree); one read of the device for both."""
    loss = result.loss.detach().clone().reshape(1)
    crc = torch.tensor([result.crc], dtype=torch.int64, device=env.device)
    dist.all_reduce(loss)
    dist.all_reduce(crc)
    total, crcs = host_sync.read(torch.cat([loss.double(), crc.double()]))  # exact: both sums are below 2**53
    return total / env.world_size, int(crcs) % 2**32


def stream_row(counters: Counters, env: DistEnv) -> dict[str, Any]:
    """What reading a bucket's dataset has cost this attempt so far, over all ranks (metrics.jsonl's ``data_mb``
    downloaded, ``shards_fetched``, ``cache_hits`` and ``data_wait_s``, the seconds a rank's steps waited for
    shards, the mean over the ranks)."""
    mine = torch.tensor([counters.downloaded, counters.fetched, counters.hits, counters.wait_s], dtype=torch.float64,
                        device=env.device)
    dist.all_reduce(mine)
    downloaded, fetched, hits, waited = host_sync.read(mine)
    return {"data_mb": round(downloaded / 2**20, 3), "shards_fetched": int(fetched), "cache_hits": int(hits),
            "data_wait_s": round(waited / env.world_size, 3)}


def pruning_said(pruning: Pruning, step: int, row: Row, env: DistEnv) -> bool:
    """Tell the main rank's study of this evaluation (the last one too); whether it pruned the trial, the same
    answer on every rank (a broadcast: every rank leaves the loop together, or none does)."""
    said = torch.tensor([pruning.pruned(step, row)], dtype=torch.int32, device=env.device)
    dist.broadcast(said, src=0)
    return bool(host_sync.read(said)[0])


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
        (ranks,) = host_sync.read(failed)
        if not ranks:
            log.info("micro_batch auto: %d (grad_accum %d) fits", batching.micro_batch, batching.grad_accum)
            return result
        if batching.micro_batch == 1:
            raise RuntimeError(f"out of memory on {int(ranks)} rank(s) even at micro_batch 1: "
                               "use a smaller model or seq_len, more GPUs, or activation checkpointing")
        batching.halve()
        log.warning("out of memory on %d rank(s): micro_batch now %d, grad_accum %d",
                    int(ranks), batching.micro_batch, batching.grad_accum)


def _overall(intervals: list[dict[str, Any]], tokens_per_step: int, env: DistEnv, fpt: int,
             peak: float | None) -> dict[str, Any]:
    """Throughput of the whole run, leaving out the first interval (warm-up, compilation) when there are others."""
    steady = intervals[1:] or intervals
    steps, seconds = sum(i["steps"] for i in steady), sum(i["seconds"] for i in steady)
    return {**throughput(tokens_per_step * steps, seconds, env.world_size, fpt, peak),
            "step_time": seconds / steps, "train_seconds": sum(i["seconds"] for i in intervals),
            "peak_mem_gb": peak_memory_gb(env.device)}


def _to_device(batch: tuple[np.ndarray, np.ndarray], device: torch.device) -> Batch:
    """``batch`` on ``device``: on a GPU copied from pinned memory without the host waiting for the copy (the
    pinned buffer is reused only once the copy is done: torch's caching host allocator sees to it)."""
    if device.type != "cuda":
        return torch.from_numpy(batch[0]), torch.from_numpy(batch[1])
    x, y = (torch.from_numpy(a).pin_memory().to(device, non_blocking=True) for a in batch)
    return x, y


class _IntervalTimer:
    """Training time and steps since the last metrics row, evaluation and checkpointing left out."""

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
    host_sync.wait(device)
    return time.perf_counter()
