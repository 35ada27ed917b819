"""No symlink another user could plant is followed (launcher/core/safepath.py): a run root or launcher home whose
path another user could change is refused in one line, a sticky directory (/tmp) is accepted, and in one that
passes, a symlink planted where the launcher writes is refused rather than followed.

A second Unix user, ``lplanter``, plants real symlinks and renames real directories (``runuser``), so these tests
need root (CI runs as root); the user is made once per machine (support/planter.py). Everything here happens
before Slurm is asked; tests/cluster/test_planted_links.py launches into a sticky run root with a planted ``.index``."""
from __future__ import annotations

import grp
import json
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from support.helpers import REPO, run_launcher
from support.planter import PLANTER, as_planter, directory, planted, victim_file

from launcher import cli
from launcher.console.serve import write_token
from launcher.slurm.limits import SiteRules, cached
from launcher.core.events import Submitted
from launcher.core.rundir import append_event
from launcher.core.safepath import UnsafePath, check_run_root
from launcher.core.run_index import (
    RunRecord,
    create_run_dir,
    ensure_root,
    record_names,
    save_record,
)

TINY = ("gpus=2", "model=gpt_tiny", "train.steps=2", "train.log_every=1", "train.eval_every=2")
RUN_ROOT = "choose another run root (run_root=... or LAUNCHER_RUN_ROOT)"
HOME = "set LAUNCHER_HOME to a directory of your own"


def recorded(root: Path, name: str = "mine") -> Path:
    """A run made as a launch makes it (directory, record, index), without Slurm; its directory."""
    run_dir = create_run_dir(root, name, explicit=True)
    save_record(RunRecord(name=name, run_dir=str(run_dir), model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2,
                          steps=2, cluster="local", submitted_at=1.0))
    return run_dir


def loose(place: Path, mode: int) -> str:
    return (f"{place} is writable by every user (mode {mode:04o}, no sticky bit), who could rename what is in it "
            f"or plant symlinks; run chmod o-w {place}")


def test_an_index_symlink_in_a_run_root_another_user_made_is_not_followed(base, capsys):
    """The report: a run root inside a directory another user can write; they made the root themselves with
    an ``.index`` symlink to a file of root's, and a launch appended a line to that file."""
    victim = victim_file(base)
    shared = directory(base / "shared", 0o777)
    planted("mkdir", "-m", "0777", str(shared / "runs"))
    planted("ln", "-s", str(victim), str(shared / "runs" / ".index"))
    assert cli.main([*TINY, f"run_root={shared / 'runs'}"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: run root {shared / 'runs'} is refused: {loose(shared, 0o777)}, or {RUN_ROOT}\n"
    assert victim.read_text() == "root's own file\n"
    assert os.listdir(shared / "runs") == [".index"]  # no run directory was made
    # A status command reads such a root, but writes nothing into it (the index is only a cache).
    assert cli.main(["runs", "--json", "--root", str(shared / "runs")]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert victim.read_text() == "root's own file\n"


def test_in_a_sticky_run_root_a_planted_index_symlink_is_not_followed(base, capsys):
    """A sticky root (a shared scratch, 1777) is accepted: others may add names but not rename ours. One may
    still plant ``.index`` before the first run: it is neither written through nor read."""
    victim = victim_file(base)
    root = directory(base / "scratch", 0o1777)
    planted("ln", "-s", str(victim), str(root / ".index"))
    assert ensure_root(str(root)) == root
    recorded(root, "mine")
    assert victim.read_text() == "root's own file\n" and (root / ".index").is_symlink()
    assert [name for _, name in record_names(root)] == ["mine"]
    assert cli.main(["runs", "--json", "--root", str(root)]) == 0
    assert [row["name"] for row in json.loads(capsys.readouterr().out)] == ["mine"]
    assert victim.read_text() == "root's own file\n"


def test_an_event_log_that_is_a_symlink_is_refused_not_appended_to(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("root's own file\n")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").symlink_to(victim)
    with pytest.raises(UnsafePath) as err:
        append_event(run_dir, Submitted(job_id="1"))
    assert str(err.value) == (f"{run_dir / 'events.jsonl'} is a symlink, which the launcher does not follow there "
                              "(another user may have planted it): remove it")
    assert victim.read_text() == "root's own file\n"


def test_the_suites_run_roots_and_tmp_are_accepted(tmp_path):
    """pytest's directories (0700 under the sticky /tmp) and /tmp itself pass; a part not made yet is not
    checked (its creator is this user)."""
    check_run_root(tmp_path / "runs" / "not" / "yet")
    check_run_root(Path("/tmp"))
    check_run_root(Path(tempfile.gettempdir()))


def planters_group() -> str:
    return grp.getgrgid(pwd.getpwnam(PLANTER).pw_gid).gr_name


@pytest.mark.parametrize("mode, group, shared, refusal", [
    (0o777, "root", False, "every user"),
    (0o1777, "root", False, None),  # sticky: others add names, but cannot rename or remove ours
    (0o775, "planter", False, "group"),
    (0o775, "planter", True, None),  # the group the runs are shared with (share_group)
    (0o775, "root", False, None),  # a group of root's alone, as a user private group is
    (0o1775, "planter", False, None),
])
def test_a_run_root_in_a_directory_others_can_write_is_refused_unless_sticky(base, mode, group, shared, refusal):
    parent = directory(base / "parent", mode)
    os.chown(parent, -1, pwd.getpwnam(PLANTER).pw_gid if group == "planter" else 0)
    parent.chmod(mode)  # chown clears the sticky bit on some systems
    root, share = parent / "runs", planters_group() if shared else None
    if refusal is None:
        assert ensure_root(str(root), share) == root
        return
    with pytest.raises(UnsafePath) as err:
        ensure_root(str(root), share)
    who = (f"is writable by every user (mode {mode:04o}, no sticky bit)" if refusal == "every user" else
           f"is writable by group {planters_group()} (mode {mode:04o}, no sticky bit)")
    fix = f"o-w {parent}" if refusal == "every user" else \
        f"g-w {parent}, share the runs with that group (share_group={planters_group()})"
    assert str(err.value) == (f"run root {root} is refused: {parent} {who}, who could rename what is in it or "
                              f"plant symlinks; run chmod {fix}, or {RUN_ROOT}")
    assert not root.exists()  # refused before anything was made


def test_another_users_directory_symlink_or_acl_on_the_way_is_refused(base):
    """What else lets another user change the path: a directory or a symlink of theirs (even one that points
    where this user's runs are), or an access-control list that lets them write."""
    mine = directory(base / "mine", 0o755)
    theirs = directory(base / "theirs", 0o755)
    os.chown(theirs, pwd.getpwnam(PLANTER).pw_uid, -1)
    with pytest.raises(UnsafePath) as err:
        check_run_root(theirs / "runs")
    assert str(err.value) == (f"run root {theirs / 'runs'} is refused: {theirs} is a directory of user {PLANTER}, who "
                              f"can rename what is in it or plant symlinks; {RUN_ROOT}")
    planted("ln", "-s", str(mine), str(theirs / "link"))
    with pytest.raises(UnsafePath) as err:
        check_run_root(base / "theirs" / "link" / "runs")
    assert f"{theirs} is a directory of user {PLANTER}" in str(err.value)
    os.symlink(mine, base / "ours")
    check_run_root(base / "ours" / "runs")  # a link of this user's, in a directory no one else writes
    os.lchown(base / "ours", pwd.getpwnam(PLANTER).pw_uid, -1)
    with pytest.raises(UnsafePath) as err:
        check_run_root(base / "ours" / "runs")
    assert str(err.value) == (f"run root {base / 'ours' / 'runs'} is refused: {base / 'ours'} is a symlink of user "
                              f"{PLANTER}, who can point it elsewhere; {RUN_ROOT}")
    if not shutil.which("setfacl"):
        pytest.skip("setfacl is not installed (run scripts/setup.sh)")
    subprocess.run(["setfacl", "-m", f"u:{PLANTER}:rwx", str(mine)], check=True)
    with pytest.raises(UnsafePath) as err:
        check_run_root(mine / "runs")
    assert str(err.value) == (f"run root {mine / 'runs'} is refused: {mine} is writable by the users and groups its "
                              f"access-control list names (mode 0775, getfacl {mine}), who could rename what is in "
                              f"it or plant symlinks; run chmod g-w {mine}, or {RUN_ROOT}")


def test_another_user_cannot_rename_runs_where_the_launcher_accepts_the_root(base, capsys):
    """Where the root passes (a private root, or a sticky one), the other user's rename fails; where they could
    rename (the root was loosened later), stop and delete refuse it in one line and leave the run alone."""
    private = recorded(ensure_root(str(base / "runs")), "private")
    sticky = recorded(ensure_root(str(directory(base / "scratch", 0o1777))), "shared-scratch")
    for run_dir in (private, sticky):
        moved = as_planter("mv", str(run_dir), str(run_dir.parent / "stolen"))
        assert moved.returncode != 0 and run_dir.is_dir() and not (run_dir.parent / "stolen").exists()
    (base / "scratch").chmod(0o777)  # its owner loosened it: now the rename would succeed
    for command in (["delete", "shared-scratch", "--yes"], ["stop", "shared-scratch"]):
        assert cli.main([*command, "--root", str(base / "scratch")]) == 2
        assert capsys.readouterr().err == (f"error: run root {base / 'scratch'} is refused: "
                                           f"{loose(base / 'scratch', 0o777)}, or {RUN_ROOT}\n")
    assert (sticky / "run.json").is_file()
    planted("mv", str(sticky), str(base / "scratch" / "stolen"))  # what the refusal guards against


def secrets_create(env: dict, name: str = "TOKEN") -> subprocess.CompletedProcess:
    return run_launcher("secrets", "create", "env", name, input="s3cret-value", env={**os.environ, **env}, cwd=REPO)


def test_a_secrets_symlink_another_user_planted_is_never_followed(base, capsys, monkeypatch):
    """The report: a LAUNCHER_HOME whose ``secrets`` is another user's symlink had the secret written into their
    directory. A home they can write is refused (the launch too); in a sticky one, where they can still plant a
    name, the planted link or directory is refused; their directory is left as it was, mode and all."""
    theirs = directory(base / "theirs", 0o777)
    os.chown(theirs, pwd.getpwnam(PLANTER).pw_uid, -1)
    home = directory(base / "loose-home", 0o777)
    planted("ln", "-s", str(theirs), str(home / "secrets"))
    res = secrets_create({"LAUNCHER_HOME": str(home)})
    assert (res.returncode, res.stderr) == (2, f"error: launcher home {home} is refused: {loose(home, 0o777)}, or "
                                               f"{HOME}\n")
    monkeypatch.setenv("LAUNCHER_HOME", str(home))
    assert cli.main([*TINY, f"run_root={base / 'runs'}"]) == 2  # its tasks would read secrets from there
    assert capsys.readouterr().err == f"error: launcher home {home} is refused: {loose(home, 0o777)}, or {HOME}\n"
    assert not (base / "runs").exists()

    sticky = directory(base / "sticky-home", 0o1777)
    planted("ln", "-s", str(theirs), str(sticky / "secrets"))
    res = secrets_create({"LAUNCHER_HOME": str(sticky)})
    assert (res.returncode, res.stderr) == (2, f"error: secrets store {sticky / 'secrets'} is a symlink to {theirs}, "
                                               f"which the launcher does not follow: remove it, or {HOME}\n")
    planted("rm", str(sticky / "secrets"))
    planted("mkdir", "-m", "0777", str(sticky / "secrets"))
    res = secrets_create({"LAUNCHER_HOME": str(sticky)})
    assert (res.returncode, res.stderr) == (2, f"error: secrets store {sticky / 'secrets'} is a directory of user "
                                               f"{PLANTER}, not yours: remove it, or {HOME}\n")
    assert os.listdir(theirs) == [] and os.listdir(sticky / "secrets") == []
    assert (theirs.stat().st_mode & 0o7777, (sticky / "secrets").stat().st_mode & 0o7777) == (0o777, 0o777)

    planted("rm", "-r", str(sticky / "secrets"))  # gone: the store is made as ever, 0700, the secret in it
    res = secrets_create({"LAUNCHER_HOME": str(sticky)})
    assert res.returncode == 0, res.stderr
    assert (sticky / "secrets" / "TOKEN.value").read_text() == "s3cret-value"
    assert (sticky / "secrets").stat().st_mode & 0o777 == 0o700 and (sticky / "secrets").stat().st_uid == 0


def test_an_ssh_socket_directory_another_user_planted_is_refused(base, monkeypatch):
    from launcher.errors import LaunchError
    from launcher.remote.ssh import Remote, options

    sticky = directory(base / "h", 0o1777)  # short: the sockets' path must fit
    monkeypatch.setenv("LAUNCHER_HOME", str(sticky))
    planted("mkdir", "-m", "0700", str(sticky / "ssh"))
    with pytest.raises(LaunchError) as err:
        options(Remote("site", "login.site.edu"))
    assert err.value.message == (f"SSH socket directory {sticky / 'ssh'} is a directory of user {PLANTER}, not "
                                 f"yours: remove it, or {HOME}")


def test_caches_and_the_console_token_where_another_user_made_the_folder_first_are_refused(base, monkeypatch, capsys):
    """Beside the run root and the launcher home, the folders the launcher keeps things in: the default corpus'
    ``data.cache_dir`` (built there, then trained on), the composed config views (``$XDG_CACHE_HOME/launcher``) and
    the console's token. Another user's folder at one of their names in a sticky place is refused, not used."""
    sticky = directory(base / "scratch", 0o1777)
    for name in ("cache", "launcher", "home", "rules"):
        planted("mkdir", "-m", "0755", str(sticky / name))
    planted("sh", "-c", f"echo '{{\"user\": \"root\"}}' > {sticky / 'rules' / 'site-rules.json'}")
    theirs = "is a directory of user lplanter, who can rename what is in it or plant symlinks"
    assert cli.main(["plan", *TINY, f"data.cache_dir={sticky / 'cache'}"]) == 2
    assert capsys.readouterr().err == (f"error: data.cache_dir {sticky / 'cache'} is refused: {sticky / 'cache'} "
                                       f"{theirs}; set data.cache_dir to a folder of your own\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(sticky))
    monkeypatch.setenv("LAUNCHER_SITE_CONFIG", str(REPO / "slurm" / "site"))  # a layer: launches compose from a view
    assert cli.main(["plan", *TINY, "cluster=local2"]) == 2
    assert capsys.readouterr().err == (f"error: cache folder {sticky / 'launcher'} is refused: {sticky / 'launcher'} "
                                       f"{theirs}; set XDG_CACHE_HOME to a folder of your own\n")
    monkeypatch.setenv("LAUNCHER_HOME", str(sticky / "home"))
    with pytest.raises(UnsafePath) as err:
        write_token("token")
    assert str(err.value) == f"launcher home {sticky / 'home'} is refused: {sticky / 'home'} {theirs}; {HOME}"
    assert os.listdir(sticky / "home") == []
    # Slurm's site rules, kept a few minutes: not read from, nor written into, a folder of another user's.
    asked = SiteRules("root", (), "", (), {}, {})
    assert cached(sticky / "rules" / "site-rules.json", lambda: asked) is asked
    assert os.listdir(sticky / "rules") == ["site-rules.json"]
    assert (sticky / "rules" / "site-rules.json").read_text() == '{"user": "root"}\n'  # theirs, untouched
