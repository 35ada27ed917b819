"""Token data: token files, a train/val split, and deterministic sampling.

``data.path`` is a dataset directory of shards (``launcher data prepare``; layout
in launcher/core/dataset.py) or a single token file in nanoGPT's ``train.bin``
layout: token ids back to back as uint16 or uint32. Every file is read through
``np.memmap`` and the shards are seen as one sequence, so a corpus larger than
memory costs nothing to open. A sample is the ``i``-th window of ``seq_len + 1``
tokens (inputs and targets shifted by one), and may span two shards. The files
are checked at the attempt's start (launcher/train/preflight.py); what a check
cannot see (a single file's ids, a change outside the sampled blocks of a large
shard) is caught as it is read: an id the model has no embedding for is a
DatasetError naming the file, not torch's IndexError.

Which samples a rank reads at a step depends only on (seed, step, rank): the
samples of a step are a slice of a per-epoch permutation, so no sample appears
twice in a step, every sample is seen once per epoch, and a run resumed at step
``s`` reads exactly what an uninterrupted run reads at ``s``. This module stays
free of torch: tests and benchmarks read data without it.
"""
from __future__ import annotations

import bisect
import fcntl
import os
import shutil
import sysconfig
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, List

import numpy as np

from launcher.core.config import DataConfig
from launcher.core.dataset import (BYTE_TOKENIZER, TOKEN_DTYPES, DatasetError, check_cache, data_path,
                                   dataset_fingerprint, file_label, remote_metadata, samples, shard_files, shard_name,
                                   shard_record, val_tokens, write_metadata)
from launcher.core.store import Location, Store, is_remote
from launcher.train.shard_cache import ShardCache, cache_folder

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def token_file(cfg: DataConfig) -> Path | str:
    """The data to train on: ``cfg.path`` (a token file, a dataset directory or a bucket's ``s3://`` URL), or the
    standard-library corpus, built on first use."""
    if cfg.dtype not in TOKEN_DTYPES:
        raise ValueError(f"data.dtype must be one of {', '.join(TOKEN_DTYPES)}, not {cfg.dtype!r}")
    if is_remote(cfg.path):
        return str(cfg.path)  # read through open_stream
    path = data_path(cfg)
    if cfg.path is None:
        check_cache(cfg)
        _build_once(path, lambda tmp: build_corpus(tmp, cfg.dtype))
    return path


def stdlib_sources() -> list[Path]:
    """The standard library's .py files (installed packages excluded), sorted for determinism."""
    return sorted(f for f in STDLIB.rglob("*.py") if "site-packages" not in f.relative_to(STDLIB).parts)


def build_corpus(directory: Path, dtype: str) -> None:
    """The byte-level corpus of the standard library's sources in ``directory``: one shard and the metadata
    ``launcher data prepare`` would write, so that it is checked like any dataset."""
    sources = stdlib_sources()
    shard = directory / shard_name(0)
    tokens = write_tokens(shard, (encode_bytes(f.read_bytes(), dtype) for f in sources), dtype)
    max_id = int(np.memmap(shard, dtype=dtype, mode="r").max())
    write_metadata(directory, dtype, dict(BYTE_TOKENIZER), [shard_record(shard, tokens, max_id)],
                   [{"path": str(STDLIB), "format": "text", "bytes": sum(f.stat().st_size for f in sources)}], None)


def encode_bytes(data: bytes, dtype: str) -> np.ndarray:
    """Byte-level tokens: each byte is its own id (vocabulary of 256)."""
    return np.frombuffer(data, dtype=np.uint8).astype(dtype)


def write_tokens(path: Path, chunks: Iterable[np.ndarray], dtype: str) -> int:
    """Write token chunks to ``path`` atomically (a temporary file, then rename).

    A reader never sees a half-written file, whoever else is writing. Returns
    the number of tokens written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
    count = 0
    try:
        with open(tmp, "wb") as f:
            for chunk in chunks:
                f.write(np.ascontiguousarray(chunk, dtype=dtype).tobytes())
                count += len(chunk)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count


def _build_once(path: Path, build: Callable[[Path], object]) -> None:
    """Make the directory ``path`` with ``build`` unless it exists; with many ranks or jobs, one builds and the
    rest wait.

    An exclusive ``flock`` on a side file elects the builder; the kernel drops it
    if the builder dies, so a crashed build never leaves the others stuck. The
    builder fills a temporary directory renamed to ``path`` when whole, so a
    reader never sees half a corpus.
    """
    if path.exists():
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC  # never truncated, nor opened through a link
    with os.fdopen(os.open(path.with_name(path.name + ".lock"), flags, 0o600), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            return
        tmp = path.with_name(f"{path.name}.tmp.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        try:
            build(tmp)
            os.rename(tmp, path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class TokenData:
    """A token file as train and val windows of ``seq_len + 1`` tokens.

    The val split is the last ``val_fraction`` of the tokens, so it never
    overlaps the train split; it may be empty when there is no evaluation.
    Every batch is held to ``vocab_size``: the model's embedding has no row for
    a larger id.
    """

    def __init__(self, path: Path | str, dtype: str, seq_len: int, val_fraction: float, vocab_size: int,
                 stream: "Stream | None" = None):
        if stream is None:
            files = shard_files(Path(path))
            self.labels = [file_label(Path(path), f) for f in files]
            shards: List[Any] = [np.memmap(f, dtype=dtype, mode="r") for f in files]
        else:
            self.labels = [f"shard {stream.location.url(s['file'])}" for s in stream.cache.shards]
            shards = [RemoteShard(stream.cache, index, s["tokens"], dtype)
                      for index, s in enumerate(stream.cache.shards)]
        tokens = Tokens(shards)
        n_val = val_tokens(len(tokens), val_fraction)
        self.seq_len, self.vocab_size = seq_len, vocab_size
        self.splits = {"train": tokens[: len(tokens) - n_val], "val": tokens[len(tokens) - n_val:]}
        self.path, self.stream = path, stream
        self.require("train")

    def require(self, split: str) -> None:
        """Raise unless ``split`` holds at least one sample."""
        if self.num_samples(split) < 1:
            raise ValueError(f"the {split} split of {self.path} has {len(self.splits[split])} tokens, "
                             f"fewer than one sample of seq_len + 1 = {self.seq_len + 1}")

    def num_samples(self, split: str) -> int:
        return samples(len(self.splits[split]), self.seq_len)

    def batch(self, split: str, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Inputs and targets (int64, shape (len(indices), seq_len)) for the given samples."""
        data, t = self.splits[split], self.seq_len
        rows = np.stack([data.read(i * t, i * t + t + 1) for i in indices]).astype(np.int64)
        if rows.size and rows.max() >= self.vocab_size:
            row, column = np.argwhere(rows >= self.vocab_size)[0]
            shard, offset = data.locate(int(indices[row]) * t + int(column))
            where = self.labels[shard]
            raise DatasetError(f"{where} holds token id {rows[row, column]:,} at token {offset:,}, not below "
                               f"model.vocab_size={self.vocab_size:,}: set model.vocab_size to its tokenizer's "
                               "vocabulary, or prepare the data again if it was damaged")
        return rows[:, :-1], rows[:, 1:]

    def crc(self, split: str, indices: Iterable[int]) -> int:
        """The sum of the CRC-32s of the given samples' windows (``seq_len + 1`` tokens each, as stored): a
        signature of what a step read that does not depend on how its samples were split among the ranks (each
        rank's sum for its share, added over the ranks, is the global batch's)."""
        data, t = self.splits[split], self.seq_len
        return sum(zlib.crc32(data.read(int(i) * t, int(i) * t + t + 1).tobytes()) for i in indices)

    def eval_windows(self, count: int, split: str = "val") -> np.ndarray:
        """:func:`eval_windows` of ``split``: contiguous ones for a streamed dataset."""
        return eval_windows(count, self.num_samples(split), contiguous=self.stream is not None)

    def sampler(self, global_batch: int, seed: int) -> "StepSampler":
        """The order of the train samples: a permutation of them all per epoch, or for a streamed dataset one that
        visits ``data.stream_window`` shards at a time (:class:`WindowSampler`)."""
        if self.stream is None:
            return StepSampler(self.num_samples("train"), global_batch, seed)
        return WindowSampler(global_batch, seed, self.splits["train"], self.seq_len, self.stream.window,
                             self.stream.fingerprint)

    def ahead(self, sampler: "StepSampler", step: int, last: int) -> None:
        """Before ``step``: the shards the node reads from it on are fetched in the background (a streamed
        dataset's; nothing for one on disk): those of its window of the sample order and of the next one, and of
        the steps up to ``data.read_ahead`` ahead (not past ``last``), the rest of this rank's held shards let go."""
        if self.stream is None or not isinstance(sampler, WindowSampler):
            return
        needed = dict.fromkeys(sampler.window_shards(step))  # in the order they are read
        for ahead in range(step + 1, min(step + 1 + self.stream.read_ahead, last)):
            needed.update(dict.fromkeys(sampler.window_shards(ahead)))
        self.stream.cache.keep(list(needed))


class Tokens:
    """Token arrays (the shards) seen as one sequence, and ranges of it, without copying them.

    ``tokens[a:b]`` is a view of the same files; ``read(a, b)`` gives the tokens as one array, joining the
    pieces of the shards a range spans.
    """

    def __init__(self, shards: List[np.ndarray], start: int = 0, stop: int | None = None):
        self.shards = shards
        self.ends = np.cumsum([len(s) for s in shards]).tolist()
        self.start, self.stop = start, self.ends[-1] if stop is None else stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, key: int | slice) -> "Tokens | np.integer":
        if isinstance(key, slice):
            begin, end, _ = key.indices(len(self))
            return Tokens(self.shards, self.start + begin, self.start + max(begin, end))
        return self.read(key, key + 1)[0]

    def locate(self, position: int) -> tuple[int, int]:
        """The shard that holds the ``position``-th token of this range, and the token's offset in it."""
        absolute = self.start + position
        index = bisect.bisect_right(self.ends, absolute)
        return index, absolute - (self.ends[index] - len(self.shards[index]))

    def read(self, begin: int, end: int) -> np.ndarray:
        begin, end = self.start + begin, self.start + min(end, len(self))
        pieces = []
        index = bisect.bisect_right(self.ends, begin)
        while begin < end:
            first = self.ends[index] - len(self.shards[index])
            take = min(end, self.ends[index])
            pieces.append(self.shards[index][begin - first: take - first])
            begin, index = take, index + 1
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces) if pieces else self.shards[0][:0]


class RemoteShard:
    """A streamed shard as :class:`Tokens` sees a shard: its length known from the metadata, its tokens read from
    the node's cache (fetched first if they are not there)."""

    def __init__(self, cache: ShardCache, index: int, tokens: int, dtype: str):
        self.cache, self.index, self.tokens, self.dtype = cache, index, tokens, dtype

    def __len__(self) -> int:
        return self.tokens

    def __getitem__(self, key: slice) -> np.ndarray:
        return self.cache.array(self.index, self.dtype)[key]


@dataclass
class Stream:
    """A dataset in a bucket as a run reads it (``data.path=s3://...``; launcher/train/shard_cache.py)."""

    location: Location
    cache: ShardCache
    window: int
    read_ahead: int
    fingerprint: int


def open_stream(cfg: DataConfig, local_ranks: int) -> Stream | None:
    """The stream of ``cfg.path`` when it names a bucket (its metadata read, its node cache opened), else None."""
    if not is_remote(cfg.path):
        return None
    location = Location.parse(str(cfg.path))
    store = Store(cfg.store, connections=cfg.stream_connections)
    meta = remote_metadata(store, location)
    fingerprint = dataset_fingerprint(meta)
    folder, in_use = cache_folder(cfg, f"{fingerprint:08x}")
    threads = max(1, cfg.stream_connections // max(1, local_ranks))
    cache = ShardCache(store, location, meta["shards"], folder, int(cfg.stream_cache_gb * 2**30), threads, in_use)
    return Stream(location, cache, cfg.stream_window, cfg.read_ahead, fingerprint)


class StepSampler:
    """Which train samples each rank reads at each step and micro-step.

    Step ``s`` takes the next ``global_batch`` entries of the permutation of its
    epoch (epoch = s // steps_per_epoch, permutation seeded by (seed, epoch));
    rank ``r`` owns the ``r``-th contiguous share of them and splits it into
    micro-batches. A rank's share does not depend on its micro-batch size, so
    halving the micro-batch after an out-of-memory error changes nothing about
    which samples are used.
    """

    def __init__(self, num_samples: int, global_batch: int, seed: int):
        if global_batch > num_samples:
            raise ValueError(f"the train split has {num_samples} samples, fewer than the global batch {global_batch}")
        self.num_samples = num_samples
        self.global_batch = global_batch
        self.seed = seed
        self.steps_per_epoch = num_samples // global_batch
        self._epoch, self._perm = -1, np.empty(0, dtype=np.int64)

    def step_indices(self, step: int) -> np.ndarray:
        """The ``global_batch`` distinct samples of a step."""
        epoch, pos = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, self.permutation(epoch)
        return self._perm[pos * self.global_batch: (pos + 1) * self.global_batch]

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of the train samples in ``epoch``."""
        return np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)

    def share(self, step: int, rank: int, world_size: int) -> np.ndarray:
        """Rank ``rank``'s samples at ``step``: the ``rank``-th contiguous share of the step's."""
        if self.global_batch % world_size:
            raise ValueError(f"global batch {self.global_batch} is not divisible by world size {world_size}")
        per_rank = self.global_batch // world_size
        return self.step_indices(step)[rank * per_rank: (rank + 1) * per_rank]

    def micro_batches(self, step: int, rank: int, world_size: int, micro_batch: int) -> list[np.ndarray]:
        """Rank ``rank``'s samples at ``step``, in micro-batches of ``micro_batch``."""
        mine = self.share(step, rank, world_size)
        if len(mine) % micro_batch:
            raise ValueError(f"per-rank batch {len(mine)} is not divisible by micro batch {micro_batch}")
        return [mine[i: i + micro_batch] for i in range(0, len(mine), micro_batch)]


class WindowSampler(StepSampler):
    """The order of a streamed dataset's train samples: each epoch, its shards in a random order, taken
    ``window`` at a time, and the samples of a window's shards in a random order, before the next window's. A node
    then reads ``window`` shards at a time (and fetches the next window's while it trains on these) however large
    the dataset, where a permutation of all samples would touch every shard at every step. A sample that runs over
    a shard's end is left out (one a shard): it would download a shard of another window for one sample. A pure
    function of (seed, epoch, the dataset's fingerprint), as :class:`StepSampler`'s order is of (seed, epoch): a
    run resumed at any step, on any number of ranks, reads what it would have read. Its cost is the shards', not
    the samples': an epoch's order is its shard permutation, and a window's samples are permuted when a step
    reaches them."""

    def __init__(self, global_batch: int, seed: int, train: Tokens, seq_len: int, window: int, fingerprint: int):
        ends = np.minimum(np.asarray(train.ends, dtype=np.int64), train.start + len(train))
        begins = np.concatenate([[0], ends[:-1]])
        # The samples inside shard k: the i with begins[k] <= i * seq_len and i * seq_len + seq_len < ends[k].
        self.first = -(-begins // seq_len)
        self.counts = np.maximum(0, (ends - 1 - seq_len) // seq_len - self.first + 1)
        super().__init__(int(self.counts.sum()), global_batch, seed)
        self.window, self.fingerprint = max(1, window), fingerprint
        self._orders: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._windows: dict[tuple[int, int], np.ndarray] = {}

    def epoch_order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """The epoch's shards in their order, and where each window's samples end in the epoch's order."""
        if epoch not in self._orders:
            shards = np.random.default_rng([self.seed, epoch, self.fingerprint]).permutation(len(self.counts))
            sizes = np.add.reduceat(self.counts[shards], np.arange(0, len(shards), self.window))
            while len(self._orders) >= 2:  # this epoch's and the next's are asked for
                self._orders.pop(next(iter(self._orders)))
            self._orders[epoch] = (shards, np.cumsum(sizes))
        return self._orders[epoch]

    def window_samples(self, epoch: int, index: int) -> np.ndarray:
        """The samples of the epoch's ``index``-th window, in their order."""
        key = (epoch, index)
        if key not in self._windows:
            shards, _ = self.epoch_order(epoch)
            mine = shards[index * self.window: (index + 1) * self.window]
            ids = np.concatenate([np.arange(self.first[k], self.first[k] + self.counts[k]) for k in mine])
            order = np.random.default_rng([self.seed, epoch, self.fingerprint, index]).permutation(len(ids))
            while len(self._windows) >= 3:  # a step reads at most two windows: the older ones go
                self._windows.pop(next(iter(self._windows)))
            self._windows[key] = ids[order]
        return self._windows[key]

    def step_indices(self, step: int) -> np.ndarray:
        epoch, pos = divmod(step, self.steps_per_epoch)
        _, ends = self.epoch_order(epoch)
        begin, end = pos * self.global_batch, (pos + 1) * self.global_batch
        pieces, index = [], int(np.searchsorted(ends, begin, side="right"))
        while begin < end:
            start = ends[index - 1] if index else 0
            taken = self.window_samples(epoch, index)[begin - start: end - start]
            pieces.append(taken)
            begin += len(taken)
            index += 1
        return np.concatenate(pieces)

    def window_shards(self, step: int) -> list[int]:
        """The shards of the window ``step`` begins in, then those of the next one (the next epoch's first, at the
        epoch's end)."""
        epoch, pos = divmod(step, self.steps_per_epoch)
        shards, ends = self.epoch_order(epoch)
        index = int(np.searchsorted(ends, pos * self.global_batch, side="right"))
        found = shards[index * self.window: (index + 2) * self.window].tolist()
        if (index + 2) * self.window > len(shards):
            found += self.epoch_order(epoch + 1)[0][: (index + 2) * self.window - len(shards)].tolist()
        return found


def eval_windows(count: int, num_samples: int, contiguous: bool = False) -> np.ndarray:
    """The val windows an evaluation reads: ``count`` of them spread evenly over the whole split (each the middle
    of its ``num_samples / count`` stretch), or every window when the split has no more than ``count``. They depend
    on nothing else (not the world size, the step or the attempt), so every evaluation of a run, and every run with
    the same data and count, estimates the split's loss on the same windows (docs/configuration.md:
    train.eval_batches). ``contiguous`` (a streamed dataset's): the split's first ``count`` windows, which lie in
    a shard or two, where windows spread over a large split would download a shard each."""
    if count >= num_samples:
        return np.arange(num_samples)
    if contiguous:
        return np.arange(count)
    return (2 * np.arange(count) + 1) * num_samples // (2 * count)


def rank_eval_batches(windows: np.ndarray, rank: int, world_size: int, micro_batch: int) -> list[np.ndarray]:
    """Rank ``rank``'s share of the eval ``windows`` (every ``world_size``-th), in micro-batches of ``micro_batch``.
    Every rank gets the same number of micro-batches, as sharded forward passes need all ranks: where the windows do
    not divide evenly, a rank's last ones are shorter, or empty."""
    mine = windows[rank::world_size]
    most = -(-len(windows) // world_size)  # the largest share: ceiling division
    return [mine[start: start + micro_batch] for start in range(0, most, micro_batch)]
