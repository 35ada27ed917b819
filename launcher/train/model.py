"""A nanoGPT-style decoder-only GPT in plain PyTorch.

The model knows nothing about parallelism: ``launcher/train/parallel.py`` shards it after
construction. It is built on the meta device for large sizes and materialised
shard by shard, so :meth:`GPT.init_weights` is written to work on parameters that
are already sharded (DTensors) as well as on ordinary tensors, and to give the
same weights whatever the sharding: one GPU and sixty-four start from the same
model, which is what makes runs at different scales comparable and the parity
tests possible.

Shapes match the parameter-count formula in docs/design-contract.md: LayerNorm
and Linear without bias, learned positions, and an output projection tied to the
token embedding (one matrix, used twice).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import DTensor, distribute_tensor

from launcher.core.config import ModelConfig

INIT_STD = 0.02


class CausalSelfAttention(nn.Module):
    """Multi-head attention over earlier positions only (flash/SDPA kernel)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.d_model % cfg.n_heads:
            raise ValueError(f"d_model {cfg.d_model} is not divisible by n_heads {cfg.n_heads}")
        self.n_heads = cfg.n_heads
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, d = x.shape
        # (B, T, 3d) -> three (B, H, T, d/H) tensors.
        q, k, v = self.qkv(x).view(batch, seq, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, d))


class MLP(nn.Module):
    """Position-wise feed-forward: d -> mlp_ratio*d -> d with GELU."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.mlp_ratio * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.mlp_ratio * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """A pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, bias=False)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, bias=False)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    """Token + position embeddings, ``n_layers`` blocks, final LayerNorm, tied head.

    The head is ``F.linear(h, tok_emb.weight)`` rather than a second module
    sharing the weight: a shared Parameter does not survive ``to_empty`` from the
    meta device, and one matrix is also what the checkpoint and FSDP should see.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        # Each embedding is given its (uninitialised) weight, which skips its own normal_ init: init_weights draws
        # every value anyway, and on the meta device that normal_ imports torch._dynamo, about a second of a
        # one-rank start (sharding over more ranks imports it anyway).
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model, _weight=torch.empty(cfg.vocab_size, cfg.d_model))
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model, _weight=torch.empty(cfg.seq_len, cfg.d_model))
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=False)
        if not any(p.is_meta for p in self.parameters()):
            self.init_weights()

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for ``idx`` (B, T), or the mean cross-entropy if ``targets`` is given."""
        seq = idx.shape[1]
        if seq > self.cfg.seq_len:
            raise ValueError(f"sequence of {seq} tokens is longer than seq_len {self.cfg.seq_len}")
        positions = torch.arange(seq, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(positions)
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.tok_emb.weight)
        if targets is None:
            return logits
        # The loss in fp32 even when activations are bf16.
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """(Re)initialise every parameter from ``seed``, independent of sharding.

        Weights are normal(0, 0.02); the two projections that write into the
        residual stream are scaled by 1/sqrt(2 * n_layers) (GPT-2) so the
        stream's variance does not grow with depth; LayerNorm weights are one.
        Each value is drawn for the parameter's full shape from one generator in
        a fixed order, and a sharded parameter keeps only its own shard, so the
        result does not depend on how many ranks hold the model. Only one full
        parameter exists at a time, never the full model.
        """
        device = next(self.parameters()).device
        generator = torch.Generator(device=device).manual_seed(seed)
        residual_std = INIT_STD / math.sqrt(2 * self.cfg.n_layers)
        residual = {id(m) for block in self.blocks for m in (block.attn.proj, block.mlp.proj)}
        for module in self.modules():
            if isinstance(module, nn.LayerNorm):
                _assign(module.weight, torch.ones(module.weight.shape, device=device))
            elif isinstance(module, (nn.Linear, nn.Embedding)):
                std = residual_std if id(module) in residual else INIT_STD
                full = torch.empty(module.weight.shape, device=device)
                _assign(module.weight, full.normal_(0.0, std, generator=generator))


def _assign(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy ``full`` into ``param``, keeping only the local shard if it is sharded."""
    if isinstance(param, DTensor):
        full = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
    param.copy_(full)
