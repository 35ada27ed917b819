"""``launcher export RUN OUT [--step N] [--dtype fp32|bf16]``: a run's checkpoint as a Hugging Face model
directory that transformers, vLLM and lm-evaluation-harness load (``AutoModelForCausalLM.from_pretrained(OUT)``).

OUT gets ``model.safetensors`` (sharded above ``--max-shard-size``, with its index), ``config.json`` and
``generation_config.json`` (GPT2LMHeadModel: launcher/train/hf.py), the run's tokenizer as transformers loads it
(a byte-level run gets one made: launcher/dataset/tokenizer.py), and a README.md model card. It is written in a
hidden directory beside OUT and renamed into place when whole, so OUT is never half an export
(launcher/train/hf_export.py, which a run's job also uses: ``train.export_every``). One process on the CPU; memory
holds one shard. For a run on a remote cluster the command runs
there (launcher/remote/forward.py) with that cluster's Python, OUT being a path there.
"""
from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path
from typing import List

from launcher.core.startup import long_lived_imports
from launcher.remote.forward import forward, without_option
from launcher.remote.ship import fetch_dir
from launcher.views.lookup import lookup, roots_of
from launcher.views.trained_model import chosen_checkpoint, need_torch, run_config, run_tokenizer
from launcher.errors import LaunchError

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(KB|MB|GB|B)", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix)")
    parser.add_argument("out", metavar="OUT", help="the directory to write (new or empty; --force replaces it)")
    parser.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest good one)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="the weights' type (default fp32: the checkpoint's master weights exactly)")
    parser.add_argument("--max-shard-size", default="2GB",  # launcher/train/hf_export.py DEFAULT_SHARD_BYTES
                        help="largest safetensors file, e.g. 500MB (default 2GB)")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists and is not empty")
    parser.add_argument("--to-local", metavar="DIR", type=Path,
                        help="a run on a remote cluster: copy OUT (a path there) into DIR here afterwards")


def shard_bytes(text: str) -> int:
    match = _SIZE.fullmatch(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise LaunchError(f"--max-shard-size {text!r}: give a size such as 500MB or 2GB")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def main(args: argparse.Namespace) -> int:
    max_shard = shard_bytes(args.max_shard_size)
    need_torch("export")
    rec = lookup(roots_of(args), args.name)
    if args.to_local is not None:
        raise LaunchError(f"--to-local copies an export from a remote cluster; {rec.name} is a run on this machine, "
                          "and OUT is already here")
    out = Path(args.out).expanduser().absolute()
    check_out(out, Path(rec.run_dir), args.force)
    cfg = run_config(rec)
    checkpoint = chosen_checkpoint(rec, cfg, args.step, "export")
    run_tokenizer(cfg.data)  # the dataset's tokenizer file is there and is the one the data was made with

    with long_lived_imports():
        from launcher.train.hf_export import export_run  # lazy: keeps torch, numpy out of start-up

    started = time.monotonic()
    done = export_run(Path(rec.run_dir), checkpoint, out, args.dtype, max_shard)
    print(f"Exported {rec.name} step {done.step} ({args.dtype}, {done.total_bytes / 1e6:,.1f} MB in "
          f"{done.shards} safetensors file(s)) to {out} in {time.monotonic() - started:.1f} s")
    print(f"  load it: transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
    return 0


def export_remote(remote, args: List[str], parsed: argparse.Namespace) -> int:
    """``export RUN OUT --to-local DIR`` for a run on a remote cluster: the export there (OUT a path there), then
    OUT copied into DIR here over the same connection (launcher/remote/ship.py fetch_dir)."""
    into = parsed.to_local.expanduser().absolute()
    copy = into / Path(parsed.out).name
    if copy.exists() and (not copy.is_dir() or any(copy.iterdir())) and not parsed.force:
        raise LaunchError(f"{copy} exists and is not empty; choose another --to-local DIR, or --force to replace it")
    status = forward(remote, without_option(args, "--to-local"))
    if status:
        return status
    from launcher.train.hf_export import replace  # lazy: keeps torch, numpy out of start-up

    into.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{copy.name}.", dir=into) as work:
        replace(fetch_dir(remote, parsed.out, Path(work)), copy)
    print(f"Copied it to {copy}")
    return 0


def check_out(out: Path, run_dir: Path, force: bool) -> None:
    """OUT may be new, an empty directory, or with ``--force`` any directory but one holding the run."""
    if out.exists() and not out.is_dir():
        raise LaunchError(f"{out} exists and is not a directory; choose another OUT")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise LaunchError(f"{out} exists and is not empty; choose another OUT, or --force to replace it")
        if run_dir.absolute() == out or out in run_dir.absolute().parents:
            raise LaunchError(f"{out} holds the run {run_dir.name} itself; choose another OUT")
