"""``launcher export RUN OUT [--step N] [--dtype fp32|bf16]``: a run's checkpoint as a Hugging Face model
directory that transformers, vLLM and lm-evaluation-harness load (``AutoModelForCausalLM.from_pretrained(OUT)``).

OUT gets ``model.safetensors`` (sharded above ``--max-shard-size``, with its index), ``config.json`` and
``generation_config.json`` (GPT2LMHeadModel: launcher/train/hf.py), the run's tokenizer as transformers loads it
(a byte-level run gets one made: launcher/dataset/tokenizer.py), and a README.md model card. It is written in a
hidden directory beside OUT and renamed into place when whole, so OUT is never half an export. One process on
the CPU; memory holds one shard (launcher/train/export.py). For a run on a remote cluster the command runs
there (launcher/remote/forward.py) with that cluster's Python, OUT being a path there.
"""
from __future__ import annotations

import argparse
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Optional

from launcher.commands.common import lookup, roots_of
from launcher.commands.trained import chosen_checkpoint, need_torch, run_config, run_tokenizer
from launcher.core.checkpoints import step_of
from launcher.core.config import RunConfig
from launcher.errors import LaunchError
from launcher.status.index import RunRecord

_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*(KB|MB|GB|B)", re.IGNORECASE)
_UNITS = {"B": 1, "KB": 1000, "MB": 1000 ** 2, "GB": 1000 ** 3}
DEFAULT_SHARD = "2GB"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="RUN", help="run name (or unique prefix)")
    parser.add_argument("out", metavar="OUT", help="the directory to write (new or empty; --force replaces it)")
    parser.add_argument("--step", type=int, help="the checkpoint of this step (default: the newest good one)")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32",
                        help="the weights' type (default fp32: the checkpoint's master weights exactly)")
    parser.add_argument("--max-shard-size", default=DEFAULT_SHARD,
                        help=f"largest safetensors file, e.g. 500MB (default {DEFAULT_SHARD})")
    parser.add_argument("--force", action="store_true", help="replace OUT if it exists and is not empty")


def shard_bytes(text: str) -> int:
    match = _SIZE.fullmatch(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise LaunchError(f"--max-shard-size {text!r}: give a size such as 500MB or 2GB")
    return int(float(match.group(1)) * _UNITS[match.group(2).upper()])


def main(args: argparse.Namespace) -> int:
    max_shard = shard_bytes(args.max_shard_size)
    need_torch("export")
    rec = lookup(roots_of(args), args.name)
    out = Path(args.out).expanduser().absolute()
    check_out(out, Path(rec.run_dir), args.force)
    cfg = run_config(rec)
    checkpoint = chosen_checkpoint(rec, cfg, args.step, "export")
    codec = run_tokenizer(cfg.data)

    from launcher.dataset.tokenizer import save_for_transformers
    from launcher.train.export import write_model

    started = time.monotonic()
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        written = write_model(cfg.model, checkpoint, work, args.dtype, max_shard, codec.eot)
        files = [*written.files, *save_for_transformers(codec, work, cfg.model.seq_len)]
        (work / "README.md").write_text(model_card(rec, cfg, step_of(checkpoint), args.dtype, codec.spec))
        files.append("README.md")
        replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    print(f"Exported {rec.name} step {step_of(checkpoint)} ({args.dtype}, {written.total_bytes / 1e6:,.1f} MB in "
          f"{len([f for f in files if f.endswith('.safetensors')])} safetensors file(s)) to {out} in "
          f"{time.monotonic() - started:.1f} s")
    print(f"  load it: transformers.AutoModelForCausalLM.from_pretrained({str(out)!r})")
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


def replace(work: Path, out: Path) -> None:
    """Put the finished export ``work`` at ``out``, whatever was there before going only once it is."""
    old: Optional[Path] = None
    if out.exists():
        old = out.parent / f"{work.name}.old"
        out.rename(old)
    work.chmod(0o755)  # mkdtemp's 0700 was for the export in progress; a model directory is read by others
    work.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def model_card(rec: RunRecord, cfg: RunConfig, step: int, dtype: str, tokenizer: str) -> str:
    """README.md of the export: what the model is and how it was trained, from the run's own records."""
    from launcher.core.plan import read_plan
    from launcher.core.rundir import read_metrics
    from launcher.submit.freeze import code_source

    run_dir = Path(rec.run_dir)
    plan = read_plan(run_dir)
    seen = [m for m in read_metrics(run_dir) if not m.get("final") and m["step"] <= step]
    last = seen[-1] if seen else {}
    evals = [m["eval_loss"] for m in seen if isinstance(m.get("eval_loss"), (int, float))]
    source = code_source(run_dir) or {}
    lines = [
        f"# {rec.name}", "",
        f"A GPT ({cfg.model.name}: {cfg.model.n_layers} layers, d_model {cfg.model.d_model}, {cfg.model.n_heads} "
        f"heads, context {cfg.model.seq_len}, vocabulary {cfg.model.vocab_size}) trained with slurm-gpt-launcher "
        f"and exported as transformers' GPT2LMHeadModel ({dtype}; zero biases, exact GELU).", "",
        "| | |", "|---|---|",
        f"| steps | {step} of {cfg.train.steps} |",
        f"| tokens seen | {step * plan.tokens_per_step:,} ({plan.tokens_per_step:,} per step) |",
        f"| GPUs | {plan.gpus} ({plan.nodes} x {plan.gpus_per_node}) |",
        f"| final train loss | {_loss(last.get('loss'))} (step {last.get('step', '-')}) |",
        f"| final eval loss | {_loss(evals[-1] if evals else None)} |",
        f"| tokenizer | {tokenizer} |",
        f"| data | {cfg.data.path or 'the standard-library corpus'} |",
        f"| commit | {source.get('commit') or 'unknown'}{' (with uncommitted changes)' * bool(source.get('dirty'))} |",
        "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "model = AutoModelForCausalLM.from_pretrained(PATH)", "tokenizer = AutoTokenizer.from_pretrained(PATH)", "```",
        "", f"The run's own config: `launcher -f {run_dir / 'run.yaml'}` trains it again.", ""]
    return "\n".join(lines)


def _loss(value) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"
