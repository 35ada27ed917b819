"""Curves in an experiment tracker: the scalars of metrics.jsonl by global step, written by rank 0.

One small interface, :class:`Tracker` (``log(step, scalars)`` and ``close()``), with one implementation per
``tracking.backend`` (launcher/core/config.py). Each imports its package only when chosen, so training needs
neither TensorBoard nor W&B with ``tracking=none``.

A requeued or retried job resumes from a checkpoint, and the attempt before it may have logged steps after
that checkpoint. Both trackers continue the one curve instead of starting another: TensorBoard's writer opens
with ``purge_step`` at the first step this attempt logs, which makes TensorBoard's reader drop the earlier
attempt's events from that step on, so every step is on the curve exactly once; W&B runs under the run's name
as its id with ``resume="allow"`` and logs by global step (offline, every attempt's files carry that id, and
``wandb sync`` joins them into one run). W&B's API key reaches the task as ``WANDB_API_KEY`` from the
secrets store (launcher/job/secret_store.py), which W&B reads itself: no file or config here holds it.
"""
from __future__ import annotations

from dataclasses import asdict
from pathlib import Path

from launcher.core.config import RunConfig, tracker_missing
from launcher.core.rundir import TENSORBOARD


class Tracker:
    """``tracking=none``: metrics.jsonl alone. The base every tracker implements."""

    def __init__(self, cfg: RunConfig | None = None, run_dir: Path | None = None, start: int = 0) -> None:
        """Open the tracker for ``cfg``'s run in ``run_dir``, for an attempt resuming after ``start`` steps."""

    def log(self, step: int, scalars: dict[str, float]) -> None:
        """Record ``scalars`` (curve name -> value) at global step ``step``."""

    def close(self) -> None:
        """Flush and let go of the tracker's files (and processes)."""


class TensorBoardTracker(Tracker):
    """Event files in ``RUN/tensorboard``, flushed at every record so a live TensorBoard keeps up."""

    def __init__(self, cfg: RunConfig, run_dir: Path, start: int) -> None:
        from torch.utils.tensorboard import SummaryWriter  # lazy: keeps torch, numpy out of start-up

        # Records are numbered by steps done: this attempt's first is start + 1.
        self.writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD), purge_step=start + 1)

    def log(self, step: int, scalars: dict[str, float]) -> None:
        for tag, value in scalars.items():
            self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker(Tracker):
    """A W&B run whose id is the run's name, resumed by every attempt, in ``mode`` (offline by default)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, start: int) -> None:
        import wandb  # lazy: keeps numpy, wandb out of start-up

        tc = cfg.tracking
        self.run = wandb.init(project=tc.project, entity=tc.entity, id=cfg.name, name=cfg.name, resume="allow",
                              mode=tc.mode, dir=str(run_dir), config=asdict(cfg),
                              settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


TRACKERS = {"none": Tracker, "tensorboard": TensorBoardTracker, "wandb": WandbTracker}


def open_tracker(cfg: RunConfig, run_dir: Path, start: int) -> Tracker:
    """The tracker of ``cfg.tracking.backend`` for an attempt that resumes after ``start`` steps."""
    missing = tracker_missing(cfg.tracking.backend)
    if missing:
        raise RuntimeError(missing)
    return TRACKERS[cfg.tracking.backend](cfg, Path(run_dir), start)
