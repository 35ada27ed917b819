"""Freeze the code a run's tasks import: a copy in the run directory, taken at submit, that its jobs run.

A job reads its code when its tasks start. From the shared checkout, a queued job would run whatever the
checkout holds by then, and a job requeued next week next week's code. So at submit the launcher copies
``launcher/`` (with ``launcher/train/``) and ``conf/`` (their .py and .yaml files only: a few hundred KB) into
``RUN/code/``,
and the batch script puts that copy first on the tasks' PYTHONPATH (launcher/slurm/batch.py): the tasks, the
pickled task object (``launcher.job.entry.TrainTask``, pickled by name) and the recovery steps around them all
import from it. Requeues, automatic retries and ``launcher resume`` submit the run again with the same copy.
The training code has no other entry point a config could name (model and loop are launcher/train/'s own), so
these directories are all the code a run imports beside installed packages (an installed launcher has its conf/
inside: launcher/conf).

``RUN/code/source.json`` records where the copy came from: the checkout, its git commit, and whether the
tree was dirty under the copied directories (changed or untracked files); a dirty tree's ``git diff HEAD``
is kept in ``RUN/code/diff.patch`` (launcher/submit/git.py runs git).
"""
from __future__ import annotations

import functools
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Dict

from launcher.core.rundir import CODE_DIFF, CODE_SOURCE, FROZEN, SOURCE_ROOT, code_dir, frozen_files, write_json_atomic
from launcher.submit.git import TreeState, tree_state


def source_state(root: Path = SOURCE_ROOT) -> TreeState:
    """The checkout's git state, asked once per launch however many runs a sweep submits."""
    if root in _GIVEN:
        return _GIVEN[root][0]
    for thread in _ASKING.pop(root, []):  # asked already in a thread (prefetch_source_state)
        thread.join()
    return _source_state(root)


_GIVEN: Dict[Path, tuple] = {}


def adopt_source(state: TreeState, source: str, root: Path = SOURCE_ROOT) -> None:
    """Freeze ``root``'s code as coming from ``source`` in git state ``state``: a launch shipped from another
    machine (launcher/remote/agent.py) runs that machine's code, unpacked here without its git history."""
    _GIVEN[root] = (state, source)


@functools.lru_cache(maxsize=None)
def _source_state(root: Path) -> TreeState:
    return tree_state(root, FROZEN)


_ASKING: Dict[Path, list] = {}


def prefetch_source_state(root: Path = SOURCE_ROOT) -> None:
    """Start asking git in a thread, so that it answers while Hydra composes a launch."""
    thread = threading.Thread(target=_source_state, args=(root,), daemon=True)
    _ASKING.setdefault(root, []).append(thread)
    thread.start()


def freeze(run_dir: Path, root: Path = SOURCE_ROOT) -> Dict[str, Any]:
    """Copy the code into ``run_dir``'s code directory and record its source; returns that record."""
    dest, sizes = code_dir(run_dir), []
    # Contents only, never modes: the copy is as private as the rest of the run directory (the launcher's
    # umask), and copy2's metadata calls took 2/3 of the time. (shutil.copytree copies directories' modes.)
    made = set()
    for path in frozen_files(root):
        target = dest / path.relative_to(root)
        if target.parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            made.add(target.parent)
        shutil.copyfile(path, target)
        sizes.append(os.path.getsize(target))
    state = source_state(root)
    source = _GIVEN[root][1] if root in _GIVEN else str(root)
    record = {"source": source, "commit": state.commit, "dirty": state.dirty, "changed": state.changed,
              "files": len(sizes), "bytes": sum(sizes), "frozen_at": time.time()}
    if state.diff:
        (dest / CODE_DIFF).write_text(state.diff)
    write_json_atomic(dest / CODE_SOURCE, record)
    return record


def dirty_note(state: TreeState) -> str | None:
    """The one line a launch from a dirty tree prints, or None for a clean (or unknown) one."""
    if not state.dirty:
        return None
    shown = ", ".join(state.changed[:3]) + (f" and {len(state.changed) - 3} more" if len(state.changed) > 3 else "")
    return (f"note: the code has uncommitted changes since {state.commit[:12]} ({shown}); each run keeps them "
            f"in RUN/{code_dir(Path()).name}/{CODE_DIFF}")

