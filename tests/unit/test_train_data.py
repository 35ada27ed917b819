"""Token data: ranks never share a sample in a step, sampling is a pure function of (seed, step),
the default corpus is built once even under concurrency, as a dataset with the metadata of any other.
(Datasets of shards: test_data_prepare.py; their checks: test_data_checks.py.)"""
import json
import multiprocessing
import zlib
from pathlib import Path

import numpy as np
import pytest

from launcher.core.config import DataConfig
from launcher.core.dataset import DatasetError, verify
from launcher.train.data import (StepSampler, TokenData, eval_windows, rank_eval_batches, stdlib_sources, token_file,
                                  write_tokens)


@pytest.mark.parametrize("world_size,micro_batch", [(1, 4), (2, 2), (4, 1), (8, 2)])
def test_ranks_never_share_a_sample_in_a_step(world_size, micro_batch):
    sampler = StepSampler(num_samples=1000, global_batch=16 if world_size == 8 else 8, seed=3)
    for step in range(300):  # several epochs
        per_rank = [np.concatenate(sampler.micro_batches(step, r, world_size, micro_batch)) for r in range(world_size)]
        together = np.concatenate(per_rank)
        assert len(np.unique(together)) == len(together) == sampler.global_batch
        assert np.array_equal(together, sampler.step_indices(step))
        assert together.min() >= 0 and together.max() < 1000


def test_each_epoch_sees_every_sample_once():
    sampler = StepSampler(num_samples=64, global_batch=8, seed=1)
    epoch0 = np.concatenate([sampler.step_indices(s) for s in range(8)])
    epoch1 = np.concatenate([sampler.step_indices(s) for s in range(8, 16)])
    assert sorted(epoch0) == sorted(epoch1) == list(range(64))
    assert not np.array_equal(epoch0, epoch1)  # reshuffled


def test_sampling_is_deterministic_and_resumable():
    a = StepSampler(num_samples=500, global_batch=12, seed=42)
    b = StepSampler(num_samples=500, global_batch=12, seed=42)
    run = [a.micro_batches(s, 1, 2, 3) for s in range(100)]
    # A sampler created at step 77 (a resumed run) reads what the uninterrupted one read.
    for s in (77, 41, 99, 0):
        assert all(np.array_equal(x, y) for x, y in zip(b.micro_batches(s, 1, 2, 3), run[s]))
    other_seed = StepSampler(num_samples=500, global_batch=12, seed=43)
    assert not np.array_equal(other_seed.step_indices(0), a.step_indices(0))


def test_micro_batch_size_does_not_change_a_ranks_samples():
    sampler = StepSampler(num_samples=500, global_batch=16, seed=0)
    shares = [np.concatenate(sampler.micro_batches(5, 1, 2, m)) for m in (8, 4, 2, 1)]
    assert all(np.array_equal(shares[0], s) for s in shares)


def test_sampler_rejects_impossible_batches():
    with pytest.raises(ValueError, match="fewer than the global batch"):
        StepSampler(num_samples=4, global_batch=8, seed=0)
    with pytest.raises(ValueError, match="not divisible by micro batch"):
        StepSampler(num_samples=100, global_batch=8, seed=0).micro_batches(0, 0, 2, 3)


def test_token_data_split_and_shift(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, [np.arange(1000) % 60000], "uint32")
    data = TokenData(path, "uint32", seq_len=10, val_fraction=0.1, vocab_size=1000)
    assert len(data.splits["train"]) == 900 and len(data.splits["val"]) == 100
    assert data.splits["val"][0] == 900  # the last 10% of the tokens
    x, y = data.batch("train", np.array([0, 5]))
    assert x.dtype == np.int64 and x.shape == (2, 10)
    assert np.array_equal(x[1], np.arange(50, 60)) and np.array_equal(y[1], np.arange(51, 61))
    assert data.num_samples("train") == 89 and data.num_samples("val") == 9


def test_eval_windows_span_the_val_split_evenly():
    windows = eval_windows(8, 1000)
    assert list(windows) == [62, 187, 312, 437, 562, 687, 812, 937]  # the middle of each eighth
    assert list(eval_windows(5, 3)) == [0, 1, 2]  # a split smaller than the set: all of it
    assert list(eval_windows(1, 9)) == [4]


@pytest.mark.parametrize("world_size, micro_batch", [(1, 2), (2, 2), (4, 1), (3, 2), (8, 4)])
def test_the_ranks_split_the_same_eval_windows_whatever_the_world_size(world_size, micro_batch):
    windows = eval_windows(24, 100_000)
    shares = [rank_eval_batches(windows, rank, world_size, micro_batch) for rank in range(world_size)]
    assert len({len(share) for share in shares}) == 1  # every rank takes part in every sharded forward pass
    read = sorted(int(w) for share in shares for batch in share for w in batch)
    assert read == list(windows)  # each window once, by one rank, whatever the layout
    assert all(len(batch) <= micro_batch for share in shares for batch in share)


def _build_default_corpus(cache_dir, out):
    out.put(str(token_file(DataConfig(cache_dir=str(cache_dir)))))


def test_default_corpus_is_built_once_under_concurrency(tmp_path):
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_build_default_corpus, args=(tmp_path / "cache", out)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    paths = {out.get(timeout=5) for _ in procs}
    assert len(paths) == 1
    path = Path(paths.pop())
    assert path.name.endswith("-uint16") and path.is_dir()
    sources = stdlib_sources()
    tokens = np.memmap(path / "tokens_00000.bin", dtype=np.uint16, mode="r")
    assert len(tokens) == sum(f.stat().st_size for f in sources)
    first = sources[0].read_bytes()
    assert bytes(tokens[: len(first)].astype(np.uint8)) == first
    leftovers = sorted(p.name for p in (tmp_path / "cache").iterdir())
    assert [n for n in leftovers if ".tmp." in n] == []
    # The metadata of any dataset: checked at launch and at every attempt's start like one.
    meta = json.loads((path / "metadata.json").read_text())
    assert meta["tokenizer"]["kind"] == "byte" and meta["dtype"] == "uint16" and meta["tokens"] == len(tokens)
    (shard,) = meta["shards"]
    assert (shard["tokens"], shard["bytes"], shard["max_id"]) == (len(tokens), 2 * len(tokens), int(tokens.max()))
    assert shard["crc32"] == zlib.crc32((path / "tokens_00000.bin").read_bytes())
    assert verify(DataConfig(cache_dir=str(tmp_path / "cache")), vocab_size=256).tokens == len(tokens)
    with open(path / "tokens_00000.bin", "r+b") as f:
        f.truncate(len(tokens))  # half its bytes
    with pytest.raises(DatasetError, match=f"shard {path}/tokens_00000.bin has {len(tokens):,} bytes, not the "
                                           f".*; delete {path} to have it built again"):
        verify(DataConfig(cache_dir=str(tmp_path / "cache")), vocab_size=256)


def test_an_id_past_the_vocabulary_is_named_with_its_file_as_it_is_read(tmp_path):
    """A single token file records no largest id; the batch that reads one the model has no embedding for
    is a DatasetError naming the file and the token, not torch's IndexError at that step."""
    path = tmp_path / "t.bin"
    write_tokens(path, [np.arange(1000) % 200, [300], np.arange(99) % 200], "uint16")
    data = TokenData(path, "uint16", seq_len=10, val_fraction=0.0, vocab_size=256)
    x, _ = data.batch("train", np.array([0, 98, 101]))  # tokens 0..10, 980..990, 1010..1020
    assert x.max() < 256
    with pytest.raises(DatasetError) as caught:
        data.batch("train", np.array([3, 99]))  # 990..1000 ends with token 1000
    assert str(caught.value) == (f"data.path={path} holds token id 300 at token 1,000, not below model.vocab_size=256: "
                                 "set model.vocab_size to its tokenizer's vocabulary, or prepare the data again if "
                                 "it was damaged")


def test_val_split_may_be_empty_but_not_the_train_split(tmp_path):
    path = tmp_path / "t.bin"
    write_tokens(path, [np.arange(100)], "uint16")
    data = TokenData(path, "uint16", seq_len=10, val_fraction=0.0, vocab_size=100)
    assert data.num_samples("val") == 0
    with pytest.raises(ValueError, match="the val split of .* has 0 tokens"):
        data.require("val")
    with pytest.raises(ValueError, match="the train split of .* has 100 tokens, fewer than one sample of seq_len"):
        TokenData(path, "uint16", seq_len=100, val_fraction=0.0, vocab_size=100)
