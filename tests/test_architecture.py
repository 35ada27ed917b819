"""The boundaries the design promises, checked on the source so they cannot erode unnoticed: train/ depends
on the launcher only through its torch-free contract (launcher/core), and no module grows past what a reader
takes in at once. (That one module speaks to Slurm is checked in test_slurm_units.py.)"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SOURCES = sorted([*REPO.glob("launcher/**/*.py"), *REPO.glob("train/**/*.py")])
MAX_LINES = 300


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(REPO.glob("train/*.py")), ids=lambda p: p.name)
def test_train_imports_only_the_contract_from_the_launcher(path):
    outside = {name for name in imported_modules(path)
               if name.split(".")[0] == "launcher" and not name.startswith("launcher.core")}
    assert not outside, f"{path.name} imports {sorted(outside)}; train/ may import only launcher.core"


def test_contract_never_imports_commands_or_torch():
    for path in REPO.glob("launcher/core/*.py"):
        bad = {n for n in imported_modules(path) if n.split(".")[0] == "torch" or n.startswith("launcher.commands")}
        assert not bad, f"{path.relative_to(REPO)} imports {sorted(bad)}"


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_module_is_longer_than_a_reader_takes_in(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{path.relative_to(REPO)} has {lines} lines (at most {MAX_LINES})"
