"""``launcher plan``: will a run fit its GPUs, how fast will it go, how does it scale. Submits nothing.

    launcher plan model=gpt_1b gpus=8
    launcher plan -m gpus=8,16,128 model=gpt_1b,gpt_70b
    launcher plan --json --mfu 0.4 --inter-gbps 400 model=gpt_7b gpus=64

The arithmetic is in launcher/planning/, its formulas and sources in docs/planning.md.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import List

from launcher.core.config import CHECKPOINTING
from launcher.planning.estimate import Estimate, estimate, set_scaling
from launcher.planning.hardware import GIB, Assumptions, hardware_for, precision_of
from launcher.planning.memory import activation_components, checkpointed_blocks, param_shapes, shard_group

DEFAULTS = Assumptions()

DESCRIPTION = """Estimate each composed run on its GPUs without submitting it: memory per GPU (sharded
parameters, gradients and AdamW state, gathered FSDP units, activations, margin) against the GPU's
memory, the largest micro-batch that fits, FLOPs and step time at a stated MFU, FSDP communication
and its time, and scaling efficiency across a sweep's GPU counts. A run that does not fit gets the
changes that would make it fit. GPU memory comes from cluster.gpu_memory_gb, else cluster.gpu_type or
the partition's gres type; the local cluster's virtual GPUs are planned as H100 80 GiB.
Formulas and sources: docs/planning.md."""

EPILOG = """examples:
  launcher plan model=gpt_1b gpus=8
  launcher plan -m gpus=8,16,128 model=gpt_1b,gpt_70b
  launcher plan model=gpt_70b gpus=128 parallel.sharding=full train.micro_batch=4 cluster=slurm
  launcher plan --json --inter-gbps 400 cluster.gpu_type=h200 model=gpt_7b gpus=64"""


def configure(p: argparse.ArgumentParser) -> None:
    p.description, p.epilog, p.formatter_class = DESCRIPTION, EPILOG, argparse.RawDescriptionHelpFormatter
    p.add_argument("overrides", nargs="*", metavar="key=value", help="Hydra overrides, as for a launch")
    p.add_argument("-f", "--file", type=Path, metavar="RUN.yaml", help="start from a run file, as for a launch")
    p.add_argument("-m", "--multirun", action="store_true",
                   help="sweep: one row per combination of comma-separated values")
    p.add_argument("--json", action="store_true", help="one JSON object per run, one per line")
    p.add_argument("--detail", action="store_true", help="with -m: also the full tables of every run")
    p.add_argument("--mfu", type=float, default=DEFAULTS.mfu,
                   help="fraction of the GPU's dense bf16 peak sustained on the FLOPs executed (default %(default)s)")
    p.add_argument("--intra-gbps", type=float, default=DEFAULTS.intra_gbps,
                   help="effective NVLink bandwidth per GPU inside a node, GB/s (default %(default)g)")
    p.add_argument("--inter-gbps", type=float, default=DEFAULTS.inter_gbps,
                   help="effective network bandwidth per node between nodes, GB/s (default %(default)g)")
    p.add_argument("--margin", type=float, default=DEFAULTS.margin,
                   help="memory margin for allocator fragmentation, fraction of the need (default %(default)g)")
    p.add_argument("--overhead-gib", type=float, default=DEFAULTS.overhead_gib,
                   help="fixed memory per GPU for CUDA context and NCCL/cuBLAS workspaces, GiB (default %(default)g)")


def main(args: argparse.Namespace) -> int:
    opts = Assumptions(mfu=args.mfu, intra_gbps=args.intra_gbps, inter_gbps=args.inter_gbps, margin=args.margin,
                       overhead_gib=args.overhead_gib)
    opts.check()

    from launcher.commands.launch import overrides_of
    from launcher.compose import compose_runs

    runs = compose_runs(overrides_of(args), multirun=args.multirun)
    estimates = [estimate(run.config, run.plan, hardware_for(run.config.cluster, precision_of(run.config), query_slurm=True), opts,
                          overrides=run.overrides) for run in runs]
    set_scaling(estimates)
    if args.json:
        for est in estimates:
            print(json.dumps(est.to_dict()))
        return 0
    if len(estimates) > 1:
        print(comparison(estimates))
        if not args.detail:
            return 0
    for index, est in enumerate(estimates):
        if index or len(estimates) > 1:
            print()
        print(detail(est))
    return 0


# ----------------------------------------------------------------------------------------------
# Formatting


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f}"


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _fits(est: Estimate) -> str:
    if est.fits:
        return "yes" if est.memory.fits else "yes (auto)"
    return "NO"


COMPARISON_HEADERS = ["model", "gpus", "sharding", "ckpt", "mb x acc", "mem/GPU GiB", "GPU GiB", "fits?",
                      "max mb", "step", "tok/s/GPU", "comm", "scaling eff."]


def comparison(estimates: List[Estimate]) -> str:
    """One row per run, then, for the runs that do not fit, what would."""
    from tabulate import tabulate

    rows = []
    for est in estimates:
        t, p = est.timing, est.plan
        rows.append([p.model, f"{p.gpus} ({p.nodes}x{p.tasks_per_node})", est.cfg.parallel.sharding,
                     est.cfg.parallel.activation_checkpointing, f"{p.micro_batch} x {p.grad_accum}",
                     f"{est.memory.total / GIB:,.1f}", f"{est.hardware.memory_gib:g}", _fits(est),
                     est.max_micro_batch or "-", _time(t.step_s), f"{t.tokens_per_s_per_gpu:,.0f}", _time(t.comm_s),
                     _pct(est.scaling_efficiency)])
    lines = [tabulate(rows, headers=COMPARISON_HEADERS, disable_numparse=True)]
    notes = _notes(estimates)
    for est in estimates:
        if not est.fits:
            fixes = "; or ".join(map(str, est.suggestions)) or "nothing found up to 4096 GPUs"
            lines.append(f"  {' '.join(est.overrides) or '(defaults)'}: does not fit; to fit: {fixes}")
    return "\n".join(lines + notes)


def _notes(estimates: List[Estimate]) -> List[str]:
    first = estimates[0]
    a = first.assumptions
    gpus = sorted({f"{e.hardware.gpu_type} {e.hardware.memory_gib:g} GiB ({e.hardware.memory_source})"
                   for e in estimates})
    return ["", f"GPU: {'; '.join(gpus)}",
            f"assumed: MFU {a.mfu:g} on executed FLOPs; NVLink {a.intra_gbps:g} GB/s per GPU; network "
            f"{a.inter_gbps:g} GB/s per node; margin {100 * a.margin:g}% + {a.overhead_gib:g} GiB; "
            "scaling eff. = tok/s/GPU vs the fewest-GPU run with the same other overrides"]


def detail(est: Estimate) -> str:
    """The full estimate of one run: memory, activations by checkpointing level, time and communication."""
    from tabulate import tabulate

    cfg, plan, m, t, hw, a = est.cfg, est.plan, est.memory, est.timing, est.hardware, est.assumptions
    model = cfg.model
    sharding, level = cfg.parallel.sharding, cfg.parallel.activation_checkpointing
    n = shard_group(plan, sharding)
    root, block = param_shapes(model)
    root_numel = sum(math.prod(s) for s in root)
    block_numel = sum(math.prod(s) for s in block)
    cb = 2 if est.precision == "bf16" else 4
    per_rank = plan.micro_batch * plan.grad_accum
    head = [
        f"# plan {plan.model}: {' '.join(est.overrides) or '(defaults)'}",
        f"{plan.gpus} GPUs = {plan.nodes} node(s) x {plan.tasks_per_node}; sharding {sharding} (over {n} GPUs"
        + (f", replicated over {plan.nodes} nodes" if sharding == "hybrid" and plan.nodes > 1 else "") + "); "
        f"activation checkpointing {level}; precision {est.precision}"
        + (" (auto: bf16 compute, fp32 master and reduce)" if cfg.parallel.precision == "auto" else ""),
        f"model: {plan.params:,} parameters (P), {model.n_layers} layers, d {model.d_model}, "
        f"{model.n_heads} heads, seq {model.seq_len}, vocab {model.vocab_size}",
        f"batch: micro-batch {plan.micro_batch} x grad_accum {plan.grad_accum} = {per_rank} sequences per GPU; "
        f"global {plan.global_batch} ({plan.tokens_per_step:,} tokens) per step",
        f"GPU: {hw.gpu_type}, {hw.memory_gib:g} GiB ({hw.memory_source}); peak bf16 {hw.peak_flops / 1e12:g} "
        f"TFLOP/s ({hw.peak_source})",
    ]
    shard = f"/ {n}" if n > 1 else "(1 GPU)"
    gathered = (f"{cb} B x P (grad_op: all units stay gathered)" if sharding == "grad_op"
                else f"{cb} B x (root {root_numel:,} + 2 x block {block_numel:,})")
    memory_rows = [
        ["parameters", f"4 B x P {shard} (fp32 shards)", _gib(m.params)],
        ["gradients", f"4 B x P {shard} (fp32 shards)", _gib(m.grads)],
        ["optimizer (AdamW)", f"8 B x P {shard} (m, v fp32) + 4 B per tensor", _gib(m.optimizer)],
        ["gathered params", gathered, _gib(m.gathered)],
        ["gradient buffers", f"{cb} B x root + ({cb} + 4) B x block", _gib(m.grad_buffers)],
        [f"activations ({level})", f"micro-batch {plan.micro_batch}, see below", _gib(m.activations)],
        ["margin", f"{100 * a.margin:g}% + {a.overhead_gib:g} GiB", _gib(m.margin)],
        ["total", "", _gib(m.total)],
        ["GPU memory", hw.memory_source, _gib(m.capacity)],
        ["fits", _fits(est) + f" ({100 * m.total / m.capacity:.0f}% of the GPU)", ""],
        ["largest micro-batch", f"{est.max_micro_batch or 'none'} (dividing {per_rank}); memory allows "
         f"{est.micro_batch_limit} whatever the batch", ""],
    ]
    s, h, r, b = model.seq_len, model.d_model, model.mlp_ratio, plan.micro_batch
    act_rows = []
    for lvl in CHECKPOINTING:
        c = activation_components(model, b, lvl, est.precision)
        act_rows.append([lvl + (" *" if lvl == level else ""), _gib(c["layers"]), _gib(c["recompute"]),
                         _gib(c["final_norm"]), _gib(c["loss_saved"] + c["loss_transient"]), _gib(sum(c.values()))])
    act_note = "\n".join([
        f"layer: s*b*h*(8+2r) values = {(8 + 2 * r) * cb}*s*b*h B in {est.precision} (Korthikanti et al. 2022's "
        "(34*s*b*h + 5*a*s^2*b) B less dropout masks and the",
        "  s^2 scores SDPA does not keep) + 4*a*s*b B log-sum-exp + 16*s*b B LayerNorm statistics; a checkpointed "
        f"block keeps its input, s*b*h*{cb} B,",
        "  and one block is rebuilt at a time in backward (recompute); loss: fp32 log-probs 4*s*b*V B kept, "
        "8*s*b*V B more in its backward;",
        f"  s={s} b={b} h={h} a={model.n_heads} r={r} V={model.vocab_size}"])
    comm_rows = [
        ["model FLOPs / step", f"{t.model_flops:.3e}", "(6N + 12*L*d*T) x tokens"],
        ["hardware FLOPs / step", f"{t.hardware_flops:.3e}", f"+ forward of {checkpointed_blocks(model.n_layers, level)} "
         "checkpointed blocks again"],
        ["compute / step", _time(t.compute_s), f"hardware FLOPs / GPUs / ({a.mfu:g} x peak)"],
        ["all-gather / GPU", f"{t.allgather_bytes / 1e9:,.2f} GB",
         f"{plan.grad_accum} x {1 if sharding == 'grad_op' else 2} x {cb} B x P x (n-1)/n"],
        ["reduce-scatter / GPU", f"{t.reduce_scatter_bytes / 1e9:,.2f} GB", f"{plan.grad_accum} x 4 B x P x (n-1)/n"],
        ["all-reduce / GPU", f"{t.allreduce_bytes / 1e9:,.2f} GB",
         f"hybrid: {plan.grad_accum} x 2 x 4 B x P/n x (m-1)/m across nodes"],
        ["communication / step", _time(t.comm_s), f"NVLink {a.intra_gbps:g} GB/s/GPU, network {a.inter_gbps:g} GB/s/node"],
        ["step time", _time(t.step_s), f"{_time(t.exposed_comm_s)} exposed + max(compute, rest of comm)"],
        ["tokens/s/GPU", f"{t.tokens_per_s_per_gpu:,.0f}", f"predicted MFU {100 * t.mfu:.1f}%"],
        ["scaling efficiency", _pct(est.scaling_efficiency), "vs the fewest-GPU run of the sweep"],
    ]
    parts = ["\n".join(head), tabulate(memory_rows, headers=["memory per GPU", "formula", "GiB"],
                                       disable_numparse=True),
             tabulate(act_rows, headers=[f"activations GiB, micro-batch {b}", "layers", "recompute", "final norm",
                                         "loss", "total"], disable_numparse=True)
             + "\n" + act_note,
             tabulate(comm_rows, headers=["time and communication", "", ""], disable_numparse=True)]
    if not est.fits:
        parts.append("DOES NOT FIT. To fit:\n" + "\n".join(f"  {s}" for s in est.suggestions)
                     if est.suggestions else "DOES NOT FIT, and no change found up to 4096 GPUs.")
    return "\n\n".join(parts)

