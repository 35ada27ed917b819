#!/usr/bin/env python
"""How much does launcher/train/ cost over plain PyTorch, and how well do ranks scale? (CPU)

(a) overhead: tokens/s of our loop (``python -m launcher.train`` on one rank: the
    loop, metrics, sampler) divided by tokens/s of a plain single-process loop with the
    same model, batch, AdamW and clipping. Goal >= 0.95.
(b) scaling: per-rank tokens/s with 2 ranks divided by per-rank tokens/s with 1
    rank, the same batch per rank (weak scaling), so the difference is what
    sharding costs: all-gathers and reduce-scatters over gloo. Goal >= 0.85.
    For scale, also the machine's own ceiling: two plain loops at once vs one
    alone (cores, caches and memory bandwidth shared; no communication).

Every process runs one thread: on a small machine shared with other work, a
multi-threaded process slows to its slowest thread and measures the neighbours.
Throughput leaves out the first log interval (warm-up) in every loop; each
number is the best of ``--repeats`` rounds, the four measurements interleaved
in each round, to shed noise from other processes. Run on an idle machine with
at least 2 cores.

Every run directory (the one- and two-rank runs of ``python -m launcher.train``, and the plain loop's settings) is
composed and written by the launcher's own code (``launcher.compose.composer.compose_runs``,
``launcher.submit.submitter.write_run_files``; see :func:`make_run_dir`), so what is measured is what a launch runs.

    python scripts/bench_train.py [--steps 30] [--repeats 3] [--d-model 256] [--layers 4] [--seq-len 256] [--batch 8]
    python scripts/bench_train.py --quick    # seconds: a tiny model, 12 steps, one round (tests/cluster/test_bench_quick.py)
"""
from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from launcher.core.config import RunConfig  # noqa: E402
from launcher.core.rundir import last_metrics  # noqa: E402
from launcher.train.data import StepSampler, TokenData, token_file  # noqa: E402
from launcher.train.optim import build_optimizer  # noqa: E402
from launcher.train.model import GPT  # noqa: E402

LOG_EVERY = 5
QUICK = {"steps": 12, "repeats": 1, "d_model": 64, "layers": 2, "seq_len": 64, "batch": 2}


def make_run_dir(overrides: list[str], run_dir: Path) -> RunConfig:
    """A run directory as a launch writes it (config.yaml, plan.json, run.yaml), from Hydra overrides.

    The launcher's two entry points are imported here only, so that a move of them touches one line."""
    from launcher.compose.composer import compose_runs
    from launcher.submit.submitter import write_run_files
    (run,) = compose_runs(overrides)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_run_files(run, run_dir)
    return run.config


def overrides(args, world_size: int) -> list[str]:
    """The benchmark's run: ``--batch`` sequences per rank in one micro-batch, fp32, no eval or checkpoints."""
    return ["model=gpt_tiny", f"model.d_model={args.d_model}", f"model.n_heads={max(1, args.d_model // 64)}",
            f"model.n_layers={args.layers}", f"model.seq_len={args.seq_len}", f"gpus={world_size}",
            f"train.steps={args.steps}", f"train.global_batch={args.batch * world_size}",
            f"train.micro_batch={args.batch}", f"train.log_every={LOG_EVERY}", "train.eval_every=0",
            "train.checkpoint_every=0", "train.keep_checkpoints=1", "cluster=local", "parallel.precision=fp32",
            "tracking=none"]


def describe(cfg: RunConfig, world_size: int) -> str:
    m, t = cfg.model, cfg.train
    return (f"composed ({world_size} rank{'s' if world_size > 1 else ''}): {m.name} d_model={m.d_model} "
            f"n_layers={m.n_layers} n_heads={m.n_heads} seq_len={m.seq_len} vocab={m.vocab_size}; "
            f"global_batch={t.global_batch} micro_batch={t.micro_batch} steps={t.steps} "
            f"precision={cfg.parallel.precision} sharding={cfg.parallel.sharding}")


def ours(args, world_size: int) -> float:
    """Per-rank tokens/s of ``python -m launcher.train`` on ``world_size`` local ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / f"bench_{world_size}"
        make_run_dir(overrides(args, world_size), run_dir)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for rank in range(world_size):
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                   "PYTHONPATH": str(ROOT)}
            procs.append(subprocess.Popen([sys.executable, "-m", "launcher.train", str(run_dir)], cwd=ROOT, env=env,
                                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        for proc in procs:
            _, err = proc.communicate()
            if proc.returncode:
                raise SystemExit(f"python -m launcher.train failed:\n{err[-3000:]}")
        return last_metrics(run_dir).tokens_per_s_per_gpu


def plain(args) -> float:
    """Tokens/s of a plain single-process loop on one thread: no FSDP, no process group; the model,
    batch and optimizer settings of the composed one-rank run."""
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = make_run_dir(overrides(args, 1), Path(tmp) / "plain")
    torch.manual_seed(0)
    mcfg, tcfg, dcfg = cfg.model, cfg.train, cfg.data
    model = GPT(mcfg)
    optimizer, scheduler = build_optimizer(model, tcfg)
    data = TokenData(token_file(dcfg), dcfg.dtype, mcfg.seq_len, dcfg.val_fraction, mcfg.vocab_size)
    sampler = StepSampler(data.num_samples("train"), args.batch, tcfg.seed)
    start = None
    for step in range(args.steps):
        if step == LOG_EVERY:  # the same warm-up that our loop's summary leaves out
            start = time.perf_counter()
        x, y = (torch.from_numpy(a) for a in data.batch("train", sampler.step_indices(step)))
        loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tcfg.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
    return (args.steps - LOG_EVERY) * args.batch * mcfg.seq_len / (time.perf_counter() - start)


def plain_processes(count: int) -> float:
    """Tokens/s per process of ``count`` plain loops (one thread each) running at the same time."""
    cmd = [sys.executable, __file__, "--plain-only", *sys.argv[1:]]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(count)]
    results = [float(proc.communicate()[0]) for proc in procs]
    return sum(results) / count


def best_of(repeats: int, *measures):
    """Each measure's best over ``repeats`` rounds, the measures alternating within a round."""
    rounds = [[measure() for measure in measures] for _ in range(repeats)]
    return [max(values) for values in zip(*rounds)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--plain-only", action="store_true", help=argparse.SUPPRESS)  # one plain loop
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke run in seconds (a tiny model, few steps, one round): the figures it prints "
                             "say that everything runs, not how fast")
    args = parser.parse_args()
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    if args.steps <= 2 * LOG_EVERY:
        parser.error(f"--steps must be more than {2 * LOG_EVERY}")
    if args.plain_only:
        print(plain(args))
        return
    print(f"model d={args.d_model} L={args.layers} T={args.seq_len}, {args.batch} sequences per rank per step, "
          f"{args.steps} steps, best of {args.repeats}, {os.cpu_count()} CPUs{' (quick)' if args.quick else ''}")
    with tempfile.TemporaryDirectory() as tmp:  # what the runs train, as composed by the launcher's code
        for world_size in (1, 2):
            print("  " + describe(make_run_dir(overrides(args, world_size), Path(tmp) / str(world_size)), world_size))

    plain_one, plain_two, ours_one, ours_two = best_of(
        args.repeats, lambda: plain_processes(1), lambda: plain_processes(2), lambda: ours(args, 1),
        lambda: ours(args, 2))
    print(f"(a) overhead: ours {ours_one:,.0f} tok/s / plain {plain_one:,.0f} tok/s = {ours_one / plain_one:.3f} "
          f"(goal >= 0.95)")
    print(f"(b) scaling: 2 ranks {ours_two:,.0f} tok/s/rank / 1 rank {ours_one:,.0f} tok/s/rank = "
          f"{ours_two / ours_one:.3f} (goal >= 0.85)")
    print(f"    machine ceiling: 2 plain loops at once {plain_two:,.0f} tok/s each / 1 alone {plain_one:,.0f} tok/s "
          f"= {plain_two / plain_one:.3f}")


if __name__ == "__main__":
    main()
