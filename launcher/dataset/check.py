"""Launch-time checks of a run's data: everything the login node can see about ``data.path`` is checked
before a job is submitted, so a missing, empty, truncated, changed or mismatched token file costs a one-line
error instead of a queue wait and a failed job. The checks are launcher/core/dataset.py's ``verify``, the
same every attempt makes at its start. Also the data's size in the plan's terms (tokens, epochs).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Dict, Optional

from launcher.core.config import RunConfig
from launcher.core.dataset import (BYTE_TOKENIZER, TOKEN_DTYPES, DatasetError, check_cache, check_vocab, data_path,
                                   samples, val_tokens, verify)
from launcher.core.safepath import UnsafePath
from launcher.core.plan import Plan
from launcher.errors import LaunchError


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
    source = str(data_path(data)) if data.path is not None else "the standard-library corpus"
    if data.path is None:  # the corpus is built into a cache of the user's, which no other user may plant
        try:
            check_cache(data)
        except UnsafePath as err:
            raise LaunchError(str(err)) from None
    try:
        if data.path is None and not data_path(data).is_dir():  # built by the first task that needs it
            check_vocab(BYTE_TOKENIZER, cfg.model.vocab_size)
            return DataSummary(source=source, tokenizer="byte", vocab_size=BYTE_TOKENIZER["vocab_size"], tokens=None,
                               epochs=None)
        found = verify(data, cfg.model.vocab_size)
    except DatasetError as err:
        raise LaunchError(str(err)) from None
    epochs = _epochs(cfg, plan, found.tokens, source)
    _val_split(cfg, found.tokens, source)
    return DataSummary(source=source, tokenizer=found.tokenizer.get("spec", found.tokenizer["kind"]),
                       vocab_size=found.tokenizer["vocab_size"], tokens=found.tokens, epochs=epochs)


def _val_split(cfg: RunConfig, tokens: int, source: str) -> None:
    """LaunchError when the run evaluates (``train.eval_every`` > 0) but the val split holds not one sample: every
    attempt would fail at its start (launcher/train/data.py ``require``)."""
    window, val = cfg.model.seq_len + 1, val_tokens(tokens, cfg.data.val_fraction)
    if cfg.train.eval_every <= 0 or samples(val, cfg.model.seq_len) >= 1:
        return
    if window >= tokens:
        fix = "use more data"
    else:
        least = next(f / 1000 for f in range(1, 1001) if val_tokens(tokens, f / 1000) >= window)
        fix = f"set data.val_fraction={least:g} or more"
    raise LaunchError(f"{source} has {tokens:,} tokens, and its val split (data.val_fraction="
                      f"{cfg.data.val_fraction:g}) {val:,}, fewer than one sample of seq_len + 1 = {window}: {fix}, "
                      "or train.eval_every=0 to train without evaluating")


def _epochs(cfg: RunConfig, plan: Plan, tokens: int, source: str) -> float:
    """Passes over the train split that ``train.steps`` steps make; LaunchError if not even one step fits."""
    train_samples = samples(tokens - val_tokens(tokens, cfg.data.val_fraction), cfg.model.seq_len)
    if train_samples < plan.global_batch:
        raise LaunchError(f"{source} has {tokens:,} tokens, {train_samples} train samples of "
                          f"seq_len + 1 = {cfg.model.seq_len + 1} tokens, fewer than the global batch "
                          f"{plan.global_batch}; use more data or a smaller batch")
    return cfg.train.steps / (train_samples // plan.global_batch)  # launcher/train/data.py's StepSampler's epochs
