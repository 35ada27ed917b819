"""A dataset in a bucket (``data.path=s3://...``), against moto's server behind the suite's fault proxy
(tests/support/s3.py): the store client's retries, the node cache, the sample order, ``data prepare`` to a bucket
and the launch's checks. Each fault is caused, not mocked."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from launcher.core import nodelocal
from launcher.core.config import DataConfig, StoreConfig
from launcher.core.dataset import METADATA, DatasetError, remote_metadata
from launcher.core.events import Fault
from launcher.core.store import CREDENTIAL_VARIABLES, Location, Store, StoreError
from launcher.dataset.prepare import Request, prepare
from launcher.errors import LaunchError
from launcher.slurm.client import Slurm
from launcher.train.data import Tokens, WindowSampler
from launcher.train.shard_cache import ShardCache
from support.helpers import REPO, wait_for

SHARD_TOKENS = 4096


def settings(store, **more) -> StoreConfig:
    return StoreConfig(endpoint_url=store.endpoint, region="us-east-1", addressing_style="path",
                       **{"retry_s": 20.0, "stall_s": 5.0, **more})


def put(store, key: str, data: bytes) -> None:
    store.client().put_object(Bucket=store.bucket, Key=key, Body=data)


@pytest.fixture
def dataset(s3_store, tmp_path):
    """A byte-level dataset of 8 shards prepared into the test's bucket: (location, metadata)."""
    text = tmp_path / "in.txt"
    text.write_bytes(bytes(np.random.default_rng(0).integers(32, 127, 8 * SHARD_TOKENS - 100, dtype=np.uint8)))
    location = Location(s3_store.bucket, "ds")
    made = prepare(Request(out=location.url(), inputs=[text], tokenizer="byte", format="auto", field="text",
                           glob=None, dtype=None, shard_tokens=SHARD_TOKENS, overwrite=False,
                           store=settings(s3_store)))
    s3_store.proxy.clear()
    return location, made.meta


# ----------------------------------------------------------------------------------------------
# The sample order


def test_the_window_order_is_a_pure_permutation_that_reads_a_few_shards_at_a_time():
    shards = [np.zeros(1000 + 7 * i, dtype=np.uint16) for i in range(40)]
    train, seq_len, window, batch = Tokens(shards)[:30_000], 10, 4, 16
    order = WindowSampler(batch, 7, train, seq_len, window, fingerprint=123)
    epoch = np.concatenate([order.step_indices(s) for s in range(order.steps_per_epoch)])
    ends = np.asarray(train.ends)
    begins, lasts = (np.searchsorted(ends, epoch * seq_len + k, side="right") for k in (0, seq_len))
    assert len(set(epoch.tolist())) == len(epoch) == order.steps_per_epoch * batch  # no sample twice an epoch
    assert np.array_equal(begins, lasts)  # no sample runs over a shard's end
    assert (epoch * seq_len + seq_len < len(train)).all()  # nor past the train split's
    assert order.num_samples > 0.98 * (len(train) - 1) // seq_len  # only those left out
    for step in range(order.steps_per_epoch):  # a step reads the shards of its window and the next
        assert set(begins[step * batch: (step + 1) * batch].tolist()) <= set(order.window_shards(step))
        assert len(order.window_shards(step)) <= 2 * window
    again = WindowSampler(batch, 7, train, seq_len, window, 123)
    assert all(np.array_equal(again.step_indices(s), order.step_indices(s)) for s in (0, 5, 40, 41, 200))
    other = WindowSampler(batch, 7, train, seq_len, window, 124)
    assert not np.array_equal(other.step_indices(3), order.step_indices(3))
    spe = order.steps_per_epoch
    assert not np.array_equal(order.step_indices(3 + spe), order.step_indices(3))  # another epoch, another order
    # the ranks' shares of a step are the step's samples whatever the world size
    assert np.array_equal(np.concatenate([order.share(3, r, 4) for r in range(4)]), order.step_indices(3))


# ----------------------------------------------------------------------------------------------
# The store's client: retries, and what it does not retry


def test_a_503_burst_a_reset_and_a_truncated_body_are_retried_and_resumed(s3_store):
    body = os.urandom(3 << 20)
    put(s3_store, "obj", body)
    client, location = Store(settings(s3_store)), Location(s3_store.bucket, "")
    s3_store.proxy.fail(3, match="/obj")
    s3_store.proxy.reset(1, match="/obj")
    s3_store.proxy.truncate(1, match="/obj")
    got = bytearray()
    assert client.download(location, "obj", len(body), got.extend) == len(body)
    assert bytes(got) == body
    gets = [r for r in s3_store.proxy.requests() if r.method == "GET"]
    assert [r.status for r in gets[:3]] == [503, 503, 503]
    assert any(r.range and r.range.startswith("bytes=") and r.range != "bytes=0-" for r in gets)  # resumed


def test_a_trickle_is_cut_and_tried_again(s3_store):
    body = os.urandom(2 << 20)
    put(s3_store, "slow", body)
    s3_store.proxy.trickle(1, 64 << 10, match="/slow")
    client = Store(settings(s3_store, stall_s=1.0))
    began = time.monotonic()
    got = bytearray()
    client.download(Location(s3_store.bucket, ""), "slow", len(body), got.extend)
    assert bytes(got) == body and time.monotonic() - began < 10


def test_a_store_that_keeps_failing_ends_in_bounded_time_naming_the_object_and_endpoint(s3_store):
    put(s3_store, "obj", b"x" * 100)
    s3_store.proxy.fail(1000, match="/obj")
    began = time.monotonic()
    with pytest.raises(StoreError) as raised:
        Store(settings(s3_store, retry_s=2.0)).read(Location(s3_store.bucket, ""), "obj")
    assert time.monotonic() - began < 5
    message = str(raised.value)
    assert f"s3://{s3_store.bucket}/obj" in message and s3_store.endpoint in message and "503" in message
    assert raised.value.fault is Fault.STORE


def test_a_missing_object_or_bucket_and_refused_credentials_are_not_retried(s3_store, monkeypatch):
    client = Store(settings(s3_store))
    with pytest.raises(StoreError) as raised:
        client.read(Location(s3_store.bucket, ""), "nothing")
    assert raised.value.missing == "key" and raised.value.fault is Fault.DATA
    with pytest.raises(StoreError) as raised:
        client.read(Location("no-such-bucket", ""), "x")
    assert raised.value.missing == "bucket"
    assert len(s3_store.proxy.requests()) == 2  # one request each


# ----------------------------------------------------------------------------------------------
# The node cache


def cache_of(s3_store, location, meta, tmp_path, limit=1 << 30) -> ShardCache:
    folder = nodelocal.Folder.open(tmp_path / "cache")
    return ShardCache(Store(settings(s3_store)), location, meta["shards"], folder, limit)


def shard_gets(proxy) -> dict:
    counts: dict = {}
    for r in proxy.requests():
        if r.method == "GET" and r.path.endswith(".bin"):
            counts[r.path.rsplit("/", 1)[1]] = counts.get(r.path.rsplit("/", 1)[1], 0) + 1
    return counts


FETCH = """
import sys, json
from pathlib import Path
from launcher.core import nodelocal
from launcher.core.config import StoreConfig
from launcher.core.store import Location, Store
from launcher.train.shard_cache import ShardCache
endpoint, bucket, meta, folder, index = sys.argv[1:]
cache = ShardCache(Store(StoreConfig(endpoint_url=endpoint, addressing_style="path")), Location(bucket, "ds"),
                   json.loads(meta)["shards"], nodelocal.Folder.open(Path(folder)), 1 << 30)
print(int(cache.array(int(index), "uint16").sum()))
"""


def fetch_process(s3_store, meta, folder: Path, index: int) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", FETCH, s3_store.endpoint, s3_store.bucket, json.dumps(meta),
                             str(folder), str(index)], cwd=REPO, stdout=subprocess.PIPE, text=True)


def test_a_node_downloads_a_shard_once_whatever_its_ranks(s3_store, dataset, tmp_path):
    location, meta = dataset
    s3_store.proxy.trickle(1, 256 << 10, match="tokens_00002")  # the first download takes a while: others wait
    ranks = [fetch_process(s3_store, meta, tmp_path / "cache", 2) for _ in range(3)]
    sums = {int(p.communicate(timeout=60)[0]) for p in ranks}
    assert len(sums) == 1 and all(p.returncode == 0 for p in ranks)
    assert shard_gets(s3_store.proxy) == {"tokens_00002.bin": 1}


def test_a_download_killed_midway_leaves_nothing_that_blocks_or_misleads_the_next(s3_store, dataset, tmp_path):
    location, meta = dataset
    s3_store.proxy.trickle(1, 2 << 10, match="tokens_00001")
    rank = fetch_process(s3_store, meta, tmp_path / "cache", 1)
    part = tmp_path / "cache" / "tokens_00001.bin.part"
    wait_for(part.exists, 30, "the download's .part file (made just before its GET)", interval=0.05)
    rank.send_signal(signal.SIGKILL)
    rank.wait()
    cache = cache_of(s3_store, location, meta, tmp_path)
    tokens = cache.array(1, "uint16")
    assert zlib.crc32(tokens.tobytes()) == meta["shards"][1]["crc32"]
    assert not part.exists()
    cache.close()


def test_a_changed_object_is_bad_data_naming_its_key(s3_store, dataset, tmp_path):
    location, meta = dataset
    size = meta["shards"][3]["bytes"]
    put(s3_store, location.key("tokens_00003.bin"), b"\x01" * size)  # same size, other bytes
    cache = cache_of(s3_store, location, meta, tmp_path)
    with pytest.raises(DatasetError, match="tokens_00003.bin has changed"):
        cache.array(3, "uint16")
    assert sorted(os.listdir(tmp_path / "cache")) == ["tokens_00003.bin.lock"]  # nothing partial is kept
    put(s3_store, location.key("tokens_00004.bin"), b"\x01" * 10)  # another size
    with pytest.raises(StoreError, match="has 10 bytes, not the") as raised:
        cache.array(4, "uint16")
    assert raised.value.fault is Fault.DATA
    cache.close()


def test_the_cache_keeps_to_its_limit_and_never_removes_a_pinned_shard(s3_store, dataset, tmp_path):
    location, meta = dataset
    cache = cache_of(s3_store, location, meta, tmp_path, limit=2 * meta["shards"][0]["bytes"])
    held = cache.array(0, "uint16").copy()
    for index in (1, 2, 3):
        cache.keep({0, index})  # shard 0 stays pinned; the others come and go
        cache.array(index, "uint16")
    shards = sorted(n for n in os.listdir(tmp_path / "cache") if n.endswith(".bin"))
    assert "tokens_00000.bin" in shards and len(shards) <= 3
    assert np.array_equal(cache.array(0, "uint16"), held)
    assert shard_gets(s3_store.proxy)["tokens_00000.bin"] == 1
    cache.close()


# ----------------------------------------------------------------------------------------------
# data prepare to a bucket, and the launch's checks


def test_prepare_uploads_shards_then_the_metadata_last_with_their_etags(s3_store, tmp_path):
    text = tmp_path / "in.txt"
    text.write_text("hello world " * 2000)
    out = f"s3://{s3_store.bucket}/books"
    request = Request(out=out, inputs=[text], tokenizer="byte", format="auto", field="text", glob=None, dtype=None,
                      shard_tokens=10_000, overwrite=False, store=settings(s3_store))
    made = prepare(request)
    puts = [r.path.rsplit("/", 1)[1] for r in s3_store.proxy.requests() if r.method in ("PUT", "POST")]
    assert puts[-1] == METADATA and {"tokens_00000.bin", "tokens_00002.bin"} <= set(puts)
    meta = remote_metadata(Store(settings(s3_store)), Location.parse(out))
    assert meta["tokens"] == made.meta["tokens"] == 24_000 and all(s["etag"] for s in meta["shards"])
    with pytest.raises(LaunchError, match="already holds a dataset.*--overwrite"):
        prepare(request)


@pytest.mark.parametrize("case", ["bucket", "key", "credentials", "endpoint", "etag"])
def test_the_launch_check_names_each_problem_in_one_line(s3_store, dataset, tmp_path, monkeypatch, case):
    from launcher.dataset.check import _check_bucket
    from launcher.compose.layout import single_node_plan
    from launcher.core.config import ModelConfig, RunConfig

    location, meta = dataset
    data = DataConfig(path=location.url(), store=settings(s3_store))
    expected = {"bucket": "there is no bucket nope", "key": "has no metadata.json", "credentials": "no credentials",
                "endpoint": "did not serve", "etag": "has changed since it was prepared"}[case]
    if case == "bucket":
        data.path = "s3://nope/ds"
    elif case == "key":
        data.path = location.url() + "-not"
    elif case == "credentials":
        for name in CREDENTIAL_VARIABLES:
            monkeypatch.delenv(name, raising=False)
    elif case == "endpoint":
        data.store = replace(data.store, endpoint_url="http://127.0.0.1:9", retry_s=1.0)
    else:
        put(s3_store, location.key("tokens_00005.bin"), b"\x02" * meta["shards"][5]["bytes"])
    cfg = RunConfig(data=data, model=ModelConfig(name="tiny", d_model=32, n_heads=2, n_layers=2, seq_len=32,
                                                 vocab_size=256))
    with pytest.raises(LaunchError) as raised:
        _check_bucket(cfg, single_node_plan(cfg, 1))
    assert expected in str(raised.value) and "\n" not in str(raised.value)


def test_slurm_never_gets_the_store_credentials(monkeypatch):
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "very-secret")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://store:9000")
    env = Slurm(conf=None).env
    assert "AWS_SECRET_ACCESS_KEY" not in env and env["AWS_ENDPOINT_URL"] == "http://store:9000"


def test_sample_eval_and_export_read_a_buckets_tokenizer_checked_against_its_hash(s3_store, tmp_path):
    from launcher.views.trained_model import run_tokenizer

    text = tmp_path / "in.txt"
    text.write_text("the quick brown fox jumps over the lazy dog; " * 400)
    out = f"s3://{s3_store.bucket}/bpe"
    prepare(Request(out=out, inputs=[text], tokenizer="bpe:300", format="auto", field="text", glob=None, dtype=None,
                    shard_tokens=100_000, overwrite=False, store=settings(s3_store)))
    data = DataConfig(path=out, store=settings(s3_store), cache_dir=str(tmp_path / "cache"))
    codec = run_tokenizer(data)
    assert codec.kind == "bpe" and codec.decode(codec.encode_batch(["lazy dog"])[0]) == "lazy dog"
    cached = list((tmp_path / "cache" / "tokenizers").glob("*/tokenizer.json"))
    assert len(cached) == 1
    cached[0].unlink()
    put(s3_store, "bpe/tokenizer.json", b'{"not": "it"}')
    with pytest.raises(LaunchError, match="is not the tokenizer the data was made with"):
        run_tokenizer(data)


def test_the_store_is_the_runs_over_the_cluster_files_over_what_the_aws_cli_would_use(tmp_path, monkeypatch):
    from launcher.compose.composer import resolved_store
    from launcher.core.config import ClusterConfig, RunConfig

    config = tmp_path / "aws-config"
    config.write_text("[profile site]\nregion = eu-west-3\nendpoint_url = http://profile:4\ns3 =\n"
                      "  addressing_style = path\n")
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    monkeypatch.setenv("AWS_PROFILE", "site")

    def resolved(run: StoreConfig, site: StoreConfig) -> tuple:
        cfg = RunConfig(data=DataConfig(path="s3://b/p", store=run), cluster=ClusterConfig(store=site))
        found = resolved_store(cfg)
        return found.endpoint_url, found.region, found.addressing_style

    assert resolved(StoreConfig(), StoreConfig()) == ("http://profile:4", "eu-west-3", "path")  # as `aws` would
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:1")
    assert resolved(StoreConfig(), StoreConfig())[0] == "http://env:1"
    site = StoreConfig(endpoint_url="http://site:2", addressing_style="virtual")
    assert resolved(StoreConfig(), site) == ("http://site:2", "eu-west-3", "virtual")
    assert resolved(StoreConfig(endpoint_url="http://run:3"), site)[0] == "http://run:3"
    with pytest.raises(LaunchError, match="data.store.addressing_style must be one of auto, path, virtual"):
        resolved(StoreConfig(addressing_style="sideways"), StoreConfig())


def test_a_dataset_uploaded_by_hand_from_a_prepared_directory_is_checked_by_size(s3_store, tmp_path):
    from launcher.core.dataset import verify

    text = tmp_path / "in.txt"
    text.write_text("to be or not to be " * 1000)
    local = tmp_path / "local"
    prepare(Request(out=local, inputs=[text], tokenizer="byte", format="auto", field="text", glob=None, dtype=None,
                    shard_tokens=5000, overwrite=False))
    client = s3_store.client()
    for file in sorted(local.iterdir()):  # as `aws s3 cp --recursive` would
        client.upload_file(str(file), s3_store.bucket, f"hand/{file.name}")
    data = DataConfig(path=f"s3://{s3_store.bucket}/hand", store=settings(s3_store))
    assert verify(data, 256).tokens == 19_000
    put(s3_store, "hand/tokens_00001.bin", b"\x00" * 10)
    with pytest.raises(DatasetError, match="tokens_00001.bin has 10 bytes, not the 10,000"):
        verify(data, 256)


def test_a_node_keeps_the_shards_of_the_datasets_in_use_and_removes_the_others(tmp_path):
    from launcher.train.shard_cache import cache_folder

    data = DataConfig(stream_cache_dir=str(tmp_path / "cache"))
    shards = tmp_path / "cache" / "shards"
    first, held = cache_folder(data, "aaaaaaaa")
    (shards / "aaaaaaaa" / "tokens_00000.bin").write_bytes(b"x")
    second, second_held = cache_folder(data, "bbbbbbbb")  # another job's dataset, while the first is read
    assert sorted(os.listdir(shards)) == ["aaaaaaaa", "bbbbbbbb"]
    os.close(held)  # the first job ends
    first.close()
    third, third_held = cache_folder(data, "cccccccc")
    assert sorted(os.listdir(shards)) == ["bbbbbbbb", "cccccccc"]
    for folder, fd in ((second, second_held), (third, third_held)):
        os.close(fd)
        folder.close()
