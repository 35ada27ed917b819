"""How a search is shown: its parameters' values short enough for a table column, the best trial so far, how
far the study has gone, and ``describe``'s summary of the whole study. The study itself is read in
launcher/search/view.py; ``runs --sweep``, ``describe`` and ``compare`` print from here, so they say the same
thing the same way.

Optuna and the search's modules are imported only when a search is shown: whether a sweep is a search is asked of
its directory (launcher/core/rundir.py), so a grid sweep's listing or a plain run's never loads them.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence

from launcher.core.rundir import search_ids, search_path
from launcher.errors import LaunchError
from launcher.core.run_index import unique_prefix
from launcher.views.width import fit_table, wrap

if TYPE_CHECKING:
    from launcher.search.space import Param
    from launcher.search.view import SearchView


def search_of(roots: Sequence[Path], sweep_id: Optional[str]) -> Optional["SearchView"]:
    """The search whose sweep id is ``sweep_id``, read now; None for a grid sweep (or no sweep)."""
    path = search_path(roots, sweep_id) if sweep_id else None
    if path is None:
        return None
    from launcher.search.view import view  # lazy: keeps omegaconf out of start-up

    return view(path)


def trials_text(numbers: Sequence[int]) -> str:
    """``trial 4``, ``trials 4, 5, 6``."""
    return f"trial{'s' if len(numbers) > 1 else ''} {', '.join(map(str, numbers))}"


def named_search(roots: Sequence[Path], text: str) -> Optional[Path]:
    """The directory of the search whose sweep id is ``text`` or the only one starting with it; None when none
    does, a one-line LaunchError naming the candidates when several do."""
    ids = [sweep for root in roots for sweep in search_ids(root)]
    if not any(sweep.startswith(text) for sweep in ids):
        return None
    try:
        return search_path(roots, unique_prefix(text, ids, "search", roots[0]))
    except LookupError as err:
        raise LaunchError(str(err)) from None


def short(value: Any, log: bool = False) -> str:
    """A parameter's value, short and readable: ``3.2e-04``, ``1e-04``, ``0.25``, ``50``, ``gpt_small``; a float of
    a parameter drawn on a log scale (``log``) always with its exponent, so its column reads as orders of
    magnitude (``2.2e-02`` beside ``8.9e-03``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) or value == 0 or not math.isfinite(value):
        return str(value)
    if 1e-2 <= abs(value) < 1e4 and not log:
        return f"{value:.3g}"
    mantissa, exponent = f"{value:.1e}".split("e")
    return f"{mantissa.removesuffix('.0')}e{exponent}"


def metric_text(value: Optional[float]) -> str:
    """A trial's value as the run listing writes a loss (``2.6449``); ``1.2e-05`` far from 1; "" for none."""
    if value is None:
        return ""
    return f"{value:.4f}" if value == 0 or 1e-3 <= abs(value) < 1e5 else f"{value:.4g}"


def param_names(keys: Iterable[str]) -> Dict[str, str]:
    """Each parameter's column name: the last part of its key (``lr`` for ``train.lr``), longer where two
    parameters would share it (``train.lr``, ``optim.lr``)."""
    keys = list(keys)
    names = {}
    for key in keys:
        parts = key.split(".")
        for length in range(1, len(parts) + 1):
            name = ".".join(parts[-length:])
            if sum(other == name or other.endswith("." + name) for other in keys) == 1:
                break
        names[key] = name
    return names


def params_text(search: "SearchView", params: Dict[str, Any]) -> str:
    """A trial's parameters in one phrase: ``lr 3.2e-04 warmup_steps 50``."""
    names = param_names(p.key for p in search.search.space.params)
    return " ".join(f"{names[p.key]} {short(params[p.key], p.log)}" for p in search.search.space.params
                    if p.key in params)


def best_line(search: "SearchView") -> str:
    """The best trial so far (the best, once the search has ended): its number, run, value and parameters."""
    best = search.best()
    label = "Best" if search.ended else "Best so far"
    if best is None:
        return f"{label}: none{'' if search.ended else ' yet'}; no trial has completed with its {search.metric}"
    return (f"{label}: trial {best.number} ({best.run}), {search.metric} {metric_text(best.value)} at "
            f"{params_text(search, best.params)}")


def progress_line(search: "SearchView") -> str:
    """How far the study has gone: trials ended of all, how many failed (or were pruned), running (and enqueued,
    waiting to be asked for), and why the search ended if it did."""
    counts = search.counts()
    settings = search.search.settings
    ended = [f"{counts['FAIL']} failed ({settings.failures_allowed()} allowed)"]
    if counts["PRUNED"]:
        ended.append(f"{counts['PRUNED']} pruned")
    going = f"{counts['RUNNING']} running" + (f", {counts['WAITING']} waiting" if counts["WAITING"] else "")
    return (f"{search.ended_count()} of {settings.trials} trials ended, {', '.join(ended)}; {going}"
            + (f"; ended: {search.ended}" if search.ended else ""))


def param_line(param: "Param") -> str:
    """What one parameter draws from: ``train.lr  float in [0.0001, 0.03], log scale``."""
    if param.kind == "choice":
        return f"{param.key}  one of {', '.join(short(c) for c in param.choices)}"
    step = f" step {short(param.step)}" if param.step else ""
    return (f"{param.key}  {param.kind} in [{short(param.low, param.log)}, {short(param.high, param.log)}]{step}"
            + (", log scale" if param.log else ""))


TRIAL_HEADERS = ["TRIAL", "RUN", "STATE", "VALUE", "PARAMS", "CAUSE"]
TRIAL_WRAPPED = {"RUN": 12, "PARAMS": 16, "CAUSE": 16}  # by words, down to these widths, on a narrow terminal


def trial_rows(search: "SearchView") -> List[list]:
    """Each trial one row: number, run (none for a trial sbatch refused), state, value, parameters, cause."""
    return [[t.number, t.run or "(not submitted)", t.state, metric_text(t.value), params_text(search, t.params),
             t.cause] for t in search.trials]


def describe_lines(search: "SearchView") -> List[str]:
    """``describe SWEEP_ID`` of a search: its space, settings, counts by state, best trial, end, and its trials,
    each line within the terminal's width."""
    settings = search.search.settings
    counts = search.counts()
    return wrap("\n".join([
        f"Search {search.search.id}: {settings.trials} trials, {settings.parallel} in parallel, toward the "
        f"{'highest' if settings.direction == 'maximize' else 'lowest'} {settings.metric} ({settings.direction}); "
        f"more than {settings.failures_allowed()} failed trials (search.max_failures) end it",
        "",
        "Space:",
        *(f"  {param_line(p)}" for p in search.search.space.params),
        *(["Shared: " + " ".join(search.search.space.fixed)] if search.search.space.fixed else []),
        "",
        "Trials: " + ", ".join(f"{state} {count}" for state, count in counts.items()),
        f"Progress: {progress_line(search)}",
        best_line(search),
        "",
        fit_table(trial_rows(search), TRIAL_HEADERS, TRIAL_WRAPPED) if search.trials else "No trial asked for yet.",
    ])).split("\n")
