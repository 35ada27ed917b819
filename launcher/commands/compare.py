"""``launcher compare RUN... | --sweep ID``: how model sizes and GPU counts actually compared.

Everything comes from the runs' own ``metrics.jsonl`` and ``plan.json``:
- step time: the median over log intervals, leaving out the first (warm-up, compilation) when there are
  others;
- tokens/s and MFU: the final record's steady-state figures, or the median over intervals so far;
- speedup: tokens/s against the run of the same model with the fewest GPUs; scaling efficiency is the
  speedup divided by the GPU ratio (1.0 is linear scaling);
- time to the same step: the training time each run needed to reach the highest step all runs reached.
Runs still going are compared on their steps so far and marked as such.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import List, Optional

from launcher.commands.common import chosen_runs, duration, root_of
from launcher.errors import LaunchError
from launcher.core.rundir import METRICS, RunRecord, read_jsonl
from launcher.state import job_states


@dataclass
class RunStats:
    name: str
    model: str
    gpus: int
    nodes: int
    status: str
    steps_done: int
    steps_total: int
    median_step_time: Optional[float]
    tokens_per_s: Optional[float]
    tokens_per_s_per_gpu: Optional[float]
    mfu: Optional[float]
    final_loss: Optional[float]
    time_to_common_step: Optional[float] = None
    speedup: Optional[float] = None
    scaling_efficiency: Optional[float] = None
    loss_curve: List[List[float]] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.status == "COMPLETED"


def intervals(records: List[dict]) -> List[tuple[int, int, dict]]:
    """(first step, last step, record) of each log interval, in order."""
    out, prev = [], 0
    for rec in records:
        out.append((prev, rec["step"], rec))
        prev = rec["step"]
    return out


def steady(records: List[dict]) -> List[dict]:
    return records[1:] if len(records) > 1 else records


def stats_of(rec: RunRecord, status: str) -> tuple[RunStats, List[dict]]:
    """The run's figures, and its interval records (for the time to a step)."""
    records = list(read_jsonl(Path(rec.run_dir) / METRICS))
    final = next((r for r in records if r.get("final")), None)
    logged = [r for r in records if not r.get("final") and r.get("step_time")]
    median = lambda key: statistics.median(r[key] for r in steady(logged)) if logged else None  # noqa: E731
    source = final if final else {"tokens_per_s": median("tokens_per_s"),
                                  "tokens_per_s_per_gpu": median("tokens_per_s_per_gpu"),
                                  "mfu": median("mfu") if logged and logged[-1].get("mfu") is not None else None}
    last = final or (logged[-1] if logged else {})
    return RunStats(
        name=rec.name, model=rec.model, gpus=rec.gpus, nodes=rec.nodes, status=status,
        steps_done=last.get("step", 0), steps_total=rec.steps, median_step_time=median("step_time"),
        tokens_per_s=source.get("tokens_per_s"), tokens_per_s_per_gpu=source.get("tokens_per_s_per_gpu"),
        mfu=source.get("mfu"), final_loss=last.get("loss"),
        loss_curve=[[r["step"], r["loss"]] for r in logged if r.get("loss") is not None],
    ), logged


def time_to_step(logged: List[dict], step: int) -> Optional[float]:
    """Training seconds to reach ``step``, from the intervals' mean step times."""
    total = 0.0
    for first, last, rec in intervals(logged):
        if first >= step:
            break
        total += (min(last, step) - first) * rec["step_time"]
    return total if logged and logged[-1]["step"] >= step else None


def compare(records: List[RunRecord]) -> List[RunStats]:
    states = job_states(records)
    pairs = [stats_of(rec, states[rec.name].state) for rec in records]
    common = min((s.steps_done for s, _ in pairs), default=0)
    for s, logged in pairs:
        s.time_to_common_step = time_to_step(logged, common) if common else None
    stats = [s for s, _ in pairs]
    for s in stats:
        same = [o for o in stats if o.model == s.model and o.tokens_per_s]
        base = min(same, key=lambda o: (o.gpus, o.name), default=None)
        if base is not None and s.tokens_per_s:
            s.speedup = s.tokens_per_s / base.tokens_per_s
            s.scaling_efficiency = s.speedup / (s.gpus / base.gpus)
    return sorted(stats, key=lambda s: (s.model, s.gpus, s.name))


HEADERS = ["NAME", "MODEL", "GPUS", "NODES", "STEP TIME", "TOK/S", "TOK/S/GPU", "MFU", "TIME TO STEP",
           "SPEEDUP", "SCALING EFF", "FINAL LOSS", "STATUS"]


def table_rows(stats: List[RunStats]) -> List[list]:
    def num(value: Optional[float], fmt: str) -> str:
        return format(value, fmt) if value is not None else ""

    common = min((s.steps_done for s in stats), default=0)
    return [[
        s.name, s.model, s.gpus, s.nodes, num(s.median_step_time, ".3f") + (" s" if s.median_step_time else ""),
        num(s.tokens_per_s, ",.0f"), num(s.tokens_per_s_per_gpu, ",.0f"),
        num(s.mfu and 100 * s.mfu, ".1f") + ("%" if s.mfu else ""),
        f"{duration(s.time_to_common_step)} @{common}" if s.time_to_common_step is not None else "",
        num(s.speedup, ".2f") + ("x" if s.speedup else ""), num(s.scaling_efficiency and 100 * s.scaling_efficiency,
                                                                 ".0f") + ("%" if s.scaling_efficiency else ""),
        num(s.final_loss, ".4f"),
        s.status if s.finished else f"{s.status} (so far {s.steps_done}/{s.steps_total})",
    ] for s in stats]


def to_csv(stats: List[RunStats]) -> str:
    out = io.StringIO()
    fields = [k for k in asdict(stats[0]) if k != "loss_curve"]
    writer = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for s in stats:
        writer.writerow(asdict(s))
    return out.getvalue()


def plot(stats: List[RunStats], path: Path) -> None:
    """Tokens/s against GPU count per model, with the ideal linear line; and the loss curves."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise LaunchError("--plot needs matplotlib: pip install 'slurm-gpt-launcher[plot]'") from None
    fig, (speed, loss) = plt.subplots(1, 2, figsize=(12, 4.5))
    for model in sorted({s.model for s in stats}):
        runs = sorted((s for s in stats if s.model == model and s.tokens_per_s), key=lambda s: s.gpus)
        if not runs:
            continue
        gpus = [s.gpus for s in runs]
        line, = speed.plot(gpus, [s.tokens_per_s for s in runs], "o-", label=model)
        base = runs[0]
        speed.plot(gpus, [base.tokens_per_s * g / base.gpus for g in gpus], "--", color=line.get_color(),
                   alpha=0.5, label=f"{model} ideal (linear)")
    speed.set(xscale="log", yscale="log", xlabel="GPUs", ylabel="tokens/s", title="Throughput vs GPUs")
    speed.minorticks_off()
    speed.set_xticks(sorted({s.gpus for s in stats}), labels=[str(g) for g in sorted({s.gpus for s in stats})])
    speed.legend(fontsize=8)
    for s in stats:
        if s.loss_curve:
            steps, losses = zip(*s.loss_curve)
            loss.plot(steps, losses, ".-", label=f"{s.name} ({s.gpus} GPUs)")
    loss.set(xlabel="step", ylabel="training loss", title="Loss")
    loss.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="RUN", help="runs to compare (names or unique prefixes)")
    parser.add_argument("--sweep", help="compare every run of this sweep id")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="also draw throughput and loss curves")
    out = parser.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--csv", action="store_true", help="print CSV")


def main(args: argparse.Namespace) -> int:
    records = chosen_runs(root_of(args), args.names, args.sweep)
    stats = compare(records)
    if args.plot:
        plot(stats, args.plot)
    if args.json:
        print(json.dumps([asdict(s) for s in stats], indent=1))
    elif args.csv:
        print(to_csv(stats), end="")
    else:
        from tabulate import tabulate

        print(tabulate(table_rows(stats), headers=HEADERS, disable_numparse=True))
        if args.plot:
            print(f"plot written to {args.plot}")
    return 0
