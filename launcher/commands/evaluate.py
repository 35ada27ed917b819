"""``launcher eval RUN --data PATH [--step N]``: a checkpoint's held-out loss and perplexity, recorded in the run.

PATH is a prepared dataset (``launcher data prepare``) or a token file. Its tokenizer must be the run's: a dataset
made with another is refused in one line (a token file records none, so it is taken for byte-level data). When PATH
is the run's own data, only its validation split is read (the rest was trained on); any other data is read whole,
up to ``--tokens``. One process, on a GPU if this machine has one, else the CPU (launcher/train/held_out.py).
The result is appended to the run's events (``evaluated``), which ``describe`` shows; ``--json`` prints it.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, Optional

from launcher.views.trained_model import with_checkpoint
from launcher.core.checkpoints import step_of
from launcher.core.startup import long_lived_imports
from launcher.core.config import DataConfig, RunConfig
from launcher.core.dataset import DatasetError, described
from launcher.core.store import StoreError, is_remote
from launcher.core.events import Evaluated
from launcher.core.rundir import append_event
from launcher.errors import LaunchError

DEFAULT_TOKENS = 1 << 20


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix)")
    parser.add_argument("--data", required=True, metavar="PATH",
                        help="a prepared dataset directory, a token file or s3://BUCKET/PREFIX")
    parser.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest good one)")
    parser.add_argument("--tokens", type=int, default=DEFAULT_TOKENS,
                        help=f"predict at most this many tokens (default {DEFAULT_TOKENS:,}; 0: all)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto (default): cuda if available, else cpu")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def main(args: argparse.Namespace) -> int:
    if args.tokens < 0:
        raise LaunchError(f"--tokens must be 0 (all) or more, got {args.tokens}")
    rec, cfg, checkpoint = with_checkpoint(args, "eval")
    remote = is_remote(args.data)
    path = args.data if remote else Path(args.data).expanduser().absolute()
    if not remote and not path.exists():
        raise LaunchError(f"--data {path} does not exist; give a prepared dataset directory, a token file or "
                          "s3://BUCKET/PREFIX")
    given = replace(cfg.data, path=str(path))
    same_tokenizer(rec.name, cfg, given)
    own = cfg.data.path is not None and str(path) == (cfg.data.path if is_remote(cfg.data.path) else
                                                      str(Path(cfg.data.path).expanduser().absolute()))
    split = "val" if own else "train"  # TokenData's "train" split of other data, val_fraction 0, is all of it

    with long_lived_imports():
        import torch  # lazy: keeps torch, numpy out of start-up

        from launcher.train.data import TokenData, open_stream  # lazy: keeps numpy out of start-up
        from launcher.train.held_out import held_out_loss  # lazy: keeps torch, numpy out of start-up

    device = torch.device("cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
                          else "cpu")
    try:
        dtype = data_dtype(given)
        data = TokenData(path, dtype, cfg.model.seq_len, cfg.data.val_fraction if own else 0.0, cfg.model.vocab_size,
                         open_stream(replace(given, dtype=dtype), 1))
        started = time.monotonic()
        found = held_out_loss(cfg.model, checkpoint, data, split, args.tokens, device, progress=progress_bar())
    except (DatasetError, StoreError, ValueError) as err:
        raise LaunchError(f"--data {path}: {err}") from None
    result: Dict[str, Any] = {"step": step_of(checkpoint), "data": str(path), "split": "val" if own else "all",
                              "tokens": found.tokens, "loss": round(found.loss, 6),
                              "perplexity": round(found.perplexity, 4), "seconds": round(time.monotonic() - started, 1),
                              "device": device.type}
    append_event(Path(rec.run_dir), Evaluated(**result))
    if args.json:
        print(json.dumps({"run": rec.name, **result}))
    else:
        print(f"{rec.name} step {result['step']}: loss {found.loss:.4f}, perplexity {found.perplexity:,.2f} on "
              f"{found.tokens:,} tokens of {path}{' (its validation split)' if own else ''}")
    return 0


def tokenizer_key(record: Optional[Dict[str, Any]]) -> str:
    """What makes two tokenizers the same: their file's sha256, or ``byte`` for byte-level data."""
    if not record or record.get("file") is None:
        return "byte"
    return str(record.get("sha256"))


def tokenizer_record(data: DataConfig) -> Optional[Dict[str, Any]]:
    """The tokenizer a dataset records (None: a token file, which records none)."""
    found = described(data) if data.path else None
    return found[0]["tokenizer"] if found else None


def same_tokenizer(name: str, cfg: RunConfig, given: DataConfig) -> None:
    """LaunchError in one line unless the data ``given`` was made with the run's tokenizer."""
    path = given.path
    try:
        theirs = tokenizer_record(given)
        mine = tokenizer_record(cfg.data)
    except (DatasetError, StoreError) as err:
        raise LaunchError(str(err)) from None
    if tokenizer_key(theirs) != tokenizer_key(mine):
        said = lambda record: (record or {}).get("spec") or (record or {}).get("kind") or "byte"  # noqa: E731
        raise LaunchError(f"--data {path} was made with the {said(theirs)} tokenizer, {name}'s data with "
                          f"{said(mine)}: evaluate on data prepared with the run's tokenizer")


def data_dtype(given: DataConfig) -> str:
    """The token type of the data: a dataset's own, a token file's as the run reads its data."""
    found = described(given)
    return found[0]["dtype"] if found else given.dtype


def progress_bar():
    """A progress line on standard error, where it is a terminal (a pipe or log gets none)."""
    if not sys.stderr.isatty():
        return None

    def show(done: int, total: int) -> None:
        print(f"\r  evaluating: {done:,}/{total:,} windows ({100 * done // total}%)", end="" if done < total else "\n",
              file=sys.stderr, flush=True)

    return show
