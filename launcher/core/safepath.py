"""Where another user could plant a symlink: the run root and the launcher home, and the one rule for both.

A run root inside a directory that another user can write lets that user rename the runs in it, or swap
``.index`` (or a whole run directory) for a symlink, and the launcher, often run as root, then writes where
they point. A launcher home in such a place hands them the secrets store. So, as OpenSSH's StrictModes
refuses a key file whose path others could change, the launcher refuses such a directory in one line
(:func:`check_tree`): every directory that resolving its path looks a name up in, from ``/`` down to the
directory itself and through every symlink on the way, must belong to this user or root, and no one else
may write it unless its sticky bit is set (``/tmp``: others may add entries but not rename ours). Group
write is accepted from a group of this user alone (a user private group, as Debian's OpenSSH accepts it)
and, for a run root, from the group its runs are shared with (``share_group``, launcher/core/privacy.py).
A symlink on the way must be this user's or root's: its owner could point it elsewhere.

Inside a directory that passes, only this user (and root) can add names, except in a sticky one, where
another user can still create a name before the launcher does. So the launcher's files there are opened
with ``O_NOFOLLOW`` (:func:`open_nofollow`), its own directories there are checked to be its own and not
symlinks (:func:`private_dir`), whole files are written by ``mkstemp`` (``O_EXCL``) and rename (which
replaces a symlink rather than following it), ``shutil.rmtree`` does not follow symlinks inside, and a file that
the runs of a root share is read or appended to only when it is one the root trusts (:func:`trusted_file`).
"""
from __future__ import annotations

import errno
import grp
import os
import pwd
import stat
from pathlib import Path
from typing import Collection, Iterator, Optional, Tuple

from launcher.core.privacy import group_id

RUN_ROOT = "choose another run root (run_root=... or LAUNCHER_RUN_ROOT)"
HOME = "set LAUNCHER_HOME to a directory of your own"
_MAX_LINKS = 40  # as the kernel's limit on symlinks followed in one path (ELOOP)


class UnsafePath(PermissionError):
    """A directory or file another user could redirect; the message is the one line shown to the user."""


def check_run_root(root: Path, share_group: Optional[str] = None) -> None:
    """UnsafePath unless no one but this user, root and the run root's share group can change what the run
    root's path leads to. The share group is the launch's ``share_group``, or the root's own group when the
    root is setgid (launcher/core/privacy.py share_root makes it so): the group its runs are shared with."""
    trusted = {gid for gid in (group_id(share_group), _shared_group(root)) if gid is not None}
    check_tree(root, "run root", RUN_ROOT, trusted, shareable=True)


def check_home(home: Path) -> None:
    """UnsafePath unless no one but this user and root can change what the launcher home's path leads to
    (its secrets are never shared: no share group is trusted, only a group of this user alone)."""
    check_tree(home, "launcher home", HOME)


def ensure_home(home: Path) -> Path:
    """The launcher home, created (0700) if missing, once no other user could change it: checked before
    anything is created, and after (what was created took the umask)."""
    check_home(home)
    home.mkdir(parents=True, exist_ok=True, mode=0o700)
    check_home(home)
    return home


def is_safe_root(root: Path) -> bool:
    """Whether the launcher may write a cache into ``root`` (a status command: a root that fails the check
    is read, but nothing is written into it)."""
    try:
        check_run_root(root)
        return True
    except UnsafePath:
        return False


def check_tree(path: Path, what: str, instead: str, trusted_gids: Collection[int] = (),
               shareable: bool = False) -> None:
    """UnsafePath, in one line naming the directory, who can change it and what to do, when another user
    could change what ``path`` resolves to (see the module's docstring). A part of the path that does not
    exist yet is not checked: this user creates it, inside the last part that was. ``shareable``: a group that
    may write is also allowed by sharing the runs with it (a project directory's group, ``share_group``)."""
    me = os.geteuid()
    for place, info in _traversed(Path(os.path.expanduser(path)).absolute()):
        problem = _problem(place, info, me, trusted_gids, shareable)
        if problem:
            who, fix = problem
            raise UnsafePath(f"{what} {path} is refused: {place} {who}; {f'{fix}, or ' if fix else ''}{instead}")


def _problem(place: str, info: os.stat_result, me: int, trusted_gids: Collection[int],
             shareable: bool = False) -> Optional[Tuple[str, Optional[str]]]:
    """Who besides this user and root could change ``place``, and the command that stops it (None: only
    another place will do); None when no one can."""
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid not in (me, 0):
        if stat.S_ISLNK(info.st_mode):
            return f"is a symlink of user {_user(info.st_uid)}, who can point it elsewhere", None
        return f"is a directory of user {_user(info.st_uid)}, who can rename what is in it or plant symlinks", None
    if stat.S_ISLNK(info.st_mode) or mode & stat.S_ISVTX:  # a link's own mode means nothing; sticky: ours stay
        return None
    others = "who could rename what is in it or plant symlinks"
    if mode & stat.S_IWOTH:
        return f"is writable by every user (mode {mode:04o}, no sticky bit), {others}", f"run chmod o-w {place}"
    if mode & stat.S_IWGRP:
        if _has_acl(place):  # the group bits are the ACL's mask: named users may write too
            return (f"is writable by the users and groups its access-control list names (mode {mode:04o}, "
                    f"getfacl {place}), {others}", f"run chmod g-w {place}")
        if info.st_gid not in trusted_gids and not _only_mine(info.st_gid, me):
            share = f", share the runs with that group (share_group={_group(info.st_gid)})" if shareable else ""
            return (f"is writable by group {_group(info.st_gid)} (mode {mode:04o}, no sticky bit), {others}",
                    f"run chmod g-w {place}{share}")
    return None


def _traversed(path: Path) -> Iterator[Tuple[str, os.stat_result]]:
    """(path, lstat) of every directory that resolving ``path`` looks a name up in, of every symlink it
    follows, and of what ``path`` names; it stops at the first part that does not exist (or cannot be read,
    where the launcher's own call will fail in its own words)."""
    names, here, links = [n for n in str(path).split("/") if n], "/", 0
    yield here, os.lstat(here)
    while names:
        name = names.pop(0)
        if name in (".", ".."):
            here = here if name == "." else os.path.dirname(here)  # ``here`` holds no symlink: dirname is its parent
            continue
        there = os.path.join(here, name)
        try:
            info = os.lstat(there)
        except OSError:
            return
        yield there, info
        if stat.S_ISLNK(info.st_mode):
            links += 1
            target = os.readlink(there)
            if links > _MAX_LINKS:
                return
            names[:0] = [n for n in target.split("/") if n]
            here = "/" if target.startswith("/") else here
        else:
            here = there


def _shared_group(root: Path, anyones: bool = False) -> Optional[int]:
    """The group a setgid run root's runs are shared with, of a root of this user's: the group the directories on
    its path may be writable by. ``anyones``: of a root of any user's, where only the root's own files are judged
    (:func:`trusted_file`), never what leads to it."""
    try:
        info = os.stat(os.path.expanduser(root))
    except OSError:
        return None
    return info.st_gid if (anyones or info.st_uid == os.geteuid()) and info.st_mode & stat.S_ISGID else None


def trusted_file(info: os.stat_result, root: Path) -> bool:
    """Whether a file directly in a run root that others share (its fstat) may be read or appended to: a regular
    file of this user's or root's, or of the group a shared (setgid) root's runs are shared with."""
    if not stat.S_ISREG(info.st_mode):
        return False
    return info.st_uid in (os.geteuid(), 0) or info.st_gid == _shared_group(root, anyones=True)


def _only_mine(gid: int, me: int) -> bool:
    """Whether the group has this user as its only member, primary or supplementary (Debian's OpenSSH rule
    for a user private group); a group of no one is not, as it often serves setgid programs."""
    try:
        group = grp.getgrgid(gid)
        name = pwd.getpwuid(me).pw_name
    except KeyError:
        return False
    primary = {user.pw_uid for user in pwd.getpwall() if user.pw_gid == gid}
    return primary <= {me} and set(group.gr_mem) <= {name} and bool(primary or group.gr_mem)


def _has_acl(place: str) -> bool:
    try:
        return "system.posix_acl_access" in os.listxattr(place, follow_symlinks=False)
    except OSError:
        return False


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _group(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def open_nofollow(path: Path, flags: int = os.O_RDONLY, mode: int = 0o600) -> int:
    """``os.open`` that refuses a symlink as the last part of ``path`` (UnsafePath naming it) instead of
    following it: for files that sit directly in a run root or the launcher home."""
    try:
        return os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise UnsafePath(f"{path} is a symlink, which the launcher does not follow there (another user may "
                             "have planted it): remove it") from None
        raise


def private_dir(path: Path, what: str, instead: str) -> None:
    """Make ``path`` a 0700 directory of this user's, created if missing; UnsafePath when a symlink, another
    user's directory or a file is there. It is checked and chmod-ed through one descriptor, so a symlink is
    never followed (root could otherwise chmod, and then write into, anyone's directory)."""
    try:
        os.mkdir(path, 0o700)  # the umask can only narrow this
    except FileExistsError:
        pass
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        if err.errno not in (errno.ELOOP, errno.ENOTDIR):
            raise
        kind = f"a symlink to {os.readlink(path)}" if os.path.islink(path) else "not a directory"
        raise UnsafePath(f"{what} {path} is {kind}, which the launcher does not follow: remove it, or {instead}") \
            from None
    try:
        owner = os.fstat(fd).st_uid
        if owner != os.geteuid():
            raise UnsafePath(f"{what} {path} is a directory of user {_user(owner)}, not yours: remove it, or {instead}")
        os.fchmod(fd, 0o700)
    finally:
        os.close(fd)
