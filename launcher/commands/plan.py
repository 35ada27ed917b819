"""``launcher plan``: will a run fit its GPUs, how fast will it go, how does it scale. Submits nothing.

    launcher plan model=gpt_1b gpus=8
    launcher plan -m gpus=8,16,128 model=gpt_1b,gpt_70b
    launcher plan --json --mfu 0.4 --inter-gbps 400 model=gpt_7b gpus=64

The arithmetic is in launcher/forecast/, its formulas and sources in docs/planning.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, List, Optional

from launcher.compose.catalog import auto_asked
from launcher.core.gpus import DEFAULT_GPU, GPUS
from launcher.core.config import CHECKPOINTING, LOCAL_CLUSTER
from launcher.forecast.estimate import Estimate, estimate, set_scaling
from launcher.job.secret_store import secrets_dir, store_secrets
from launcher.forecast.learned import ClusterAccuracy, Error, Summary, accuracies, correction_for, seconds
from launcher.forecast.host import host_memory, machine_memory, to_fit
from launcher.forecast.target import GIB, Assumptions, TargetGpu, hardware_for, precision_of
from launcher.forecast.memory import activation_components, activation_terms, shard_group
from launcher.errors import LaunchError
from launcher.views.width import fit_table, wrap

if TYPE_CHECKING:
    from launcher.compose.composer import ComposedRun
    from launcher.submit.checks import Verdict

DEFAULTS = Assumptions()

DESCRIPTION = f"""Estimate each composed run on its GPUs without submitting it: memory per GPU (sharded
parameters, gradients and AdamW state, gathered FSDP units, activations, margin) against the GPU's
memory, the largest micro-batch that fits, FLOPs and step time at a stated MFU, FSDP communication
and its time, and scaling efficiency across a sweep's GPU counts. A run that does not fit gets the
changes that would make it fit. GPU memory comes from cluster.gpu_memory_gb, else cluster.gpu_type or
the partition's gres type, else an assumption it states; step time, tokens/s and MFU need the GPU's type
(a dash without it); the local cluster's virtual GPUs are planned as an {DEFAULT_GPU.upper()} stand-in \
({GPUS[DEFAULT_GPU].memory_gib:g} GiB), labelled so.
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
    p.add_argument("--accuracy", action="store_true",
                   help="per cluster, how far each completed run's forecast was from what it measured, before and "
                        "after the correction by the cluster's other runs (cluster=NAME: that cluster's alone)")
    p.add_argument("--root", type=Path, metavar="DIR",
                   help="with --accuracy: the run root to read (default: as launcher runs, $LAUNCHER_RUN_ROOT or every "
                        "root a launch used)")
    p.add_argument("--check", action="store_true",
                   help="exit 2 if a launch of any of the runs would be refused (each is marked either way)")
    p.add_argument("--mfu", type=float, default=DEFAULTS.mfu,
                   help="fraction of the GPU's dense peak (in the run's precision) sustained on the FLOPs executed "
                        "(default %(default)s)")
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
    if args.accuracy:
        return print_accuracy(args.overrides, args.json, args.root)

    from launcher.commands.launch import overrides_of, placed, warn  # lazy: keeps launcher.commands.launch out
    from launcher.compose.composer import compose_runs  # lazy: keeps hydra out of start-up
    from launcher.submit.checks import judge  # lazy: keeps hydra, submitit out of start-up

    store_secrets(secrets_dir())  # a bucket's data is checked with the credentials its tasks will have
    overrides = overrides_of(args)
    if auto_asked(overrides):  # the candidates' lines, then the plan of the run where it starts first
        runs = [placed(overrides, args.multirun, json_out=args.json)]
    else:
        runs = compose_runs(overrides, multirun=args.multirun)
    estimates = [estimate(run.config, run.plan,
                          hardware_for(run.config.cluster, precision_of(run.config), query_slurm=True), opts,
                          overrides=run.overrides) for run in runs]
    for est, run in zip(estimates, runs):
        est.correction = correction_for(run.config, run.plan, est.hardware)
    set_scaling(estimates)
    verdict = judge(runs)  # what a launch of these runs would refuse, or warn of (launcher/submit/checks.py)
    warn(verdict.lines(runs, verdict.warnings))
    refused = 2 if args.check and verdict.refusals else 0
    if args.json:
        for index, (est, run) in enumerate(zip(estimates, runs)):
            print(json.dumps({**est.to_dict(), "data": run.data.to_dict(), "refused": verdict.refusing(index)}))
        return refused
    if len(estimates) > 1:
        print(comparison(estimates))
        print_refusals(verdict, runs)
        if not args.detail:
            return refused
    for index, (est, run) in enumerate(zip(estimates, runs)):
        if index or len(estimates) > 1:
            print()
        print(detail(est))
        print(wrap(run.data.line()))
    if len(estimates) == 1:
        print_refusals(verdict, runs)
    return refused


def print_refusals(verdict: Verdict, runs: List[ComposedRun]) -> None:
    """Below the figures: the checks not made, and each run a launch would refuse, with why (or that none)."""
    lines = [f"not checked: {note}" for note in verdict.unchecked + verdict.unenforced]
    lines += [f"a launch would be refused: {line}" for line in verdict.lines(runs, verdict.refusals)]
    print(wrap("\n".join(["", *lines] if lines else ["", "a launch would pass every check"])))


# ----------------------------------------------------------------------------------------------
# Formatting


def _gib(n: float) -> str:
    return f"{n / GIB:,.2f}"


def _time(seconds: Optional[float]) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


def _tokens(per_s: Optional[float]) -> str:
    return "-" if per_s is None else f"{per_s:,.0f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _fits(est: Estimate) -> str:
    if est.fits:
        return "yes" if est.memory.fits else "yes (auto)"
    return "NO"


COMPARISON_HEADERS = ["model", "gpus", "sharding", "ckpt", "mb x acc", "mem/GPU GiB", "GPU GiB", "fits?",
                      "max mb", "step", "tok/s/GPU", "comm", "scaling eff."]
# On a narrow terminal (launcher/views/width.py): the columns left out, first to last, once the headers wrap.
LEAST_NEEDED = ["comm", "max mb", "ckpt", "sharding", "GPU GiB", "mb x acc", "tok/s/GPU", "scaling eff."]


def comparison(estimates: List[Estimate]) -> str:
    """One row per run, then, for the runs that do not fit, what would."""
    rows = []
    for est in estimates:
        t, p = est.timing, est.plan
        rows.append([p.model, f"{p.gpus} ({p.nodes}x{p.tasks_per_node})", est.cfg.parallel.sharding,
                     est.cfg.parallel.activation_checkpointing, f"{p.micro_batch} x {p.grad_accum}",
                     f"{est.memory.total / GIB:,.1f}", f"{est.hardware.memory_gib:g}", _fits(est),
                     est.max_micro_batch or "-", _time(t.step_s), _tokens(t.tokens_per_s_per_gpu), _time(t.comm_s),
                     _pct(est.scaling_efficiency)])
    lines = [fit_table(rows, COMPARISON_HEADERS, drop=LEAST_NEEDED)]
    lines += [f"  {' '.join(est.overrides) or '(defaults)'}: {line}" for est in estimates for line in _learned(est)]
    notes = _notes(estimates)
    for est in estimates:
        if not est.fits:
            fixes = "; or ".join(map(str, est.suggestions)) or "nothing found up to 4096 GPUs"
            lines.append(f"  {' '.join(est.overrides) or '(defaults)'}: does not fit; to fit: {fixes}")
    return wrap("\n".join(lines + notes))


def _notes(estimates: List[Estimate]) -> List[str]:
    """Below the comparison: each GPU and where its figures came from, once, and the assumptions."""
    first = estimates[0]
    a = first.assumptions
    gpus = sorted({f"{e.hardware.gpu_type} {e.hardware.memory_gib:g} GiB ({e.hardware.memory_source})"
                   for e in estimates})
    speeds = [line for line in dict.fromkeys(_speed_note(e.hardware) for e in estimates) if line]
    return ["", f"GPU: {'; '.join(gpus)}", *speeds,
            f"assumed: MFU {a.mfu:g} on executed FLOPs; NVLink {a.intra_gbps:g} GB/s per GPU; network "
            f"{a.inter_gbps:g} GB/s per node; margin {100 * a.margin:g}% + {a.overhead_gib:g} GiB; "
            "scaling eff. = tok/s/GPU vs the fewest-GPU run with the same other overrides"]


MEMORY_ROWS = [("parameters", "params"), ("gradients", "grads"), ("optimizer (AdamW)", "optimizer"),
               ("gathered params", "gathered"), ("gradient buffers", "grad_buffers"), ("activations", "activations"),
               ("margin", "margin")]

TIME_ROWS = [
    ("model FLOPs / step", "model_flops", lambda x: f"{x:.3e}"),
    ("hardware FLOPs / step", "hardware_flops", lambda x: f"{x:.3e}"),
    ("compute / step", "compute_s", _time),
    ("all-gather / GPU", "allgather_bytes", lambda x: f"{x / 1e9:,.2f} GB"),
    ("reduce-scatter / GPU", "reduce_scatter_bytes", lambda x: f"{x / 1e9:,.2f} GB"),
    ("all-reduce / GPU", "allreduce_bytes", lambda x: f"{x / 1e9:,.2f} GB"),
    ("communication / step", "comm_s", _time),
    ("exposed communication", "exposed_comm_s", _time),
    ("step time", "step_s", _time),
    ("tokens/s/GPU", "tokens_per_s_per_gpu", _tokens),
    ("predicted MFU", "mfu", lambda x: "-" if x is None else f"{100 * x:.1f}%"),
]


def _speed_note(hw: TargetGpu) -> Optional[str]:
    """What a plan's step time, tokens/s and MFU are of: a stand-in's (said so), or none (why, and how to name
    the GPU); None for a GPU of known type."""
    if hw.stand_in:
        return f"step time, tokens/s and MFU: of an {hw.gpu_type} for the virtual GPUs, not this machine's"
    return hw.unforecast


def detail(est: Estimate) -> str:
    """The full estimate of one run: memory, activations by checkpointing level, time and communication,
    each figure beside the formula the planner computed it with (forecast/memory.py, forecast/timing.py)."""
    cfg, plan, m, t, hw = est.cfg, est.plan, est.memory, est.timing, est.hardware
    model = cfg.model
    sharding, level = cfg.parallel.sharding, cfg.parallel.activation_checkpointing
    n = shard_group(plan, sharding)
    per_rank = plan.per_rank_batch
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
        f"GPU: {hw.gpu_type}, {hw.memory_gib:g} GiB ({hw.memory_source}); "
        + (f"peak {est.precision} {hw.peak_flops / 1e12:g} TFLOP/s ({hw.peak_source})" if hw.peak_flops else
           "peak unknown"),
    ]
    memory_rows = [[label, m.formulas[part], _gib(getattr(m, part))] for label, part in MEMORY_ROWS]
    memory_rows[MEMORY_ROWS.index(("activations", "activations"))][0] = f"activations ({level})"
    memory_rows += [
        ["total", "", _gib(m.total)],
        ["GPU memory", hw.memory_source, _gib(m.capacity)],
        ["fits", _fits(est) + f" ({100 * m.total / m.capacity:.0f}% of the GPU)", ""],
        ["largest micro-batch", f"{est.max_micro_batch or 'none'} (dividing {per_rank}); memory allows "
         f"{est.micro_batch_limit} whatever the batch", ""],
    ]
    b = plan.micro_batch
    act_rows = []
    for lvl in CHECKPOINTING:
        c = activation_components(model, b, lvl, est.precision)
        act_rows.append([lvl + (" *" if lvl == level else ""), _gib(c["layers"]), _gib(c["recompute"]),
                         _gib(c["final_norm"]), _gib(c["loss_saved"] + c["loss_transient"]), _gib(sum(c.values()))])
    terms = activation_terms(model, b, level, est.precision)
    act_note = "\n".join(
        [f"{level} * by part, s={model.seq_len} b={b} h={model.d_model} a={model.n_heads} r={model.mlp_ratio} "
         f"V={model.vocab_size}:"]
        + [f"  {name.replace('_', ' '):<16}{term.formula}" for name, term in terms.items()])
    comm_rows = [[label, fmt(getattr(t, part)), t.formulas[part]] for label, part, fmt in TIME_ROWS]
    comm_rows.append(["scaling efficiency", _pct(est.scaling_efficiency), "vs the fewest-GPU run of the sweep"])
    speed = _speed_note(hw)
    parts = ["\n".join(head), fit_table(memory_rows, ["memory per GPU", "formula", "GiB"], {"formula": 24}),
             fit_table(act_rows, [f"activations GiB, micro-batch {b}", "layers", "recompute", "final norm", "loss",
                                  "total"]) + "\n" + act_note,
             fit_table(comm_rows, ["time and communication", "", ""], {2: 24}) + (f"\n{speed}" if speed else "")]
    if not est.fits:
        parts.append("DOES NOT FIT. To fit:\n" + "\n".join(f"  {s}" for s in est.suggestions)
                     if est.suggestions else "DOES NOT FIT, and no change found up to 4096 GPUs.")
    parts += _host(est) + (["\n".join(_learned(est))] if est.correction else [])
    return wrap("\n\n".join(parts), indent="    ")


def _learned(est: Estimate) -> List[str]:
    """What the cluster's similar completed runs measured, correcting the step time and memory (forecast/learned.py);
    nothing without such runs."""
    return est.correction.lines(est.timing.step_s, est.memory.total / GIB) if est.correction else []


def _host(est: Estimate) -> List[str]:
    """On the local cluster, whose ranks all share this machine's memory: what they need of it
    (forecast/host.py, the same check a launch makes)."""
    machine = machine_memory()
    if est.cfg.cluster.name != LOCAL_CLUSTER or not machine:
        return []
    host = host_memory(est.cfg, est.plan, machine)
    if host.fits:
        return [f"this machine: {host.need()}; it has {machine / GIB:.1f} GiB (MemTotal): fits"]
    return [f"this machine: {host.summary()}; a launch is refused; to fit: {to_fit(est.cfg, est.plan, machine)}"]


# ----------------------------------------------------------------------------------------------
# Accuracy: the completed runs' forecasts against what they measured

ACCURACY_HEADERS = ["run", "model", "gpus", "step formula", "step corrected", "step measured", "step error",
                    "corrected error", "mem formula GiB", "mem corrected", "mem measured", "mem error",
                    "mem corrected error"]
ACCURACY_LEAST_NEEDED = ["step formula", "mem formula GiB", "step corrected", "mem corrected", "model", "gpus",
                         "step measured", "mem measured"]
OVER_MEMORY = "that is the one that would have run out of memory on a bigger layout"


def print_accuracy(overrides: List[str], as_json: bool, root: Optional[Path]) -> int:
    """``launcher plan --accuracy``: per cluster, each completed run's forecast error, those that used more memory
    than the formula said first; the runs of ``root``, else of the roots ``launcher runs`` reads."""
    from launcher.views.lookup import roots_for  # lazy: keeps the run index out of start-up

    wanted = [o for o in overrides if not o.startswith("cluster=")]
    if wanted:
        raise LaunchError(f"--accuracy takes only cluster=NAME, not {' '.join(wanted)}: it reads the completed "
                          "runs of every run root, not a composed run")
    cluster = next((o.split("=", 1)[1] for o in overrides), None)
    found = accuracies(roots_for(root), cluster)
    if as_json:
        print(json.dumps({"clusters": [c.to_dict() for c in found]}))
        return 0
    if not found:
        print(wrap(f"no completed run{f' of cluster {cluster}' if cluster else ''} has its forecast beside what it "
                   "measured yet (a run launched by this launcher records it when it completes)"))
    for index, one in enumerate(found):
        print(("\n" if index else "") + _accuracy(one))
    return 0


def _signed(error: Optional[float]) -> str:
    return "-" if error is None else f"{100 * error:+.1f}%"


def _summary(what: str, errors: Optional[Summary]) -> str:
    if errors is None:
        return f"{what}: not measured"
    return (f"{what} error: median {100 * errors.median_before:.1f}%, worst {_signed(errors.worst_before)} (formula); "
            f"median {100 * errors.median_after:.1f}%, worst {_signed(errors.worst_after)} (corrected)")


def _cells(error: Optional[Error], fmt: Callable[[float], str]) -> List[str]:
    if error is None:
        return ["-"] * 5
    return [fmt(error.formula), fmt(error.corrected), fmt(error.measured), _signed(error.before), _signed(error.after)]


def _accuracy(one: ClusterAccuracy) -> str:
    """One cluster's runs: the summary, the runs over their memory forecast named, and the table."""
    gpus = sorted({r.run.forecast.gpu for r in one.runs})
    lines = [f"cluster {one.cluster}: {len(one.runs)} completed run{'s' if len(one.runs) > 1 else ''} on "
             f"{', '.join(gpus)}", _summary("step time", one.step), _summary("memory per GPU", one.memory)]
    if any(r.run.forecast.stand_in for r in one.runs):
        lines.append("its ranks run on CPUs: the measurements are a CPU's step time and resident memory")
    over = [r.run.run for r in one.runs if r.over_memory]
    if over:
        lines.append(f"used more memory than the formula said, listed first ({OVER_MEMORY}): {', '.join(over)}")
    lines.append("error = forecast / measured - 1; corrected: by the similar runs completed before it only")
    rows = [[r.run.run, r.run.forecast.model, r.run.forecast.gpus, *_cells(r.step, seconds),
             *_cells(r.memory, lambda gib: f"{gib:,.2f}")] for r in one.runs]
    return wrap("\n".join(lines)) + "\n" + fit_table(rows, ACCURACY_HEADERS, drop=ACCURACY_LEAST_NEEDED)

