"""Where training starts: the newest good checkpoint, loaded into a freshly built model, and the first step
after it checked against what the checkpoint recorded of its own step.

Checksums (launcher/train/manifest.py) prove that a checkpoint's files are the bytes its ranks wrote, not that those
bytes were right: state spoiled before or while it was written (a bad host, a bug, a file replaced together
with its manifest) loads without complaint. But a resume is exact, so the first step after it is one more
step of the same run, and its loss and gradient norm must look like those of the step the checkpoint saved
(kept in its meta.json). When they do not (:func:`first_step_problem`), the checkpoint is set aside like one
whose checksums failed (``step_<N>.damaged``, a ``checkpoint_damaged`` event saying why) and training starts
again, in the same attempt, from the previous good checkpoint: :meth:`Starter.fall_back` builds model,
optimizer and schedule afresh and loads it, exactly as a new attempt would.

The rule comes from measured noise (docs/recovery.md has the numbers): over 2,300 consecutive steps of
gpt_tiny and gpt_small on the byte-level corpus (each one what a resume after the step before sees), a
healthy step raised the loss by up to 1.71 (x2.07, at a global batch of 2 sequences) and the gradient norm
by up to x13.6. So the first step after a resume may raise the loss by the recorded loss or by 3.0,
whichever is more, and the gradient norm up to 100x the recorded one; anything not finite fails; falls are
never suspicious. Weights that are wrong move the loss by far more (x100 weights: 3,500 against 5.4).
"""
from __future__ import annotations

import gc
import logging
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn

from launcher.core.events import CheckpointDamaged, Resumed
from launcher.core.rundir import append_event
from launcher.train.checkpoint import load_checkpoint, reference, resume_checkpoint, set_aside
from launcher.train.dist import DistEnv, global_mean

log = logging.getLogger(__name__)

LOSS_RISE = 1.0  # the first loss after a resume may exceed the recorded one by this fraction of it,
LOSS_RISE_MIN = 3.0  # or by this much, whichever is more
GRAD_NORM_RISE = 100.0  # and its gradient norm may be up to this many times the recorded one

Build = Callable[[], tuple[nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]]


def first_step_problem(reference: dict, loss: float, grad_norm: float) -> Optional[str]:
    """Why a first step after a resume with this (all-ranks) ``loss`` and ``grad_norm`` cannot follow the
    checkpoint whose ``reference`` (its step's loss and gradient norm) it was resumed from; None if it can."""
    was_loss, was_norm = float(reference["loss"]), float(reference["grad_norm"])
    if not (math.isfinite(loss) and loss <= was_loss + max(LOSS_RISE * was_loss, LOSS_RISE_MIN)):
        return f"first step after resume: loss {loss:.2f} vs {was_loss:.2f} recorded"
    if not (math.isfinite(grad_norm) and grad_norm <= GRAD_NORM_RISE * was_norm):
        return f"first step after resume: gradient norm {grad_norm:.3g} vs {was_norm:.3g} recorded"
    return None


@dataclass
class Start:
    """What training starts from: the model and its optimizer and schedule, at ``step``, loaded from
    ``checkpoint`` (None: from scratch) whose meta.json kept the ``reference`` of that step."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    step: int = 0
    checkpoint: Optional[Path] = None
    reference: Optional[dict] = None
    build_s: float = 0.0  # how long building the model, optimizer and schedule took
    load_s: float = 0.0  # and loading the checkpoint (0: from scratch)

    def judge_first_step(self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor, env: DistEnv) -> Optional[str]:
        """On the first step after a resume (all ranks): what is wrong with it, judged from the loss averaged
        over the ranks and the gradient norm (the same on every rank), decided on rank 0 and broadcast so that
        every rank acts alike; None at once, with no collective, on any other step."""
        if self.reference is None or step != self.step:
            return None
        mean_loss = global_mean(loss, env)
        verdict = [first_step_problem(self.reference, mean_loss, grad_norm.item()) if env.is_main else None]
        dist.broadcast_object_list(verdict, src=0)
        self.reference = None  # judged once
        return verdict[0]


@dataclass
class Starter:
    """Starts training in ``run_dir``: ``build`` makes model, optimizer and schedule afresh (seeded by
    ``seed``), and the newest good checkpoint is loaded into them."""

    run_dir: Path
    env: DistEnv
    seed: int
    build: Build

    def start(self) -> Start:
        """Where training starts, checkpoints verified by their checksums (damaged ones set aside); all ranks
        call this."""
        torch.manual_seed(self.seed)
        np.random.seed(self.seed)
        random.seed(self.seed)
        began = time.perf_counter()
        begun = Start(*self.build())
        begun.build_s = time.perf_counter() - began
        path = resume_checkpoint(self.run_dir, self.env, on_damage=self._record_damage)
        if path is None:
            return begun
        began = time.perf_counter()
        begun.step = load_checkpoint(path, begun.model, begun.optimizer, begun.scheduler, self.env)
        begun.checkpoint, begun.reference, begun.load_s = path, reference(path), time.perf_counter() - began
        log.info("resumed at step %d from %s", begun.step, path)
        if self.env.is_main:
            append_event(self.run_dir, Resumed(step=begun.step, checkpoint=str(path)))
        return begun

    def fall_back(self, begun: Start, problem: str) -> Start:
        """Set aside the checkpoint ``begun`` came from, whose first step failed with ``problem``, and start
        again from the previous good one (or from scratch), exactly as a new attempt would; all ranks call
        this. The caller drops its own references to ``begun``'s model and optimizer first."""
        assert begun.checkpoint is not None
        set_aside(begun.checkpoint, [problem], self.env, on_damage=self._record_damage)
        begun.model = begun.optimizer = begun.scheduler = None  # type: ignore[assignment]
        gc.collect()  # the old model's memory is free before the new one is built
        return self.start()

    def _record_damage(self, step: int, problems: list[str]) -> None:
        append_event(self.run_dir, CheckpointDamaged(step=step, damage="; ".join(problems)))
