"""Node-local state no other user can turn against a run (launcher/core/nodelocal.py, launcher/core/heartbeats.py):
a second Unix user, ``lplanter`` (support/planter.py), plants a folder, a file or a symlink at the name of this
user's folder in a shared sticky place, as in ``/dev/shm``, and at the names the sweep of dead jobs' folders reads.
Nothing is used, written through, changed or removed but this user's own. Needs root, as the planter does; the run
on the cluster with planted names is tests/cluster/test_planted_links.py."""
from __future__ import annotations

import json
import os
import stat
import time

import pytest
from support.planter import as_planter, directory, planted, victim_file

from launcher.core import nodelocal
from launcher.core.heartbeats import local_name, pulse_name, read_local, sweep_local

DEAD = {"rank": 0, "node": "n1", "pid": 999999999, "step": 3, "step_since": 1.0, "alive": 1.0}


@pytest.fixture
def shared(base, monkeypatch):
    """A sticky place every user may write, as /dev/shm is, for this test's node-local state."""
    place = directory(base / "shm", 0o1777)
    monkeypatch.setenv(nodelocal.VARIABLE, str(place))
    return place


def mine(shared) -> str:
    return str(shared / f"launcher-{os.geteuid()}")


def test_a_folder_another_user_made_at_our_name_is_not_used_and_a_fresh_one_is(shared, base):
    """The report: another user's folder at the run's name was used, and a ``.tmp`` planted in it as a symlink got
    the owner's file overwritten. It is refused, naming its owner, and left as it was."""
    victim = victim_file(base)
    planted("mkdir", "-m", "0777", mine(shared))
    planted("ln", "-s", str(victim), f"{mine(shared)}/.{pulse_name(0)}.1.tmp")
    with pytest.raises(nodelocal.Taken) as taken:
        nodelocal.base()
    assert str(taken.value) == f"{mine(shared)} is a folder of user lplanter, not a private folder of yours: not used"
    assert (taken.value.found, taken.value.owner) == ("a folder of user lplanter", "lplanter")
    assert stat.S_IMODE(os.stat(mine(shared)).st_mode) == 0o777 and victim.read_text() == "root's own file\n"
    with nodelocal.fresh() as fresh:
        info = os.lstat(fresh.path)
        assert fresh.path.parent == shared and fresh.path.name.startswith(f"launcher-{os.geteuid()}-")
        assert (stat.S_ISDIR(info.st_mode), stat.S_IMODE(info.st_mode), info.st_uid) == (True, 0o700, os.geteuid())
        fresh.write(pulse_name(0), b"{}")
        assert fresh.read(pulse_name(0)) == b"{}"


@pytest.mark.parametrize("plant, found", [
    (lambda path, target: planted("ln", "-s", str(target), path), "a symlink of user lplanter to {target}"),
    (lambda path, target: planted("touch", path), "a file of user lplanter"),
], ids=["symlink", "file"])
def test_a_symlink_or_file_at_our_name_is_neither_followed_nor_changed(shared, base, plant, found):
    target = directory(base / "owners", 0o755)
    (target / "notes.txt").write_text("root's own notes\n")
    plant(mine(shared), target)
    with pytest.raises(nodelocal.Taken) as taken:
        nodelocal.base()
    assert taken.value.found == found.format(target=target)
    assert stat.S_IMODE(target.stat().st_mode) == 0o755  # not made 0700 through the link
    assert os.listdir(target) == ["notes.txt"] and (target / "notes.txt").read_text() == "root's own notes\n"


def test_no_other_user_can_add_a_name_in_our_folder(shared, base):
    with nodelocal.base() as folder:
        assert (folder.path, stat.S_IMODE(os.stat(folder.path).st_mode)) == (shared / f"launcher-{os.geteuid()}",
                                                                             0o700)
        done = as_planter("ln", "-s", str(victim_file(base)), str(folder.path / pulse_name(0)))
        assert done.returncode != 0 and "Permission denied" in done.stderr


def test_the_sweep_removes_only_our_dead_folders_and_follows_no_link(shared, base):
    """The report: a symlink planted where the sweep looks (``launcher-<uid>-x``, to a folder of the owner's older
    than a minute) had every file in its target deleted. The sweep passes over links and other users' folders,
    and removes this user's folders whose ranks are gone, and the fresh folders they leave empty."""
    target = directory(base / "owners", 0o755)
    (target / pulse_name(0)).write_text(json.dumps(DEAD))  # looks like a dead job's folder, if it were followed
    planted("ln", "-s", str(target), f"{mine(shared)}-x")
    planted("mkdir", "-m", "0777", f"{mine(shared)}-y")
    planted("sh", "-c", f"echo '{json.dumps(DEAD)}' > {mine(shared)}-y/{pulse_name(0)}")
    old = time.time() - 2 * 60
    os.utime(target, (old, old))
    dead, live, starting = (local_name(base / "runs" / "r", job, "n1") for job in ("7", "8", "9"))
    with nodelocal.base() as ours:
        with ours.folder(dead) as folder:
            folder.write(pulse_name(0), json.dumps(DEAD).encode())
        with ours.folder(live) as folder:
            folder.write(pulse_name(0), json.dumps({**DEAD, "pid": os.getpid()}).encode())
        ours.folder(starting).close()  # a starting rank's, before its first pulse: left alone for a minute
        with ours.folder("compile-cache") as cache:  # not a folder of pulses: never the sweep's
            cache.write("kernel.py", b"")
            os.utime(cache.path, (old, old))
    with nodelocal.fresh() as empty:
        os.utime(empty.path, (old, old))
    sweep_local()
    assert sorted(os.listdir(shared)) == sorted([f"launcher-{os.geteuid()}", f"launcher-{os.geteuid()}-x",
                                                 f"launcher-{os.geteuid()}-y"])
    assert sorted(os.listdir(mine(shared))) == sorted(["compile-cache", live, starting])
    assert os.listdir(target) == [pulse_name(0)] and os.listdir(f"{mine(shared)}-y") == [pulse_name(0)]
    with nodelocal.base() as ours, ours.folder(live, create=False) as folder:
        assert [p.pid for p in read_local(folder)] == [os.getpid()]


def test_a_compiled_runs_cache_is_kept_in_our_folder_unless_the_user_chose_one(shared, monkeypatch):
    """inductor's default cache, ``/tmp/torchinductor_<user>``, is found by name in a folder every user may write and
    never checked: another user's folder there would hand the ranks their code to load."""
    from launcher.train.task import private_compile_cache  # lazy: imports torch

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "unset below; restored after the test")
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    with nodelocal.base() as folder:
        private_compile_cache(folder)
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == f"{mine(shared)}/compile-cache"
        assert stat.S_IMODE(os.stat(f"{mine(shared)}/compile-cache").st_mode) == 0o700
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/scratch/inductor")
        private_compile_cache(folder)
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/scratch/inductor"
