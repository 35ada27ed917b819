"""Launch-time checks of a run's data: everything the login node can see about ``data.path`` is checked
before a job is submitted, so a missing, empty, truncated, changed or mismatched token file costs a one-line
error instead of a queue wait and a failed job. The checks are launcher/core/dataset.py's ``verify``, the
same every attempt makes at its start. Also the data's size in the plan's terms (tokens, epochs).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any, Dict, Optional

from launcher.core.config import RunConfig
from launcher.core.dataset import (BYTE_TOKENIZER, TOKEN_DTYPES, Checked, DatasetError, check_cache, check_vocab,
                                   data_path, samples, shard_name, val_tokens, verify)
from launcher.core.store import Location, Store, StoreError, is_remote
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
    first_read: Optional[str] = None  # a bucket's: what the first step waits for, measured from here

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        size = "size known once built on first use" if self.tokens is None else (
            f"{self.tokens:,} tokens; {self.epochs:.3g} epochs")
        first = f"; {self.first_read}" if self.first_read else ""
        return f"data: {self.source} ({self.tokenizer} tokenizer, vocabulary {self.vocab_size:,}); {size}{first}"


def check_data(cfg: RunConfig, plan: Plan) -> DataSummary:
    """The run's data, or LaunchError naming the first thing wrong with it."""
    data = cfg.data
    if data.dtype not in TOKEN_DTYPES:
        raise LaunchError(f"data.dtype must be one of {', '.join(TOKEN_DTYPES)}; got '{data.dtype}'")
    if is_remote(data.path):
        return _check_bucket(cfg, plan)
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
    return _summary(cfg, plan, found, source)


def _summary(cfg: RunConfig, plan: Plan, found: Checked, source: str) -> DataSummary:
    epochs = _epochs(cfg, plan, found.tokens, source)
    _val_split(cfg, found.tokens, source)
    return DataSummary(source=source, tokenizer=found.tokenizer.get("spec", found.tokenizer["kind"]),
                       vocab_size=found.tokenizer["vocab_size"], tokens=found.tokens, epochs=epochs)


LAUNCH_RETRY_S = 10.0  # a launch waits this long at most for a store that does not answer


def _check_bucket(cfg: RunConfig, plan: Plan) -> DataSummary:
    """A bucket's dataset, checked from here with the credentials its tasks will have: its metadata is read and
    every shard listed (size, ETag). Each problem is one line: no credentials, a missing bucket or key, an
    endpoint that does not answer."""
    data = cfg.data
    store = Store(replace(data.store, retry_s=min(data.store.retry_s, LAUNCH_RETRY_S),
                          stall_s=min(data.store.stall_s, LAUNCH_RETRY_S)))
    try:
        found = verify(data, cfg.model.vocab_size, store=store)
        _check_shards(cfg, plan, found)
        first = _first_read(cfg, found, store)
    except (DatasetError, StoreError) as err:
        raise LaunchError(str(err)) from None
    return replace(_summary(cfg, plan, found, f"{data.path} at {store.endpoint}"), first_read=first)


def _first_read(cfg: RunConfig, found: Checked, store: Store) -> str:
    """What a node reads before its first step (the shards of a window of the sample order, and the next), timed
    at the rate this host reads the first shard's first MiB: where a store is slow, that is the start's cost."""
    location = Location.parse(str(cfg.data.path))
    shards = min(len(found.shard_bytes), cfg.data.stream_window + 1)
    size = sum(sorted(found.shard_bytes, reverse=True)[:shards])
    rate = store.rate(location, shard_name(0), found.shard_bytes[0])
    return (f"the first step waits for about {shards} shards, {size / 2**20:,.1f} MB: {size / rate:,.1f} s at the "
            f"{rate / 2**20:,.0f} MB/s read from here")


def _check_shards(cfg: RunConfig, plan: Plan, found: Checked) -> None:
    """The node cache must hold the shards of two windows of the sample order (the one read, the next fetched),
    and the shards must hold a global batch of samples (a streamed order leaves out those that run over a shard's
    end, launcher/train/data.py ``WindowSampler``)."""
    itemsize, seq_len = TOKEN_DTYPES[cfg.data.dtype], cfg.model.seq_len
    inside = sum(max(0, (size // itemsize - 1) // seq_len - 1) for size in found.shard_bytes)
    if inside < plan.global_batch:
        raise LaunchError(f"data.path={cfg.data.path}'s shards hold about {inside} samples of seq_len + 1 = "
                          f"{seq_len + 1} tokens that do not run over a shard's end, fewer than one global batch: "
                          "prepare it with larger shards (--shard-tokens)")
    largest = max(found.shard_bytes, default=0)
    least = (2 * cfg.data.stream_window + 2) * largest
    if cfg.data.stream_cache_gb * 2**30 < least:
        raise LaunchError(f"data.stream_cache_gb={cfg.data.stream_cache_gb:g} cannot hold the "
                          f"{2 * cfg.data.stream_window + 2} shards of {largest / 2**30:.3g} GB a node reads at "
                          f"once with data.stream_window={cfg.data.stream_window}: set data.stream_cache_gb="
                          f"{least / 2**30:.3g} or more, or a smaller data.stream_window")


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
