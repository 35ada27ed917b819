"""``launcher compare --sweep ID --plot FILE.png`` of a search: each trial's value against each parameter.

One panel per parameter, so that how the metric moves with each setting is read at a glance: a log x-axis for a
parameter drawn on a log scale, a choice's values in their order, the metric and the parameter's key on the axes,
the best trial marked. A trial without a value (failed, still running, pruned before it reported one) cannot be
placed and is left out; the command says which (:attr:`Plotted.left_out`). A pruned trial's value is the last it
reported before it was stopped early, drawn hollow: it is not its metric at the end.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, List

from launcher.views.scaling_plot import pyplot, save
from launcher.views.search_summary import metric_text, short

if TYPE_CHECKING:
    from launcher.search.space import Param
    from launcher.search.view import SearchView, TrialView


@dataclass(frozen=True)
class Plotted:
    """The trials drawn (those with a value) and those left out."""

    shown: List["TrialView"]
    left_out: List["TrialView"]

    def note(self, metric: str) -> str:
        """What the plot leaves out, in a line ("" when it shows every trial)."""
        if not self.left_out:
            return ""
        which = ", ".join(f"trial {t.number} ({t.state})" for t in self.left_out)
        return f"left out of the plot, without {metric}: {which}"


def plotted(search: "SearchView") -> Plotted:
    def placed(trial: "TrialView") -> bool:
        return trial.value is not None and math.isfinite(trial.value)

    return Plotted([t for t in search.trials if placed(t)], [t for t in search.trials if not placed(t)])


def plot(search: "SearchView", path: Path) -> Plotted:
    """Draw the search into ``path``; what was drawn and left out."""
    drawn = plotted(search)
    save(figure(search, drawn), path)
    return drawn


def figure(search: "SearchView", drawn: Plotted):
    """The figure: a title naming the search and the metric, then a panel per parameter (at most 3 a row)."""
    plt = pyplot()
    params = search.search.space.params
    columns = min(3, len(params))
    rows = math.ceil(len(params) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(5.5 * columns, 4.5 * rows), squeeze=False)
    settings = search.search.settings
    fig.suptitle(f"Search {search.search.id}: {settings.metric} ({settings.direction}) of {len(drawn.shown)} of "
                 f"{len(search.trials)} trials, against each parameter", fontsize=11)
    for ax, param in zip(axes.flat, params):
        panel(ax, param, search, drawn.shown)
    for ax in list(axes.flat)[len(params):]:
        fig.delaxes(ax)
    fig.tight_layout()
    return fig


def panel(ax, param: "Param", search: "SearchView", shown: List["TrialView"]) -> None:
    """The value of every shown trial against one parameter, each labelled with its number: the completed ones
    filled, the pruned ones hollow, the best one a star; the x-axis spans the parameter's whole range."""
    metric = search.metric

    def x(trial: "TrialView") -> Any:
        value = trial.params.get(param.key)
        return list(param.choices).index(value) if param.kind == "choice" else value

    shown = [t for t in shown if param.key in t.params]
    complete = [t for t in shown if t.state == "COMPLETE"]
    early = [t for t in shown if t.state != "COMPLETE"]
    if complete:
        ax.scatter([x(t) for t in complete], [t.value for t in complete], color="tab:blue", label="completed")
    if early:
        ax.scatter([x(t) for t in early], [t.value for t in early], facecolors="none", edgecolors="tab:gray",
                   label=f"pruned (its last reported {metric})")
    best = search.best()
    if best is not None and param.key in best.params:
        ax.scatter([x(best)], [best.value], marker="*", s=220, color="tab:red", zorder=3,
                   label=f"best: trial {best.number}, {metric} {metric_text(best.value)}")
    for trial in shown:
        ax.annotate(f"trial {trial.number}", (x(trial), trial.value), textcoords="offset points", xytext=(0, 8),
                    ha="center", fontsize=7, color="tab:red" if trial is best else "tab:gray")
    if param.kind == "choice":
        ax.set_xticks(range(len(param.choices)), labels=[short(c) for c in param.choices])
        ax.set_xlim(-0.5, len(param.choices) - 0.5)
    else:  # the whole space searched, so where the trials fell in it shows
        if param.log:
            ax.set_xscale("log")
            ax.set_xlim(param.low / 1.25, param.high * 1.25)
        else:
            pad = 0.05 * (param.high - param.low)
            ax.set_xlim(param.low - pad, param.high + pad)
    ax.margins(y=0.15)  # room for the labels above the highest point
    ax.set(xlabel=param.key + (" (log scale)" if param.log else ""), ylabel=metric, title=f"{metric} vs {param.key}")
    ax.grid(alpha=0.3)
    if shown:
        ax.legend(fontsize=8)
