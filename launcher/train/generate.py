"""Text from a run's checkpoint in one process (``launcher sample``): the sharded DCP checkpoint that FSDP
ranks saved is loaded into a plain, unsharded GPT on this machine's CPU or GPU, with no process group.

DCP reshards on load: each tensor of the plain model's state dict is filled from whichever ranks' files
hold its pieces, so a checkpoint of any world size loads here. The optimizer state is not read.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import List, Optional

import torch
import torch.distributed.checkpoint as dcp

from launcher.core.config import ModelConfig
from launcher.train.model import GPT


def load_model(cfg: ModelConfig, checkpoint: Path, device: torch.device) -> GPT:
    """The model saved in ``checkpoint`` (a complete ``step_<N>`` directory), in eval mode on ``device``."""
    with torch.device(device):
        model = GPT(cfg)
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, checkpoint_id=str(checkpoint))  # no process group: DCP reads every shard itself
    model.load_state_dict(state["model"])
    return model.eval()


@torch.no_grad()
def generate(model: GPT, prompt: List[int], tokens: int, temperature: float, top_k: int, seed: int,
             stop: Optional[int] = None) -> List[int]:
    """Up to ``tokens`` ids after ``prompt``, each drawn from the softmax of the last position's logits at
    ``temperature`` among the ``top_k`` most likely (0: all); the window is the model's ``seq_len``."""
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    ids = torch.tensor([prompt], dtype=torch.long, device=device)
    out: List[int] = []
    for _ in range(tokens):
        logits = model(ids[:, -model.cfg.seq_len:])[:, -1, :].float() / temperature
        if top_k:
            kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
        if stop is not None and int(nxt) == stop:
            break
        out.append(int(nxt))
        ids = torch.cat([ids, nxt], dim=1)
    return out
