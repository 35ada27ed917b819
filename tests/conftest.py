"""What every test stands on, in both tiers (docs/development.md): tests/unit, the quick tier, never reaches a
cluster; tests/cluster, marked ``slurm``, runs on the local Slurm clusters (its fixtures: tests/cluster/conftest.py).

Here: the suite's own home directories (no test reads or writes the developer's ``~/.launcher`` or
``~/.config/launcher``), the ``slurm`` mark taken from the fixtures a test uses, the stub Slurm tools a quick test
meets, a tmpfs, and how pytest-xdist hands the tests to its workers."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytest_plugins = ["support.planter", "support.s3"]

# pyarrow's bundled jemalloc runs a background purging thread in every process that imports it (a worker, once a
# test imports launcher.dataset). In the suite's long-lived workers that thread was measured at 3 to 9 % of a core
# each, for the whole session, more than some workers' own main thread (process accounting, docs/development.md):
# off for the suite and what it starts. Purging still happens, on the allocating thread.
os.environ.setdefault("JE_ARROW_MALLOC_CONF", "background_thread:false")

# pytest caches each test module with its asserts rewritten, in __pycache__ (ignored by git), unless Python may not
# write bytecode: where PYTHONDONTWRITEBYTECODE is set (CI's image sets it), every worker of every run rewrote every
# test module again (collecting the quick tier took 6.7 CPU-s a worker, 4.4 with the cache). The suite's own
# processes write it; what they start keeps the caller's setting.
sys.dont_write_bytecode = False

# The fixtures that are, or stand on, a running cluster: a test that uses one is marked ``slurm``
# (pytest_itemcollected), so that ``pytest -m "not slurm"`` runs the quick tier. A test that starts a cluster of
# its own with slurm/up.sh, or that takes minutes by nature (a benchmark's quick mode), carries the mark itself.
CLUSTER_FIXTURES = {"slurm", "own_cluster", "time_limited", "remote_site"}
TIERS = {"unit": False, "cluster": True}  # tests/<tier>/: whether its tests carry the mark

# Where the suite keeps what a user keeps in their home: the launcher's home (secrets, SSH masters, remembered
# runs), the user's config layer, the caches and the default run root. Set before any test, and inherited by
# every process a test starts (xdist's workers, the launcher, the jobs); a test may point them elsewhere.
HOME_VARIABLES = {"LAUNCHER_HOME": "launcher-home", "XDG_CONFIG_HOME": "config", "XDG_CACHE_HOME": "cache",
                  "LAUNCHER_RUN_ROOT": "runs"}
SUITE_HOME = "LAUNCHER_SUITE_HOME"

# The width the commands fit their output to (launcher/views/width.py): wider than any line they print, whatever the
# developer's terminal, so that a test reads whole lines and whole tables; tests/unit/test_output_width.py sets
# narrow ones of its own. Inherited by every process a test starts; pytest's own report keeps the width it had.
REPORT_WIDTH = shutil.get_terminal_size().columns
os.environ["COLUMNS"] = "1000"


def pytest_sessionstart(session):
    if session.config.pluginmanager.get_plugin("terminalreporter") is not None:  # xdist's workers report nothing
        session.config.get_terminal_writer().fullwidth = REPORT_WIDTH


def pytest_configure(config):
    if SUITE_HOME not in os.environ:  # the first process of the session (xdist's workers inherit it)
        home = Path(tempfile.mkdtemp(prefix="launcher-suite-"))
        os.environ[SUITE_HOME] = str(home)
        for variable, folder in HOME_VARIABLES.items():
            os.environ[variable] = str(home / folder)
        config.stash[_OWN_HOME] = home
        if getattr(config.option, "dist", "no") != "no":
            os.environ[GROUPS_FILE] = str(home / "xdist-groups.json")


_OWN_HOME = pytest.StashKey[Path]()


def pytest_unconfigure(config):
    home = config.stash.get(_OWN_HOME, None)
    if home is not None:
        shutil.rmtree(home, ignore_errors=True)
        os.environ.pop(SUITE_HOME, None)


def tier_of(item) -> str | None:
    parts = Path(str(item.path)).parts
    return next((part for part in reversed(parts[:-1]) if part in TIERS), None)


def pytest_itemcollected(item):
    """The mark as the item is collected, before ``-m`` selects."""
    if CLUSTER_FIXTURES & set(getattr(item, "fixturenames", ())):
        item.add_marker(pytest.mark.slurm)


def pytest_collection_modifyitems(config, items):
    """Each test is in the folder of its tier: a test in tests/unit that needs a cluster, or one in tests/cluster
    that does not, is an error of the suite's layout, not a test to run in the wrong tier."""
    misplaced = [item.nodeid for item in items if tier_of(item) is not None
                 and (item.get_closest_marker("slurm") is not None) != TIERS[tier_of(item)]]
    if misplaced:
        raise pytest.UsageError("tests in the wrong tier's folder (tests/unit: no cluster; tests/cluster: marked "
                                f"slurm): {', '.join(misplaced)}")
    if under_xdist(config):
        hand_out(config, items)


# ---- handing the tests to pytest-xdist's workers ------------------------------------------------------------
# A group is a unit of work: its tests run in one worker, in order. The groups are the tests that share state that
# is not per worker: an ``xdist_group`` mark (a module whose module-scoped fixture is costly or fixed, a shared
# fixed port), or a fixture below. Every other test is a unit of its own, so that slow ones spread out.
SHARED_FIXTURES = ("remote_site", "tmpfs")  # a fixed sshd port; mounts as root (their tests stay together)


def xdist_group(item) -> str | None:
    for mark in item.iter_markers("xdist_group"):
        return str(mark.args[0] if mark.args else mark.kwargs["name"])
    return next((name for name in SHARED_FIXTURES if name in getattr(item, "fixturenames", ())), None)


def order(item) -> int:
    """The order units are handed out in (each worker holds two at a time): the SSH site's tests first (one group, the
    longest chain), then the cluster tests, which mostly wait, then the quick tier; the time-limited run's test
    last, for its run started with the session (tests/cluster/conftest.py) and needs no worker meanwhile."""
    names = getattr(item, "fixturenames", ())
    if "time_limited" in names:
        return 4
    if "remote_site" in names:
        return 0
    if item.get_closest_marker("slurm") is None:
        return 3
    return 2 if "training" in Path(str(item.path)).parts else 1


# pytest-xdist 3.8's own ``--dist loadgroup`` cannot read the marks under pytest 9: it appends the group to
# ``item._nodeid``, which pytest 9 no longer reads. Its documented hook, pytest_xdist_make_scheduler, takes a
# scheduler; LoadScopeScheduling's ``_split_scope`` (the one method xdist's own LoadFileScheduling and
# LoadGroupScheduling override) is the only way in that xdist offers to name a test's unit of work, so the
# scheduler below overrides it too. The workers collect, the controller schedules, so the groups reach it in a file.
GROUPS_FILE = "SUITE_XDIST_GROUPS"


def hand_out(config, items) -> None:
    items.sort(key=order)
    path = Path(os.environ[GROUPS_FILE])
    written = path.with_suffix(f".{config.workerinput['workerid']}")
    written.write_text(json.dumps({item.nodeid: xdist_group(item) for item in items}))
    written.replace(path)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") in ("no", "each"):  # -n alone means --dist load: groups must hold there too
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """Each group of tests one unit of work, run in one worker in order; every other test a unit of its own.
        Units are handed out in the order collected (no reordering by size)."""

        groups = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                self.groups = json.loads(Path(os.environ[GROUPS_FILE]).read_text())
            group = self.groups.get(nodeid)
            return f"group:{group}" if group else nodeid

    config.option.loadscopereorder = False
    return GroupScheduling(config, log)


def under_xdist(config) -> bool:
    return hasattr(config, "workerinput")


# ---- no cluster for a quick test -----------------------------------------------------------------------------
# What a test not marked ``slurm`` finds of Slurm's client tools: a controller that cannot be contacted, at once
# (a real client given no reachable controller waits for its timeouts, up to a minute). Such a test never uses a
# cluster, whether one is up or not; one that needs a cluster and lacks the mark fails instead of using it.
SLURM_CLIENTS = ("sinfo", "squeue", "sacct", "sacctmgr", "scontrol", "sbatch", "srun", "scancel", "sstat")
UNREACHABLE = ('#!/bin/sh\necho "$(basename "$0"): error: Unable to contact slurm controller (connect failure)'
               ' [a test not marked slurm: tests/conftest.py]" >&2\nexit 1\n')


@pytest.fixture(scope="session")
def _unreachable_slurm(tmp_path_factory) -> Path:
    stubs = tmp_path_factory.mktemp("no-slurm")
    for name in SLURM_CLIENTS:
        (stubs / name).write_text(UNREACHABLE)
        (stubs / name).chmod(0o755)
    return stubs


@pytest.fixture(autouse=True)
def _no_cluster_unless_marked(request, monkeypatch):
    if request.node.get_closest_marker("slurm") is None:
        stubs = request.getfixturevalue("_unreachable_slurm")
        monkeypatch.setenv("PATH", f"{stubs}{os.pathsep}{os.environ['PATH']}")


@pytest.fixture(scope="session")
def wheel(tmp_path_factory) -> Path:
    """The wheel a user installs, built once per session from a copy of the checkout's files (setuptools' build/ in
    the checkout would keep modules since moved)."""
    from support.helpers import REPO, shared_once

    def build(tmp: Path) -> None:
        source = tmp / "source"
        shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", ".slurm*", "build", "*.egg-info",
                                                                    "__pycache__", ".pytest_cache"))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                        str(tmp / "dist"), str(source)], check=True, capture_output=True, text=True, timeout=300)
        shutil.rmtree(source)

    (built,) = (shared_once(tmp_path_factory, "wheel", build) / "dist").glob("*.whl")
    return built


@pytest.fixture
def tmpfs(tmp_path):
    """``tmpfs("1m")`` mounts a filesystem of that size under ``tmp_path`` (or at ``at``; unmounted after the test):
    a disk that fills up for real, or that is made read-only. Needs root; skips without it, except in CI."""
    mounted = []

    def mount(size: str, at: Path | None = None) -> Path:
        path = at or tmp_path / f"disk{len(mounted)}"
        path.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
                                capture_output=True, text=True)
        if result.returncode != 0:
            if os.environ.get("CI"):
                pytest.fail(f"cannot mount a tmpfs: {result.stderr.strip()}")
            pytest.skip(f"cannot mount a tmpfs (needs root): {result.stderr.strip()}")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:  # lazily where a job's last process still holds it: it goes when that one ends
        if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=True)
