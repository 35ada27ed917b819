"""``launcher -m search=optuna ...``: check the whole space, make the study, submit the first trials, return.

A run is composed at every corner of the space (so every value is checked as a single run's would be, and the
search's settings once with them), and each corner passes the launch's checks (its GPUs' memory, the cluster's
partition, the run root) before the study's directory exists. A refused launch leaves nothing behind. What to
print is the command's (launcher/commands/launch.py).
"""
from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Tuple

from launcher.compose.runfile import hydra_value, key_of
from launcher.core.config import SearchConfig
from launcher.errors import LaunchError
from launcher.search.space import Space, checked_point, read_space
from launcher.search.study import Search, create
from launcher.search.submission import submit_trial
from launcher.search.trials import start
from launcher.slurm.client import slurm_conf_for
from launcher.submit.checks import Verdict, judge

if TYPE_CHECKING:
    from launcher.compose.composer import ComposedRun


@dataclass(frozen=True)
class Checked:
    """A search launch checked: its space, settings, the runs at the space's corners and what the launch's checks
    found about them (launcher/submit/checks.py)."""

    space: Space
    settings: SearchConfig
    corners: List["ComposedRun"]
    verdict: Verdict


@dataclass(frozen=True)
class Started:
    """A search begun: its id, its study's directory and the trials submitted."""

    search_id: str
    path: Path
    submitted: List[int]


def check_search(overrides: List[str], multirun: bool) -> Checked:
    """Read the space and compose and check the run at each corner; LaunchError for any refusal."""
    if not multirun:
        raise LaunchError("search=optuna launches a sweep of trials; add -m (--multirun)")
    space = read_space(overrides)
    points = space.corners()
    settings = compose_corner(space, points[0], with_settings=True).config.search
    points += [checked_point(space, point) for point in settings.enqueue]
    corners = [compose_corner(space, point) for point in points]  # as the trials compose: without the settings
    if settings.metric == "eval_loss" and any(run.config.train.eval_every == 0 for run in corners):
        raise LaunchError("search.metric=eval_loss needs an evaluation; train.eval_every=0 records none "
                          "(set train.eval_every=N, or search.metric=loss)")
    if any(run.config.cluster.ssh for run in corners):
        raise LaunchError("a search on a cluster reached over SSH is not supported yet; launch it on the cluster")
    return Checked(space, settings, corners, judge(corners))


def compose_corner(space: Space, point: Dict[str, Any], with_settings: bool = False) -> "ComposedRun":
    """The run at one corner of the space (``with_settings``: the search's settings too, checked as any run's
    values); a refusal names the corner when the space has more than one parameter (one parameter's value is
    named by the message itself)."""
    from launcher.compose.composer import compose_runs  # lazy: keeps hydra out of start-up

    try:
        return compose_runs([*(space.settings if with_settings else ()), *space.trial(point)])[0]
    except LaunchError as err:
        if len(point) == 1:
            raise
        where = " ".join(param.line(point[param.key]) for param in space.params)
        raise LaunchError(f"at the corner [{where}] of the search space: {err.message}") from None


def pinned(space: Space, corners: List["ComposedRun"], root: Path) -> Tuple[Space, Dict[str, str]]:
    """What a trial composed in a job's last step could resolve otherwise than the launch did, fixed as the launch
    resolved it: a relative ``data.path`` (against the job's directory there) as an absolute override, as a run's
    run.yaml records it; the run root and the slurm.conf (from the environment, or the frozen code's .slurm/
    there) as the environment the trial is composed in, so that its run.yaml stays a plain run's."""
    environment = {"LAUNCHER_RUN_ROOT": str(root)}
    confs = {slurm_conf_for(run.config.cluster.name, run.config.cluster.slurm_conf) for run in corners}
    if len(confs) == 1 and None not in confs:
        environment["SLURM_CONF"] = str(confs.pop())
    paths = {run.config.data.path for run in corners}
    if len(paths) == 1 and None not in paths:
        kept = (line for line in space.fixed if key_of(line) != "data.path")
        space = replace(space, fixed=(*kept, f"data.path={hydra_value(paths.pop())}"))
    return space, environment


def start_search(checked: Checked) -> Started:
    """Make the study in the corners' run root and submit the first trials; nothing is left of the study when
    the first cannot be submitted."""
    from launcher.submit.submitter import check_runs, new_sweep_id  # lazy: keeps hydra, submitit out of start-up

    roots, _ = check_runs(checked.corners)
    if len(set(roots)) > 1:
        raise LaunchError(f"a search keeps its trials in one run root; its corners go to {', '.join(map(str, roots))}")
    space, environment = pinned(checked.space, checked.corners, roots[0])
    search = Search(new_sweep_id(), str(roots[0]), space, checked.settings, time.time(), environment)
    path = create(search)
    try:
        submitted = start(path, submit_trial)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        try:
            path.parent.rmdir()  # .sweeps, when this was its only search
        except OSError:
            pass
        raise
    return Started(search.id, path, submitted)
