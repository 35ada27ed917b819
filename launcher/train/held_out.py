"""A checkpoint's loss on held-out tokens, in one process (``launcher eval``): the sharded checkpoint loaded into a
plain model (launcher/train/generate.py), the data read as training reads it (launcher/train/data.py: windows of
``seq_len + 1`` tokens, every id held to the vocabulary), each window's mean cross-entropy weighted by its tokens.
The windows are those training's evaluation reads (:func:`launcher.train.data.eval_windows`: spread evenly over
the split), as many as ``--tokens`` allows, so the run's ``eval_loss`` is reproduced by asking for as many tokens as
it read (``train.eval_batches x`` the global batch ``x model.seq_len``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch

from launcher.core.config import ModelConfig
from launcher.train.data import TokenData
from launcher.train.generate import load_model


@dataclass(frozen=True)
class HeldOut:
    """What an evaluation measured: the mean loss per token, its perplexity, and over how much."""

    loss: float
    perplexity: float
    tokens: int
    windows: int


@torch.no_grad()
def held_out_loss(cfg: ModelConfig, checkpoint: Path, data: TokenData, split: str, max_tokens: int,
                  device: torch.device, batch_size: int = 8,
                  progress: Optional[Callable[[int, int], None]] = None) -> HeldOut:
    """The loss of ``checkpoint`` on the ``split`` of ``data``: windows spread evenly over it, up to ``max_tokens``
    predicted tokens (0: all); ``progress(done, total)`` hears after each batch."""
    data.require(split)
    model = load_model(cfg, checkpoint, device)
    available = data.num_samples(split)
    windows = data.eval_windows(max(1, max_tokens // cfg.seq_len) if max_tokens else available, split)
    total = len(windows)
    loss_sum = 0.0
    for start in range(0, total, batch_size):
        x, y = data.batch(split, windows[start: start + batch_size])
        inputs, targets = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        loss_sum += model(inputs, targets).item() * len(x)
        if progress:
            progress(min(start + batch_size, total), total)
    loss = loss_sum / total
    return HeldOut(loss, math.exp(loss) if loss < 700 else math.inf, total * cfg.seq_len, total)
