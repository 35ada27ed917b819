"""``launcher compare --plot``: throughput against GPU count (with the ideal linear line) and the loss curves.

Drawn to be read without the table beside it: linear axes with labelled ticks, every measured point
labelled with its value, a title naming the sweep and the hardware the runs trained on.
"""
from __future__ import annotations

from pathlib import Path
from typing import List

from launcher.status.scaling import RunStats
from launcher.errors import LaunchError


def plural(count: int, word: str) -> str:
    """``1 GPU``, ``2 GPUs``."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def title(stats: List[RunStats]) -> str:
    """What is compared and on what: the sweep id (or the runs' names) and the hardware."""
    sweeps = {s.sweep for s in stats}
    what = f"Sweep {sweeps.pop()}" if len(sweeps) == 1 and None not in sweeps else \
        f"Runs {', '.join(s.name for s in stats)}"
    return f"{what}\n{'; '.join(sorted({s.hardware for s in stats}))}"


def plot(stats: List[RunStats], path: Path) -> None:
    """Draw the comparison into ``path`` (PNG, or any format matplotlib knows by the suffix)."""
    save(figure(stats), path)


def save(fig, path: Path) -> None:
    """Write ``fig`` to ``path`` (its format from the suffix), and free it; a one-line LaunchError when it cannot be
    written."""
    import matplotlib.pyplot as plt  # lazy: keeps matplotlib, numpy out of start-up

    try:
        fig.savefig(path, dpi=110)
    except OSError as err:
        raise LaunchError(f"--plot {path}: cannot write it ({err.strerror})") from None
    finally:
        plt.close(fig)


def pyplot():
    """matplotlib's pyplot, drawing off screen (no display on a login node); a one-line LaunchError naming the
    extra to install when matplotlib is missing."""
    try:
        import matplotlib  # lazy: keeps matplotlib, numpy out of start-up

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # lazy: keeps matplotlib, numpy out of start-up
    except ImportError:
        raise LaunchError("--plot needs matplotlib: pip install 'slurm-gpt-launcher[plot]'") from None
    return plt


def figure(stats: List[RunStats]):
    """The figure: a title, throughput against GPUs, the loss curves."""
    plt = pyplot()
    from matplotlib.ticker import StrMethodFormatter  # lazy: keeps matplotlib, numpy out of start-up

    fig, (speed, loss) = plt.subplots(1, 2, figsize=(12, 5))
    fig.suptitle(title(stats), fontsize=11)
    throughput_panel(speed, stats)
    speed.yaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    for s in stats:
        if s.loss_curve:
            steps, losses = zip(*s.loss_curve)
            loss.plot(steps, losses, ".-", label=f"{s.name} ({plural(s.gpus, 'GPU')})")
    loss.set(xlabel="step", ylabel="training loss", title="Training loss")
    loss.grid(alpha=0.3)
    loss.legend(fontsize=8)
    fig.tight_layout()
    return fig


def throughput_panel(ax, stats: List[RunStats]) -> None:
    """Tokens/s against GPUs per model, each point labelled, with the line of perfect scaling from the
    run with the fewest GPUs."""
    for model in sorted({s.model for s in stats}):
        runs = sorted((s for s in stats if s.model == model and s.tokens_per_s), key=lambda s: s.gpus)
        if not runs:
            continue
        gpus = [s.gpus for s in runs]
        line, = ax.plot(gpus, [s.tokens_per_s for s in runs], "o-", label=f"{model}: measured")
        for s in runs:
            ax.annotate(f"{s.tokens_per_s:,.0f}", (s.gpus, s.tokens_per_s), textcoords="offset points",
                        xytext=(0, 7), ha="center", fontsize=8, color=line.get_color())
        base = runs[0]
        ax.plot(gpus, [base.tokens_per_s * g / base.gpus for g in gpus], "--", color=line.get_color(), alpha=0.5,
                label=f"{model}: ideal (linear from {plural(base.gpus, 'GPU')})")
    counts = sorted({s.gpus for s in stats})
    ax.set_xticks(counts, labels=[str(g) for g in counts])
    ax.set_xlim(0, max(counts, default=1) * 1.1)
    ax.set_ylim(bottom=0)
    ax.set(xlabel="GPUs", ylabel="tokens/s (at the median step time)", title="Throughput vs GPUs")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
