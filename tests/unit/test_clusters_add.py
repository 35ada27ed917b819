"""What ``clusters add`` writes for the tasks' Python (launcher/commands/clusters.py tasks_python): a file the first
launch trains on. Asking Slurm for the rest: tests/cluster/test_clusters_add.py."""
from __future__ import annotations

import sys

import pytest

from launcher.commands.clusters import tasks_python
from launcher.errors import LaunchError


def test_the_tasks_python_is_the_one_given_or_this_one_with_torch():
    notes = []
    assert tasks_python(None, notes) == sys.executable  # the suite's Python has torch
    assert notes == [f"the tasks run this Python, {sys.executable} (it has torch); --python names another"]
    notes.clear()
    assert tasks_python(sys.executable, notes) == sys.executable and notes == []
    assert tasks_python("/nodes/only/bin/python", notes) == "/nodes/only/bin/python"
    assert notes == ["--python /nodes/only/bin/python does not exist on this host: it must on the cluster's nodes"]


def test_a_python_without_torch_is_refused_in_one_line(tmp_path):
    bare = tmp_path / "python"
    bare.write_text("#!/bin/sh\nexec /usr/bin/python3 -S \"$@\"\n")  # no site-packages: none of the tasks' modules
    bare.chmod(0o755)
    with pytest.raises(LaunchError, match=rf"^--python {bare} lacks torch, submitit, omegaconf, yaml, numpy: name an "
                                          r"interpreter with 'slurm-gpt-launcher\[train\]'$"):
        tasks_python(str(bare), [])


def test_without_torch_here_a_note_says_the_tasks_need_one(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    notes = []
    assert tasks_python(None, notes) is None
    assert notes[0].startswith(f"the tasks need a Python with torch, which {sys.executable} lacks: add python: PATH")
