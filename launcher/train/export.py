"""A run's checkpoint as a Hugging Face model directory (``launcher export``; launcher/train/hf.py maps the names).

The sharded DCP checkpoint is read one tensor at a time (DCP loads any subset of a state dict, from whichever
ranks' files hold its pieces), converted, and gathered into safetensors shards of at most ``max_shard_bytes``
each, written one at a time: memory holds one shard and the tensor being read, never the model, whatever its
size. Above one shard, ``model.safetensors.index.json`` maps every tensor to its file, as transformers writes it.
The command checks the checkpoint against its manifests first (launcher/train/manifest.py). Needs no GPU, no
process group and no cluster: one process on a CPU.
"""
from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

import torch
import torch.distributed.checkpoint as dcp

from launcher.core.config import ModelConfig
from launcher.train.hf import Tensor, generation_config, gpt2_config, gpt2_tensors

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CONFIG_NAMES = {"fp32": "float32", "bf16": "bfloat16"}
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Written:
    """What :func:`write_model` wrote: its files (relative to the directory) and the tensors' bytes."""

    files: List[str]
    total_bytes: int


def write_model(cfg: ModelConfig, checkpoint: Path, out: Path, dtype: str, max_shard_bytes: int,
                eot: Optional[int]) -> Written:
    """Write ``checkpoint``'s weights into ``out`` as GPT2LMHeadModel's safetensors, config.json and
    generation_config.json."""
    from safetensors.torch import save_file

    tensors, itemsize = gpt2_tensors(cfg), torch.tensor([], dtype=DTYPES[dtype]).element_size()
    shards = split(tensors, itemsize, max_shard_bytes)
    names = [SINGLE] if len(shards) == 1 else [f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                                               for i in range(1, len(shards) + 1)]
    weight_map: Dict[str, str] = {}
    for name, shard in zip(names, shards):
        save_file({t.name: read(checkpoint, t, DTYPES[dtype]) for t in shard}, str(out / name),
                  metadata={"format": "pt"})
        weight_map.update((t.name, name) for t in shard)
    total = sum(numel(t) for t in tensors) * itemsize
    files = list(names)
    if len(shards) > 1:
        (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        files.append(INDEX)
    (out / "config.json").write_text(json.dumps(gpt2_config(cfg, CONFIG_NAMES[dtype], eot), indent=2))
    (out / "generation_config.json").write_text(json.dumps(generation_config(eot), indent=2))
    return Written(files + ["config.json", "generation_config.json"], total)


def split(tensors: List[Tensor], itemsize: int, max_shard_bytes: int) -> List[List[Tensor]]:
    """The tensors in order, in shards of at most ``max_shard_bytes`` (a larger tensor alone in its own)."""
    shards: List[List[Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        nbytes = numel(tensor) * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += nbytes
    return shards


def numel(tensor: Tensor) -> int:
    count = 1
    for dim in tensor.shape:
        count *= dim
    return count


def read(checkpoint: Path, tensor: Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One tensor of the exported state dict: read from the checkpoint alone (its fp32 master weight),
    transposed for Conv1D, in ``dtype``; or a zero bias."""
    if tensor.source is None:
        return torch.zeros(tensor.shape, dtype=dtype)
    shape = tensor.shape[::-1] if tensor.transposed else tensor.shape
    value = torch.empty(shape, dtype=torch.float32)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": {tensor.source: value}}, checkpoint_id=str(checkpoint))
    if tensor.transposed:
        value = value.t()
    return value.to(dtype).contiguous()
