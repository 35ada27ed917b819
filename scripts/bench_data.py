#!/usr/bin/env python
"""What does streaming a dataset from a bucket (``data.path=s3://BUCKET/PREFIX``) cost a run? (CPU, 2 ranks)

One byte-level dataset (standard-library sources, ``launcher data prepare``'s code) is prepared twice, as a local
dataset directory and into a bucket of moto's S3 server, behind the test suite's proxy (tests/support/s3.py:
``S3Server``, ``FaultProxy``, imported from there), and trained by ``python -m launcher.train RUN_DIR`` on 2 ranks
(gloo, one thread each) from each:

(1) step time: the local run's ÷ the streamed run's, both the mean over the steps after the first log interval
    (the final metrics row's ``step_time``: the first shards' download and the warm-up left out). The streamed run
    trains with the proxy's bandwidth capped at ``--cap`` times what the local run consumed (its tokens/s x the
    bytes of a token), so what is measured is whether read-ahead hides the store, not the loopback's speed.
    Target >= 0.95.
(2) GETs per node / shards read: the proxy's GETs of shard objects (``*.bin``) during the streamed run, counted
    per node (the ``node/<host>`` of the client's User-Agent), over the shards each node fetched (distinct
    objects). Target 1.00: every shard downloaded once per node, whatever its ranks and read-ahead did. Beside it,
    which shards the launcher's own sampler (``WindowSampler``) says the steps read, and how many more the node
    fetched as the next window's.
(3) time to the first step against the dataset's size (the cost of its index): fresh runs without a cap, on the
    streamed dataset and on one ``--large`` times as many shards of the same size, each from its rank 0's process
    start (``started``'s ``bring_up`` counted back from its time) to the end of its first step (the ``ready``
    event's time), both from the run's events.jsonl; the best of ``--repeats`` runs of each, alternated. The
    ratio's target is 1: the first step reads a window of shards, whatever the dataset's size. The imports and
    the process group's bring-up, the same for both, are in it: the lines below it say where the time went.

Everything runs on this machine: moto's server and the proxy share its cores with the ranks, so a streamed step
pays for serving its shards too (a real store serves them elsewhere), and the figures of a shared 2-core machine
are worth more as ratios than as seconds.

    python scripts/bench_data.py [--steps 300] [--files 60] [--shard-tokens 8192] [--large 8] [--repeats 3] [--cap 4]
    python scripts/bench_data.py --quick   # about 25 s: a tiny model, 60 steps, small datasets, one round
                                           # (tests/cluster/test_bench_data_quick.py); its figures say that
                                           # everything runs, not how fast

The full mode takes about a minute on a 2-core machine (most of it preparing the datasets and starting ranks).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the launcher, and the suite's store (tests/support/s3.py)

from omegaconf import OmegaConf  # noqa: E402

from launcher.compose.layout import single_node_plan  # noqa: E402
from launcher.core.config import DataConfig, RunConfig, StoreConfig, load_run_config  # noqa: E402
from launcher.core.dataset import TOKEN_DTYPES, dataset_fingerprint, val_tokens  # noqa: E402
from launcher.core.metrics import Row  # noqa: E402
from launcher.core.plan import PLAN  # noqa: E402
from launcher.core.rundir import read_metrics  # noqa: E402
from launcher.core.store import Location  # noqa: E402
from launcher.dataset.prepare import Request, prepare  # noqa: E402
from launcher.train.data import Tokens, WindowSampler, stdlib_sources  # noqa: E402
from support.s3 import FAKE_CREDENTIALS, REGION, FaultProxy, S3Server, s3_client  # noqa: E402

RANKS = 2
QUICK = {"steps": 60, "log_every": 5, "files": 12, "shard_tokens": 2048, "large": 8, "repeats": 1, "window": 2,
         "read_ahead": 4, "d_model": 32, "layers": 2, "seq_len": 32, "batch": 4}
RUN_BOUND_S = 600  # only a bound on a hung run


def store_environment(workdir: Path) -> None:
    """The clients' environment (this process's and the ranks'): moto's fake credentials, and no AWS_ setting,
    profile or credentials file of the user's."""
    for name in [name for name in os.environ if name.startswith("AWS_")]:
        del os.environ[name]
    os.environ.update({**FAKE_CREDENTIALS, "AWS_DEFAULT_REGION": REGION, "AWS_EC2_METADATA_DISABLED": "true",
                       "AWS_CONFIG_FILE": str(workdir / "no-aws" / "config"),
                       "AWS_SHARED_CREDENTIALS_FILE": str(workdir / "no-aws" / "credentials")})


def sources() -> list[Path]:
    """The standard library's sources that hold text (``data prepare`` refuses an empty input)."""
    return [source for source in stdlib_sources() if source.stat().st_size]


def sources_of(total_bytes: int) -> list[Path]:
    """The first sources that hold at least ``total_bytes`` (all of them if they hold fewer)."""
    chosen, size = [], 0
    for source in sources():
        if size >= total_bytes:
            break
        chosen.append(source)
        size += source.stat().st_size
    return chosen


def make_dataset(out: str, inputs: list[Path], shard_tokens: int, store: StoreConfig) -> dict:
    """``launcher data prepare OUT INPUT... --shard-tokens N`` (byte-level); the dataset's metadata."""
    return prepare(Request(out=out, inputs=inputs, tokenizer="byte", format="text", field="text", glob=None,
                           dtype=None, shard_tokens=shard_tokens, overwrite=False, store=store)).meta


def run_config(args, data: dict, steps: int) -> dict:
    """A tiny GPT on ``data`` (``data.*`` keys), ``args.batch`` sequences per rank in one micro-batch, no eval or
    checkpoints but the last."""
    return {
        "model": {"name": "bench_tiny", "d_model": args.d_model, "n_heads": max(1, args.d_model // 16),
                  "n_layers": args.layers, "seq_len": args.seq_len, "vocab_size": 256},
        "train": {"steps": steps, "global_batch": args.batch * RANKS, "micro_batch": args.batch, "lr": 1e-3,
                  "warmup_steps": 2, "log_every": args.log_every, "eval_every": 0, "checkpoint_every": 0},
        "data": {"dtype": "uint16", "val_fraction": 0.0, **data},
        "cluster": {"virtual_gpus": True},  # ranks on the CPU, as on the local cluster
    }


def make_run_dir(run_dir: Path, config: dict) -> Path:
    """config.yaml and plan.json as the launcher writes them for ``RANKS`` ranks on one node (as
    tests/support/train_harness.py's ``make_run_dir``, without importing torch into this process)."""
    run_dir.mkdir(parents=True)
    OmegaConf.save(OmegaConf.merge(OmegaConf.structured(RunConfig), config), run_dir / "config.yaml")
    (run_dir / PLAN).write_text(json.dumps(single_node_plan(load_run_config(run_dir / "config.yaml"),
                                                            RANKS).to_dict()))
    return run_dir


def train(run_dir: Path) -> list[Row]:
    """``python -m launcher.train RUN_DIR`` on ``RANKS`` local ranks (torchrun's variables, one thread each);
    the run's metrics rows."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(RANKS):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(RANKS), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(RANKS), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        for name in [name for name in env if name.startswith("SLURM_")]:
            del env[name]
        procs.append(subprocess.Popen([sys.executable, "-m", "launcher.train", str(run_dir)], cwd=ROOT, env=env,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=RUN_BOUND_S)
            if proc.returncode:
                raise SystemExit(f"python -m launcher.train {run_dir} failed:\n{err[-3000:]}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return read_metrics(run_dir)


def events(run_dir: Path) -> dict[str, dict]:
    """The run's events by kind (the last of each)."""
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    return {e["event"]: e for e in map(json.loads, filter(None, lines))}


def first_step(run_dir: Path) -> dict[str, float]:
    """From rank 0's process start to the end of its first step, in seconds, and where they went: the bring-up
    ``started`` records (imports, rendezvous, preflight, the data's check: its metadata and listing), what no event
    times (the node-local folder and the watchdog, the stream's metadata and cache, the token index and the
    sampler), the model's build, and the first step (the epoch's order, the first shards' download)."""
    found = events(run_dir)
    started, ready = found["started"], found["ready"]
    bring_up = sum(started["bring_up"].values())
    total = ready["time"] - (started["time"] - bring_up)
    rest = ready["time"] - started["time"] - ready["build_s"] - ready["load_s"] - ready["first_step_s"]
    return {"total": total, "data_check": started["bring_up"].get("data", 0.0), "bring_up": bring_up,
            "open": rest, "build": ready["build_s"], "step": ready["first_step_s"]}


def gets_per_node(proxy: FaultProxy) -> tuple[int, int]:
    """The GETs of shard objects the proxy saw, and the distinct shards they fetched, each summed over the nodes
    (a node: the ``node/<host>`` its client names in its User-Agent)."""
    by_node: dict[str, list[str]] = defaultdict(list)
    for record in proxy.requests():
        if record.method == "GET" and record.path.endswith(".bin"):
            node = re.search(r"node/(\S+)", record.user_agent)
            by_node[node.group(1) if node else "?"].append(record.path)
    return sum(len(paths) for paths in by_node.values()), sum(len(set(paths)) for paths in by_node.values())


class _Length:
    """A shard as :class:`Tokens` needs it to place samples: its length only."""

    def __init__(self, tokens: int) -> None:
        self.tokens = tokens

    def __len__(self) -> int:
        return self.tokens


def shards_read(meta: dict, run_dir: Path) -> tuple[int, int]:
    """What a streamed run's steps read, by the launcher's own sampler (``WindowSampler`` over the dataset's shards,
    as ``TokenData`` makes it for the run's config): the shards its samples lie in, and those the node fetched
    only because they are the next window's when its last steps ran."""
    cfg = load_run_config(run_dir / "config.yaml")
    tokens = Tokens([_Length(shard["tokens"]) for shard in meta["shards"]])
    train = tokens[: len(tokens) - val_tokens(len(tokens), cfg.data.val_fraction)]
    seq = cfg.model.seq_len
    sampler = WindowSampler(cfg.train.global_batch, cfg.train.seed, train, seq, cfg.data.stream_window,
                            dataset_fingerprint(meta))
    read = {int(train.locate(int(i) * seq)[0]) for step in range(cfg.train.steps) for i in sampler.step_indices(step)}
    asked = {shard for step in range(cfg.train.steps) for shard in sampler.window_shards(step)}
    return len(read), len(asked - read)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--log-every", type=int, default=20, help="the first interval is left out of step time")
    parser.add_argument("--files", type=int, default=60, help="standard-library sources in the dataset")
    parser.add_argument("--shard-tokens", type=int, default=8192)
    parser.add_argument("--large", type=int, default=8, help="(3): the large dataset has this many times the shards")
    parser.add_argument("--repeats", type=int, default=3, help="(3): best of this many runs of each dataset")
    parser.add_argument("--cap", type=float, default=4.0, help="(1): bandwidth, times the local run's consumption")
    parser.add_argument("--window", type=int, default=DataConfig.stream_window, help="data.stream_window")
    parser.add_argument("--read-ahead", type=int, default=DataConfig.read_ahead, help="data.read_ahead")
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--seq-len", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4, help="sequences per rank per step")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (its path is printed)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in about 25 s (a tiny model, few steps, small datasets): the figures it "
                             "prints say that everything runs, not how fast")
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.steps < 2 * args.log_every:
        parser.error("--steps must be at least twice --log-every (the first interval is left out)")

    work = Path(tempfile.mkdtemp(prefix="bench-data-"))
    store_environment(work)
    server = S3Server(work)
    proxy = FaultProxy(server.endpoint)
    try:
        measure(args, work, server, proxy)
    finally:
        proxy.stop()
        server.stop()
        if args.keep:
            print(f"work directory: {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def measure(args, work: Path, server: S3Server, proxy: FaultProxy) -> None:
    bucket = f"bench-{uuid.uuid4().hex[:12]}"
    s3_client(server.endpoint).create_bucket(Bucket=bucket)
    upload = StoreConfig(endpoint_url=server.endpoint, addressing_style="path")  # past the proxy
    small_inputs = sources()[:args.files]
    small_bytes = sum(f.stat().st_size for f in small_inputs)
    local = work / "dataset"
    began = time.perf_counter()
    meta = make_dataset(str(local), small_inputs, args.shard_tokens, upload)
    small_url, large_url = Location(bucket, "small").url(), Location(bucket, "large").url()
    make_dataset(small_url, small_inputs, args.shard_tokens, upload)
    large = make_dataset(large_url, sources_of(args.large * small_bytes), args.shard_tokens, upload)
    itemsize = TOKEN_DTYPES[meta["dtype"]]
    print(f"datasets: {len(meta['shards'])} shards of {args.shard_tokens:,} tokens ({meta['tokens']:,} tokens, "
          f"{meta['dtype']}), local and in the bucket; large: {len(large['shards'])} shards "
          f"({large['tokens']:,} tokens); prepared in {time.perf_counter() - began:.1f} s")
    print(f"runs: 2 ranks (gloo, 1 thread each), d_model={args.d_model} n_layers={args.layers} "
          f"seq_len={args.seq_len}, {args.batch} sequences per rank per step, {args.steps} steps, "
          f"data.stream_window={args.window} data.read_ahead={args.read_ahead}, {os.cpu_count()} CPUs"
          f"{' (quick)' if args.quick else ''}")

    def streamed(name: str, url: str, steps: int) -> Path:
        store = {"endpoint_url": proxy.endpoint, "addressing_style": "path", "retry_s": 60.0}
        data = {"path": url, "store": store, "stream_window": args.window, "read_ahead": args.read_ahead,
                "stream_cache_dir": str(work / f"cache-{name}"), "stream_cache_gb": 1.0}
        return make_run_dir(work / name, run_config(args, data, steps))

    # (1) and (2): the local run, then the streamed one under a cap of --cap times the local run's consumption
    local_dir = make_run_dir(work / "local", run_config(args, {"path": str(local)}, args.steps))
    local_final = train(local_dir)[-1]
    consumed = local_final.tokens_per_s * itemsize
    proxy.bandwidth(args.cap * consumed)
    proxy.clear()
    stream_dir = streamed("streamed", small_url, args.steps)
    stream_rows = train(stream_dir)
    proxy.bandwidth(None)
    stream_final = stream_rows[-1]
    gets, shards = gets_per_node(proxy)
    ratio = local_final.step_time / stream_final.step_time
    consumed_mb = args.steps * args.batch * RANKS * (args.seq_len + 1) * itemsize / 2**20
    print(f"(1) streamed/local step time: {stream_final.step_time:.4f} s / {local_final.step_time:.4f} s; "
          f"local/streamed = {ratio:.2f} (target >= 0.95: local ÷ streamed step time, 1.00 = streaming costs "
          f"nothing), bandwidth capped at {args.cap:g} x {consumed / 1e3:,.1f} kB/s consumed, steps "
          f"{args.log_every + 1}-{args.steps}; the steps waited {stream_final.data_wait_s:.3f} s for shards "
          f"(mean over ranks)")
    read, next_window = shards_read(meta, stream_dir)
    print(f"(2) GETs per node / shards read: {gets} / {shards} = {gets / max(1, shards):.2f} (target 1.00; "
          f"metrics: {stream_final.shards_fetched} shards fetched, {stream_final.cache_hits} cache hits, "
          f"{stream_final.data_mb:.3f} MB downloaded for {consumed_mb:.3f} MB of samples)")
    print(f"    the steps' samples lie in {read} shards; {next_window} more were fetched as the next window's when "
          f"the last steps ran")

    # (3): time to the first step, the small dataset against the large, no cap, fresh caches; the runs alternate
    firsts: dict[str, list[dict[str, float]]] = {"small": [], "large": []}
    for round_ in range(args.repeats):
        for name, url in (("small", small_url), ("large", large_url)):
            run_dir = streamed(f"first-{name}-{round_}", url, 2)
            train(run_dir)
            firsts[name].append(first_step(run_dir))
    small, big = (min(firsts[name], key=lambda parts: parts["total"]) for name in ("small", "large"))
    print(f"(3) first step: small {small['total']:.2f} s, large {big['total']:.2f} s, ratio "
          f"{big['total'] / small['total']:.2f} (dataset {len(large['shards']) / len(meta['shards']):.1f}x: "
          f"{len(meta['shards'])} and {len(large['shards'])} shards; target 1.00; from rank 0's process start to "
          f"the end of its first step, events.jsonl; best of {args.repeats})")
    for name, parts in (("small", small), ("large", big)):
        print(f"    {name}: bring-up {parts['bring_up']:.2f} s (of it the data's check {parts['data_check']:.2f} s), "
              f"stream, index and sampler {parts['open']:.2f} s, model {parts['build']:.2f} s, first step "
              f"{parts['step']:.2f} s")


if __name__ == "__main__":
    main()
