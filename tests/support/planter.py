"""A second Unix user, ``lplanter``, who plants real symlinks and renames real directories (``runuser``) where
the launcher writes: tests/unit/test_planted_links.py and its cluster test. Needs root; the user is made once per
machine."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

PLANTER = "lplanter"


@pytest.fixture(scope="module")
def planter() -> str:
    """The second user, made once per machine (a session beside this one may make it first)."""
    if os.geteuid() != 0 or not shutil.which("runuser") or not shutil.which("useradd"):
        pytest.skip("needs root, runuser and useradd to act as a second user")
    try:
        pwd.getpwnam(PLANTER)
    except KeyError:
        made = subprocess.run(["useradd", "--user-group", "--no-create-home", "--shell", "/bin/sh", PLANTER],
                              capture_output=True, text=True)
        assert made.returncode in (0, 9), f"useradd {PLANTER}: {made.stderr.strip()}"  # 9: made meanwhile
    return PLANTER


@pytest.fixture
def base(planter, monkeypatch):
    """A directory of root's that every user may traverse (pytest's own are 0700), as /home/alice would be,
    with a launcher home in it; removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="w-links-", dir="/tmp"))
    path.chmod(0o755)
    monkeypatch.setenv("LAUNCHER_HOME", str(path / "home"))
    monkeypatch.delenv("LAUNCHER_RUN_ROOT", raising=False)
    yield path
    shutil.rmtree(path)


def as_planter(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", PLANTER, "--", *cmd], capture_output=True, text=True, timeout=30)


def planted(*cmd: str) -> None:
    done = as_planter(*cmd)
    assert done.returncode == 0, f"{PLANTER} could not {' '.join(cmd)}: {done.stderr.strip()}"


def directory(path: Path, mode: int) -> Path:
    path.mkdir()
    path.chmod(mode)  # past the umask
    return path


def victim_file(base: Path) -> Path:
    """A file of root's that a followed symlink would change."""
    victim = base / "victim.txt"
    victim.write_text("root's own file\n")
    return victim
