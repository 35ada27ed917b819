"""A run's checkpoint as a Hugging Face model directory (``launcher export``, and ``train.export_every`` from a
run's job; launcher/train/hf.py maps the names).

The sharded DCP checkpoint is read one tensor at a time (DCP loads any subset of a state dict, from whichever
ranks' files hold its pieces), converted, and gathered into safetensors shards of at most ``max_shard_bytes``
each, written one at a time: memory holds one shard and the tensor being read, never the model, whatever its
size. Above one shard, ``model.safetensors.index.json`` maps every tensor to its file, as transformers writes it.
The command checks the checkpoint against its manifests first (launcher/train/manifest.py). Needs no GPU, no
process group and no cluster: one process on a CPU.
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed.checkpoint as dcp

from launcher.core.checkpoints import step_dir, step_of
from launcher.core.config import DataConfig, ModelConfig, RunConfig, load_run_config
from launcher.core.dataset import described
from launcher.core.plan import read_plan
from launcher.core import events
from launcher.core.metrics import EvalRow, FinalRow
from launcher.core.rundir import append_event, code_source, read_metrics, read_events
from launcher.train.hf import Tensor, generation_config, gpt2_config, gpt2_tensors, save_tokenizer
from launcher.train.manifest import checkpoint_problems

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
DEFAULT_SHARD_BYTES = 2 * 10 ** 9
EXPORTS = "hf"  # in a run directory: what train.export_every writes, RUN/hf/step_<NNNNNNNN>
HELD = ".held"  # under RUN/hf: the checkpoints of the exports not yet done, hard-linked
CONFIG_NAMES = {"fp32": "float32", "bf16": "bfloat16"}
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class Written:
    """What :func:`write_model` wrote: its files (relative to the directory) and the tensors' bytes."""

    files: List[str]
    total_bytes: int


@dataclass(frozen=True)
class Exported:
    """An export done: the checkpoint's step, the weights' bytes and how many safetensors files hold them."""

    step: int
    total_bytes: int
    shards: int


def export_run(run_dir: Path, checkpoint: Path, out: Path, dtype: str, max_shard_bytes: int) -> Exported:
    """Export ``checkpoint`` of the run in ``run_dir`` to the directory ``out`` (replaced whole if it exists):
    weights, configs, tokenizer and model card, written beside it and renamed into place once complete."""
    cfg = load_run_config(run_dir / "config.yaml")
    source, eot, spec = tokenizer_of(cfg.data)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        written = write_model(cfg.model, checkpoint, work, dtype, max_shard_bytes, eot)
        save_tokenizer(work, source, eot, cfg.model.seq_len)
        (work / "README.md").write_text(model_card(run_dir, cfg, step_of(checkpoint), dtype, spec))
        replace(work, out)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return Exported(step_of(checkpoint), written.total_bytes, sum(f.endswith(".safetensors") for f in written.files))


def tokenizer_of(data: DataConfig) -> Tuple[Optional[Path], Optional[int], str]:
    """The run's tokenizer as its dataset's metadata records it: its file (None: byte-level, the default corpus or
    a single token file), its end-of-text id, and its name."""
    found = described(data) if data.path is not None else None
    if found is None:
        return None, None, "byte"
    record, directory = found[0]["tokenizer"], found[1]
    source = directory / record["file"] if record.get("file") else None
    return source, record.get("end_of_text"), str(record.get("spec") or record.get("kind") or "byte")


def write_model(cfg: ModelConfig, checkpoint: Path, out: Path, dtype: str, max_shard_bytes: int,
                eot: Optional[int]) -> Written:
    """Write ``checkpoint``'s weights into ``out`` as GPT2LMHeadModel's safetensors, config.json and
    generation_config.json."""
    from safetensors.torch import save_file  # lazy: keeps safetensors out of start-up

    tensors, itemsize = gpt2_tensors(cfg), torch.tensor([], dtype=DTYPES[dtype]).element_size()
    shards = split(tensors, itemsize, max_shard_bytes)
    names = [SINGLE] if len(shards) == 1 else [f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                                               for i in range(1, len(shards) + 1)]
    weight_map: Dict[str, str] = {}
    for name, shard in zip(names, shards):
        save_file({t.name: read(checkpoint, t, DTYPES[dtype]) for t in shard}, str(out / name),
                  metadata={"format": "pt"})
        weight_map.update((t.name, name) for t in shard)
    total = sum(numel(t) for t in tensors) * itemsize
    files = list(names)
    if len(shards) > 1:
        (out / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        files.append(INDEX)
    (out / "config.json").write_text(json.dumps(gpt2_config(cfg, CONFIG_NAMES[dtype], eot), indent=2))
    (out / "generation_config.json").write_text(json.dumps(generation_config(eot), indent=2))
    return Written(files + ["config.json", "generation_config.json"], total)


def split(tensors: List[Tensor], itemsize: int, max_shard_bytes: int) -> List[List[Tensor]]:
    """The tensors in order, in shards of at most ``max_shard_bytes`` (a larger tensor alone in its own)."""
    shards: List[List[Tensor]] = [[]]
    size = 0
    for tensor in tensors:
        nbytes = numel(tensor) * itemsize
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(tensor)
        size += nbytes
    return shards


def numel(tensor: Tensor) -> int:
    count = 1
    for dim in tensor.shape:
        count *= dim
    return count


def read(checkpoint: Path, tensor: Tensor, dtype: torch.dtype) -> torch.Tensor:
    """One tensor of the exported state dict: read from the checkpoint alone (its fp32 master weight),
    transposed for Conv1D, in ``dtype``; or a zero bias."""
    if tensor.source is None:
        return torch.zeros(tensor.shape, dtype=dtype)
    shape = tensor.shape[::-1] if tensor.transposed else tensor.shape
    value = torch.empty(shape, dtype=torch.float32)
    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": {tensor.source: value}}, checkpoint_id=str(checkpoint))
    if tensor.transposed:
        value = value.t()
    return value.to(dtype).contiguous()


def replace(work: Path, out: Path) -> None:
    """Put the finished export ``work`` at ``out``, whatever was there before going only once it is."""
    old: Optional[Path] = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{secrets.token_hex(4)}"
        out.rename(old)
    work.chmod(0o755)  # mkdtemp's 0700 was for the export in progress; a model directory is read by others
    work.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def model_card(run_dir: Path, cfg: RunConfig, step: int, dtype: str, tokenizer: str) -> str:
    """README.md of the export: what the model is and how it was trained, from the run's own records."""
    plan = read_plan(run_dir)
    seen = [row for row in read_metrics(run_dir) if not isinstance(row, FinalRow) and row.step <= step]
    last = seen[-1] if seen else None
    evals = [row.eval_loss for row in seen if isinstance(row, EvalRow)]
    source = code_source(run_dir) or {}
    held_out = [e for e in read_events(run_dir) if isinstance(e, events.Evaluated) and e.step == step]
    lines = [
        f"# {run_dir.name}", "",
        f"A GPT ({cfg.model.name}: {cfg.model.n_layers} layers, d_model {cfg.model.d_model}, {cfg.model.n_heads} "
        f"heads, context {cfg.model.seq_len}, vocabulary {cfg.model.vocab_size}) trained with slurm-gpt-launcher "
        f"and exported as transformers' GPT2LMHeadModel ({dtype}; zero biases, exact GELU).", "",
        "| | |", "|---|---|",
        f"| steps | {step} of {cfg.train.steps} |",
        f"| tokens seen | {step * plan.tokens_per_step:,} ({plan.tokens_per_step:,} per step) |",
        f"| GPUs | {plan.gpus} ({plan.nodes} x {plan.gpus_per_node}) |",
        f"| final train loss | {_loss(last.loss if last else None)} (step {last.step if last else '-'}) |",
        f"| final eval loss | {_loss(evals[-1] if evals else None)} |",
        *(f"| held-out loss | {_loss(e.loss)}, perplexity {e.perplexity} on {e.tokens or 0:,} "
          f"tokens of {e.data} (launcher eval) |" for e in held_out),
        f"| tokenizer | {tokenizer} |",
        f"| data | {cfg.data.path or 'the standard-library corpus'} |",
        f"| commit | {source.get('commit') or 'unknown'}{' (with uncommitted changes)' * bool(source.get('dirty'))} |",
        "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "model = AutoModelForCausalLM.from_pretrained(PATH)", "tokenizer = AutoTokenizer.from_pretrained(PATH)", "```",
        "", f"The run's own config: `launcher -f {run_dir / 'run.yaml'}` trains it again.", ""]
    return "\n".join(lines)


def _loss(value) -> str:
    return f"{value:.4f}" if isinstance(value, (int, float)) else "-"


class Exports:
    """The exports the main rank starts while it trains (``train.export_every``, ``export_final``): each a process
    of its own on this node, converting a checkpoint just saved, so that no rank waits for it and the watchdog sees
    steps as usual. Its checkpoint's files are first hard-linked aside into RUN/hf/.held (milliseconds), so that a
    later save's pruning cannot take them away mid-read. Each writes RUN/hf/step_N and records ``exported`` or
    ``export_failed`` in the run's events: a failed export is the run's news, not its failure. The task waits for
    them once training ends and the watchdog is stopped (Slurm would end them with the job step).

    An export cut short (the attempt requeued, failed or killed) leaves its held files, and only then: the next
    attempt's Exports starts it again from them as it is made, so a preemption costs no export; an export due after
    the save that ends an attempt is held for the next one in the same way (:meth:`defer`)."""

    def __init__(self, run_dir: Path):
        self.run_dir, self.running = Path(run_dir), []
        for held in sorted((self.run_dir / EXPORTS / HELD).glob("step_*")):
            self._start(step_of(held), held)

    def start(self, step: int) -> None:
        """Start the export of the checkpoint of ``step``; a failure to start it is recorded, never raised."""
        self._start(step)

    def defer(self, step: int) -> None:
        """Hold the checkpoint of ``step`` for the next attempt to export as it begins: this one ends at the save the
        export was due after (Slurm's signal came). Copied aside where links cannot be made."""
        try:
            held = self._hold(step)
            if held == step_dir(self.run_dir, step):
                shutil.copytree(held, self.run_dir / EXPORTS / HELD / held.name)
        except OSError as err:
            append_event(self.run_dir, events.ExportFailed(step=step, error=f"{type(err).__name__}: {err}"))

    def _start(self, step: int, held: Optional[Path] = None) -> None:
        try:
            held = held or self._hold(step)
            with open(self.run_dir / EXPORTS / f"{held.name}.log", "ab") as log:
                self.running.append(subprocess.Popen(
                    [sys.executable, "-m", "launcher.train.hf_export", str(self.run_dir), str(held)],
                    stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL))
        except OSError as err:
            append_event(self.run_dir, events.ExportFailed(step=step, error=f"{type(err).__name__}: {err}"))

    def _hold(self, step: int) -> Path:
        """The checkpoint of ``step`` hard-linked aside; the checkpoint itself where links cannot be made."""
        held = self.run_dir / EXPORTS / HELD / step_dir(self.run_dir, step).name
        held.mkdir(parents=True, exist_ok=True)
        try:
            for file in step_dir(self.run_dir, step).iterdir():
                os.link(file, held / file.name)
        except OSError:  # a file system without hard links: read in place
            shutil.rmtree(held, ignore_errors=True)
            held = step_dir(self.run_dir, step)
        return held

    def wait(self) -> None:
        for proc in self.running:
            proc.wait()

    def stop(self) -> None:
        """End the exports still running, as the attempt ends early: none outlives its job as an orphan, and each
        leaves its held files for the next attempt. SIGKILL: an export has nothing to tidy that its redo does not
        (it clears the half-written output), and a SIGTERM can be lost (caught by this process's own handler in
        a child not yet exec'd), leaving the attempt to wait for the whole export."""
        for proc in self.running:
            if proc.poll() is None:
                proc.kill()
        self.wait()


def main(argv: List[str]) -> int:
    """``python -m launcher.train.hf_export RUN_DIR CHECKPOINT``: one background export (:class:`Exports`)."""
    run_dir, checkpoint = Path(argv[0]), Path(argv[1])
    step, started = step_of(checkpoint), time.monotonic()
    out = run_dir / EXPORTS / step_dir(run_dir, step).name
    try:
        for stale in out.parent.glob(f".{out.name}.*"):  # the work of this export cut short in an earlier attempt
            shutil.rmtree(stale, ignore_errors=True)

        found = checkpoint_problems(checkpoint)
        if found:
            raise ValueError(f"the checkpoint is damaged: {found[0]}")
        done = export_run(run_dir, checkpoint, out, "fp32", DEFAULT_SHARD_BYTES)
        append_event(run_dir, events.Exported(step=step, path=str(out), bytes=done.total_bytes,
                                       seconds=round(time.monotonic() - started, 1)))
    except Exception as err:  # noqa: BLE001 (the run goes on: its record says what failed)
        traceback.print_exc()
        append_event(run_dir, events.ExportFailed(step=step, error=f"{type(err).__name__}: {err}".splitlines()[0]))
        return 1
    finally:
        if checkpoint.parent.name == HELD:
            shutil.rmtree(checkpoint, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
