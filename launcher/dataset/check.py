"""Launch-time checks of a run's data: everything the login node can see about ``data.path`` is checked
before a job is submitted, so a missing, empty, truncated or mismatched token file costs a one-line error
instead of a queue wait and a failed job. Also the data's size in the plan's terms (tokens, epochs).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from launcher.core.config import RunConfig
from launcher.core.dataset import (TOKEN_DTYPES, DatasetError, default_corpus, read_metadata, samples,
                                   tokenizer_of, val_tokens)
from launcher.core.plan import Plan
from launcher.errors import LaunchError

PREPARE_HINT = "make one with 'launcher data prepare OUT INPUT...'"


@dataclass(frozen=True)
class DataSummary:
    """What a run will train on, as plan and dry runs show it."""

    source: str
    tokenizer: str
    vocab_size: int
    tokens: Optional[int]  # None: the default corpus, not built yet
    epochs: Optional[float]

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        size = "size known once built on first use" if self.tokens is None else (
            f"{self.tokens:,} tokens; {self.epochs:.3g} epochs")
        return f"data: {self.source} ({self.tokenizer} tokenizer, vocabulary {self.vocab_size:,}); {size}"


def check_data(cfg: RunConfig, plan: Plan) -> DataSummary:
    """The run's data, or LaunchError naming the first thing wrong with it."""
    data = cfg.data
    if data.dtype not in TOKEN_DTYPES:
        raise LaunchError(f"data.dtype must be one of {', '.join(TOKEN_DTYPES)}; got '{data.dtype}'")
    if data.path is None:
        corpus = default_corpus(data.cache_dir, data.dtype)
        tokens = corpus.stat().st_size // TOKEN_DTYPES[data.dtype] if corpus.is_file() else None
        tokenizer, source = tokenizer_of(None), "the standard-library corpus"
    else:
        path = Path(data.path).expanduser()
        tokens = _dataset_tokens(path, data.path, data.dtype) if path.is_dir() else _file_tokens(path, data.path,
                                                                                                  data.dtype)
        tokenizer, source = tokenizer_of(path), str(path)
    if cfg.model.vocab_size < tokenizer["vocab_size"]:
        raise LaunchError(f"model.vocab_size={cfg.model.vocab_size} is smaller than the vocabulary of data.path's "
                          f"tokenizer ({tokenizer['vocab_size']}); set model.vocab_size={tokenizer['vocab_size']} "
                          "or more")
    epochs = None if tokens is None else _epochs(cfg, plan, tokens, source)
    return DataSummary(source=source, tokenizer=tokenizer.get("spec", tokenizer["kind"]),
                       vocab_size=tokenizer["vocab_size"], tokens=tokens, epochs=epochs)


def _file_tokens(path: Path, typed: str, dtype: str) -> int:
    """A single token file's token count (its dtype is ``data.dtype``: it has no metadata)."""
    if not path.exists():
        raise LaunchError(f"data.path={typed} does not exist; {PREPARE_HINT}")
    if not path.is_file():
        raise LaunchError(f"data.path={typed} is neither a file nor a dataset directory")
    return _whole_tokens(path, f"data.path={typed}", dtype, None)


def _dataset_tokens(path: Path, typed: str, dtype: str) -> int:
    """A dataset directory's token count, after checking its shards against its metadata."""
    try:
        meta = read_metadata(path)
    except DatasetError as err:
        raise LaunchError(f"data.path={typed}: {err}") from None
    if meta["dtype"] != dtype:
        raise LaunchError(f"data.dtype={dtype} does not match data.path={typed}, whose tokens are {meta['dtype']} "
                          f"(its {path.name}/metadata.json); set data.dtype={meta['dtype']}")
    total = sum(_whole_tokens(path / s["file"], f"data.path={typed}: shard {s['file']}", dtype, s["tokens"])
                for s in meta["shards"])
    if total == 0:
        raise LaunchError(f"data.path={typed} holds no tokens; prepare it again from non-empty inputs")
    return total


def _whole_tokens(path: Path, label: str, dtype: str, expected: Optional[int]) -> int:
    itemsize = TOKEN_DTYPES[dtype]
    if not path.is_file():
        raise LaunchError(f"{label} is missing; prepare the dataset again")
    size = path.stat().st_size
    if size == 0 and expected is None:
        raise LaunchError(f"{label} is empty (0 bytes); {PREPARE_HINT}")
    if size % itemsize:
        raise LaunchError(f"{label} has {size:,} bytes, not a whole number of {dtype} tokens ({itemsize} bytes "
                          "each): truncated, or another dtype (data.dtype)")
    if expected is not None and size // itemsize != expected:
        raise LaunchError(f"{label} has {size // itemsize:,} tokens; its metadata says {expected:,}; "
                          "prepare the dataset again")
    return size // itemsize


def _epochs(cfg: RunConfig, plan: Plan, tokens: int, source: str) -> float:
    """Passes over the train split that ``train.steps`` steps make; LaunchError if not even one step fits."""
    train_samples = samples(tokens - val_tokens(tokens, cfg.data.val_fraction), cfg.model.seq_len)
    if train_samples < plan.global_batch:
        raise LaunchError(f"{source} has {tokens:,} tokens, {train_samples} train samples of "
                          f"seq_len + 1 = {cfg.model.seq_len + 1} tokens, fewer than the global batch "
                          f"{plan.global_batch}; use more data or a smaller batch")
    return cfg.train.steps / (train_samples // plan.global_batch)  # launcher/train/data.py's StepSampler's epochs
