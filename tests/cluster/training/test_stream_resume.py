"""A run that streams its data from a bucket (moto's server behind the suite's fault proxy, tests/support/s3.py),
SIGKILLed in the middle of a download and run again from its checkpoint, reads step for step the global batches
of an uninterrupted run (metrics.jsonl's ``batch_crc``) and ends at its loss; the node's cache held every shard
once."""
from __future__ import annotations

import signal
from pathlib import Path

import pytest

from launcher.core.store import Location
from launcher.dataset.prepare import Request, prepare
from launcher.train.data import stdlib_sources
from support.helpers import wait_for
from support.train_harness import check_ok, launch_ranks, make_run_dir, metrics, start_ranks, tiny_config

pytestmark = pytest.mark.slurm

STEPS = 12


def stream_config(store, url: str, cache: Path) -> dict:
    """Shards of 512 tokens, 2 at a time: the run turns over windows of shards every few steps."""
    config = tiny_config(Path("unused"), steps=STEPS, checkpoint_every=4, keep_checkpoints=3)
    config["data"] = {"path": url, "dtype": "uint16", "stream_window": 2, "read_ahead": 2,
                      "stream_cache_dir": str(cache), "stream_cache_gb": 0.0001,
                      "store": {"endpoint_url": store.endpoint, "addressing_style": "path", "retry_s": 60.0}}
    return config


def test_a_run_killed_mid_download_reads_the_same_tokens_as_one_never_killed(s3_store, tmp_path):
    url = Location(s3_store.bucket, "stdlib").url()
    prepare(Request(out=url, inputs=stdlib_sources()[:3], tokenizer="byte", format="text", field="text", glob=None,
                    dtype=None, shard_tokens=512, overwrite=False))
    reference = make_run_dir(tmp_path / "reference", stream_config(s3_store, url, tmp_path / "cache-a"), 2, 2)
    check_ok(launch_ranks(["-m", "launcher.train", str(reference)], world_size=2))

    run_dir = make_run_dir(tmp_path / "run", stream_config(s3_store, url, tmp_path / "cache-b"), 2, 2)
    ranks = start_ranks(["-m", "launcher.train", str(run_dir)], world_size=2)
    rows = run_dir / "metrics.jsonl"
    wait_for(lambda: rows.exists() and any('"step": 5' in line for line in rows.read_text().splitlines()),
             120, "the run trained past its checkpoint of step 4", interval=0.05)
    s3_store.proxy.trickle(1000, 200)  # every download from now on takes seconds
    parts = tmp_path / "cache-b" / "shards"
    wait_for(lambda: list(parts.rglob("*.part")), 120, "a download began", interval=0.05)
    for rank in ranks:
        rank.send_signal(signal.SIGKILL)
        rank.communicate()
    s3_store.proxy.calm()
    s3_store.proxy.clear()
    check_ok(launch_ranks(["-m", "launcher.train", str(run_dir)], world_size=2))

    assert "resumed at step" in (run_dir / "logs" / "rank_0.log").read_text()
    by_step = lambda rows: {r["step"]: r for r in rows if not r.get("final")}  # noqa: E731
    theirs, ours = by_step(metrics(reference)), by_step(metrics(run_dir))
    assert [ours[s]["batch_crc"] for s in range(1, STEPS + 1)] == [theirs[s]["batch_crc"] for s in range(1, STEPS + 1)]
    assert ours[STEPS]["loss"] == theirs[STEPS]["loss"]
    assert not list(parts.rglob("*.part"))  # the killed download's was removed by the next downloader
    gets = [r.path for r in s3_store.proxy.requests() if r.method == "GET" and r.path.endswith(".bin")]
    assert len(gets) == len(set(gets))  # each shard the resumed run read was downloaded once
    assert ours[STEPS]["shards_fetched"] == len(gets) and ours[STEPS]["data_mb"] > 0
