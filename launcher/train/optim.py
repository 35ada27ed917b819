"""The optimizer: AdamW with weight decay on matrices only, linear warmup then cosine LR, gradient clipping."""
from __future__ import annotations

import math
from typing import Iterable

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Shard

from launcher.core.config import TrainConfig


def lr_factor(step: int, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    """LR multiplier for optimizer step ``step`` (0-based): linear warmup, then cosine down to ``min_lr_ratio``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def build_optimizer(model: nn.Module,
                    cfg: TrainConfig) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (fused: one kernel per step, on CPU as on CUDA) with weight decay on matrices only
    (not LayerNorm weights), and its LR schedule."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": cfg.weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg.warmup_steps, cfg.steps, cfg.min_lr_ratio))
    return optimizer, scheduler


def optimizer_step(model: nn.Module, optimizer: torch.optim.Optimizer,
                   scheduler: torch.optim.lr_scheduler.LRScheduler, grad_clip: float) -> torch.Tensor:
    """Clip, step, advance the LR, clear gradients; returns the gradient norm before clipping."""
    grad_norm = clip_grad_norm(model.parameters(), grad_clip)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm


def clip_grad_norm(params: Iterable[nn.Parameter], max_norm: float) -> torch.Tensor:
    """Scale the gradients so that their total 2-norm, over every rank's shards, is at most ``max_norm``; returns
    that norm before scaling, the same on every rank.

    FSDP2's gradients are DTensors sharded over the mesh. ``nn.utils.clip_grad_norm_`` on them sends each
    gradient's norm, their stack, the total and the scaling through DTensor's dispatch, and reduces the partial
    norm over the mesh: 1.4 ms of CPU a step on each of two ranks of gpt_tiny, 0.6 ms done here. The sum is the same
    done on the local shards: each rank adds the squares of its shards' norms, one all-reduce over the mesh's shard
    dimensions adds the ranks' (a replicated dimension holds copies, already counted), and one foreach multiply
    scales the shards. Every gradient lives on the one mesh that launcher/train/parallel.py shards the model over."""
    grads = [p.grad for p in params if p.grad is not None]
    local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
    total = nn.utils.get_total_norm(local, 2.0, foreach=True)
    sharded = [grads[0].device_mesh.get_group(dim) for dim, placement in enumerate(grads[0].placements)
               if isinstance(placement, Shard)] if grads and isinstance(grads[0], DTensor) else []
    if sharded:
        squares = total.square()
        for group in sharded:
            dist.all_reduce(squares, group=group)
        total = squares.sqrt()
    torch._foreach_mul_(local, torch.clamp(max_norm / (total + 1e-6), max=1.0))
    return total
