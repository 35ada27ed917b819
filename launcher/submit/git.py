"""The one module of launcher/ that runs git: which commit the code a run freezes comes from, and how the
working tree differs from it.

A clean tree costs one call (``git status --porcelain=v2 --branch`` names the commit and the changed files);
a dirty one a second (the diff). A directory that is not a git checkout, or a machine without git, gives no
commit: the frozen copy alone then records the code (launcher/submit/freeze.py).
"""
from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Sequence

TIMEOUT_S = 30


@dataclass(frozen=True)
class TreeState:
    """A checkout's state under some paths: its commit (None outside git), the files changed or untracked
    there, and ``git diff HEAD`` of them (untracked files are in the frozen copy, not in the diff)."""

    commit: Optional[str] = None
    changed: List[str] = field(default_factory=list)
    diff: str = ""

    @property
    def dirty(self) -> Optional[bool]:
        return None if self.commit is None else bool(self.changed)


def tree_state(root: Path, paths: Sequence[str]) -> TreeState:
    """The state of the checkout at ``root`` under ``paths`` (relative to it)."""
    if not (root / ".git").exists():  # an installed copy inside some other checkout is not one
        return TreeState()
    status = _git(root, "status", "--porcelain=v2", "--branch", "--untracked-files=all", "--", *paths)
    if status is None:
        return TreeState()
    commit, changed = None, []
    for line in status.splitlines():
        if line.startswith("# branch.oid "):
            commit = line.split()[2] if line.split()[2] != "(initial)" else None
        elif line.startswith("? "):
            changed.append(line[2:])
        elif line[:2] in ("1 ", "2 ", "u "):  # ordinary, renamed (path TAB original), unmerged
            fields = {"1": 8, "2": 9, "u": 10}[line[0]]
            changed.append(line.split(" ", fields)[fields].split("\t")[0])
    if commit is None:
        return TreeState()
    diff = (_git(root, "diff", "HEAD", "--", *paths) or "") if changed else ""
    return TreeState(commit, changed, diff)


def _git(root: Path, *args: str) -> Optional[str]:
    """git's stdout, or None when git is missing, fails or does not answer."""
    try:
        proc = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout if proc.returncode == 0 else None
