"""A checkpoint's loss on held-out tokens, in one process (``launcher eval``): the sharded checkpoint loaded into a
plain model (launcher/train/generate.py), the data read as training reads it (launcher/train/data.py: windows of
``seq_len + 1`` tokens, every id held to the vocabulary), each window's mean cross-entropy weighted by its tokens.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np
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
    """The loss of ``checkpoint`` on the ``split`` of ``data``: its first windows, up to ``max_tokens`` predicted
    tokens (0: all); ``progress(done, total)`` hears after each batch."""
    data.require(split)
    model = load_model(cfg, checkpoint, device)
    total = data.num_samples(split)
    if max_tokens:
        total = min(total, max(1, max_tokens // cfg.seq_len))
    loss_sum = 0.0
    for start in range(0, total, batch_size):
        x, y = data.batch(split, np.arange(start, min(start + batch_size, total)))
        inputs, targets = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        loss_sum += model(inputs, targets).item() * len(x)
        if progress:
            progress(min(start + batch_size, total), total)
    loss = loss_sum / total
    return HeldOut(loss, math.exp(loss) if loss < 700 else math.inf, total * cfg.seq_len, total)
