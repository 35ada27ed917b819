"""The frozen code copy (launcher/submit/freeze.py) and the git state it records (launcher/submit/git.py), without Slurm:
what is copied, what is recorded, and that a job's Python imports the copy, not the checkout it came from."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.helpers import git
from launcher.core.rundir import SOURCE_ROOT as REPO
from launcher.submit.freeze import dirty_note, freeze, source_state
from launcher.submit.git import tree_state
from launcher.slurm.batch import frozen_code_line

PATHS = ("launcher", "conf")


@pytest.fixture
def checkout(tmp_path) -> Path:
    """A small checkout with the three frozen directories, committed, plus files the copy must leave out."""
    root = tmp_path / "repo"
    for name, text in {"launcher/__init__.py": "", "launcher/core/x.py": "X = 1\n", "launcher/train/t.py": "T = 1\n",
                       "conf/config.yaml": "a: 1\n", "README.md": "readme\n"}.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    (root / ".gitignore").write_text("__pycache__/\n*.bin\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    (root / "launcher/__pycache__").mkdir()
    (root / "launcher/__pycache__/x.cpython-311.pyc").write_bytes(b"\0")
    (root / "launcher/train/tokens.bin").write_bytes(b"\0" * 100)
    return root


def test_a_clean_checkout_records_its_commit(checkout, tmp_path):
    record = freeze(tmp_path / "run", root=checkout)
    head = git(checkout, "rev-parse", "HEAD").strip()
    assert (record["commit"], record["dirty"], record["changed"]) == (head, False, [])
    code = tmp_path / "run" / "code"
    assert sorted(str(p.relative_to(code)) for p in code.rglob("*") if p.is_file()) == [
        "conf/config.yaml", "launcher/__init__.py", "launcher/core/x.py", "launcher/train/t.py", "source.json"]
    assert json.loads((code / "source.json").read_text()) == record and record["source"] == str(checkout)
    assert not (code / "diff.patch").exists() and dirty_note(tree_state(checkout, PATHS)) is None


def test_a_dirty_checkout_records_the_diff_and_says_so_in_one_line(checkout, tmp_path):
    (checkout / "launcher/train/t.py").write_text("T = 2\n")
    (checkout / "launcher/new.py").write_text("N = 1\n")
    (checkout / "README.md").write_text("outside the copy: not part of the state\n")
    state = tree_state(checkout, PATHS)
    assert (state.dirty, sorted(state.changed)) == (True, ["launcher/new.py", "launcher/train/t.py"])
    record = freeze(tmp_path / "run", root=checkout)
    assert record["dirty"] is True and (tmp_path / "run/code/launcher/new.py").read_text() == "N = 1\n"
    diff = (tmp_path / "run/code/diff.patch").read_text()
    assert "-T = 1\n+T = 2\n" in diff and "README" not in diff
    note = dirty_note(state)
    assert "\n" not in note and state.commit[:12] in note and "launcher/train/t.py" in note


def test_outside_git_there_is_no_commit(tmp_path):
    (tmp_path / "launcher").mkdir()
    state = tree_state(tmp_path, PATHS)
    assert (state.commit, state.dirty, dirty_note(state)) == (None, None, None)


def test_the_projects_copy_is_small_and_the_jobs_python_imports_it(tmp_path):
    record = freeze(tmp_path / "run")
    assert record["commit"] == source_state().commit and record["bytes"] < 2e6
    assert (tmp_path / "run/code/launcher/job/entry.py").read_bytes() == (REPO / "launcher/job/entry.py").read_bytes()
    # As the batch script runs it: from the checkout, whose directory (and PYTHONPATH) would come first.
    shell = f"{frozen_code_line(tmp_path / 'run')}; {sys.executable} -c 'import launcher.job.entry as e; print(e.__file__)'"
    out = subprocess.run(["bash", "-c", shell], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(tmp_path / "run/code/launcher/job/entry.py")
