"""Node-local state that no other user can turn against a run: one private folder of this user's per node.

What the launcher keeps on a node outside the run directory (the ranks' pulses, launcher/core/heartbeats.py) lives
in a place every user of the node may write: the node's memory (``/dev/shm``), else its temporary folder
(``$TMPDIR``), or ``$LAUNCHER_LOCAL_DIR`` where a site sets it (:func:`shared_place`). Another user can create a
name there before the launcher does: a folder of theirs, or a symlink to a file or folder of this user's, which a
process that follows it then writes or deletes through (``fs.protected_symlinks``, the kernel's guard, is off on
some nodes). So everything lives in one folder per user, ``launcher-<uid>``, made 0700 and opened without
following a link, then checked through its descriptor: a directory, this user's, mode 0700 (:class:`Folder`).
Only this user (and root) can add a name inside. Every file in it is opened relative to that descriptor with
``O_NOFOLLOW``, written under a fresh ``O_EXCL`` name and renamed into place, read only when it is this user's,
and removed by name (unlink never follows a link). Anything else at ``launcher-<uid>`` (another user's folder or
file, a symlink) is never used, written through or removed: :class:`Taken` names it and its owner, and the
caller takes a folder of an unpredictable name instead (:func:`fresh`) and says so in the run's record.
"""
from __future__ import annotations

import contextlib
import errno
import os
import pwd
import re
import stat
import tempfile
import time
from pathlib import Path
from typing import Callable, List, Optional

PREFIX = "launcher-"
VARIABLE = "LAUNCHER_LOCAL_DIR"  # a site's node-local place for this state (cluster.env), instead of /dev/shm
# The batch shell's variable of the interpreter the ranks run (launcher/slurm/batch.py): cluster.python, exported to
# the stage step, then the copy of its environment in this user's folder where every node has one
# (launcher/job/stage_env.py).
TASK_PYTHON = "LAUNCHER_TASK_PYTHON"
SHM = Path("/dev/shm")


def shared_place() -> Path:
    """Where node-local state goes: ``$LAUNCHER_LOCAL_DIR`` if set, else the node's memory when it can be
    written, else the temporary folder (a job's own at many sites)."""
    if os.environ.get(VARIABLE):
        return Path(os.environ[VARIABLE])
    return SHM if SHM.is_dir() and os.access(SHM, os.W_OK) else Path(tempfile.gettempdir())


class Taken(Exception):
    """What is at a node-local path instead of a folder of this user's; the message names it and its owner."""

    def __init__(self, path: Path, found: str, owner: Optional[str]) -> None:
        super().__init__(f"{path} is {found}, not a private folder of yours: not used")
        self.path, self.found, self.owner = path, found, owner


class Folder:
    """An open private folder: its path (for messages) and the descriptor every operation goes through."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path, self.fd = Path(path), fd

    @classmethod
    def open(cls, path: Path, create: bool = True, parent: Optional["Folder"] = None) -> "Folder":
        """The folder at ``path`` (a name in ``parent`` where given), made 0700 if missing and ``create``; Taken
        when something else is there. Checked after opening, through its descriptor: the descriptor is what is
        used, so nothing swapped in after the check is."""
        name, at = (Path(path).name, parent.fd) if parent else (str(path), None)
        where = parent.path / name if parent else Path(path)
        if create:
            try:
                os.mkdir(name, 0o700, dir_fd=at)  # the umask can only narrow this
            except FileExistsError:
                pass
        try:
            fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=at)
        except OSError as err:
            if err.errno not in (errno.ELOOP, errno.ENOTDIR):
                raise
            raise _taken(where, name, at) from None
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            os.close(fd)
            raise Taken(where, f"a folder of user {_user(info.st_uid)}", _user(info.st_uid))
        if stat.S_IMODE(info.st_mode) != 0o700:
            os.fchmod(fd, 0o700)  # this user's own: made private again (what others left inside is never read)
        return cls(where, fd)

    def folder(self, name: str, create: bool = True) -> "Folder":
        return Folder.open(Path(name), create, parent=self)

    def write(self, name: str, data: bytes) -> None:
        """``name`` holds ``data`` whole: written to a fresh name created exclusively, then renamed over it (a
        rename replaces a symlink rather than following it)."""
        tmp = f".{name}.{os.getpid()}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=self.fd)  # this process's own, left by a write that failed halfway
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp, dir_fd=self.fd)
            raise

    def read(self, name: str) -> Optional[bytes]:
        """What ``name`` holds; None when it is missing, a symlink, or not this user's file."""
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(fd)
            if info.st_uid != os.geteuid() or not stat.S_ISREG(info.st_mode):
                return None
            return handle.read()

    def names(self) -> List[str]:
        """The names in the folder (none once it is gone)."""
        try:
            return os.listdir(self.fd)
        except OSError:
            return []

    def kind(self, name: str) -> Optional[str]:
        """``dir`` for a folder of this user's, ``file`` for anything else of this user's that is no link, else
        None: what the sweep may look into or remove."""
        try:
            info = os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return None
        if info.st_uid != os.geteuid() or stat.S_ISLNK(info.st_mode):
            return None
        return "dir" if stat.S_ISDIR(info.st_mode) else "file"

    def older(self, pattern: "re.Pattern[str]", kind: str, age_s: float) -> List[str]:
        """The names matching ``pattern`` of this user's entries of ``kind`` (:meth:`kind`) last changed more than
        ``age_s`` ago: what a sweep of copies may remove once nothing uses them."""
        found = []
        for name in self.names():
            if not pattern.fullmatch(name) or self.kind(name) != kind:
                continue
            try:
                changed = os.stat(name, dir_fd=self.fd, follow_symlinks=False).st_mtime
            except OSError:
                continue
            if time.time() - changed > age_s:
                found.append(name)
        return found

    def remove(self, name: str) -> None:
        """Remove the file ``name`` (a link itself, never what it points to); nothing if it is gone."""
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def remove_folder(self, name: str) -> bool:
        """Remove the empty folder ``name``; whether it went."""
        try:
            os.rmdir(name, dir_fd=self.fd)
            return True
        except OSError:
            return False

    def age(self) -> float:
        """Seconds since the folder last changed."""
        return time.time() - os.fstat(self.fd).st_mtime

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __enter__(self) -> "Folder":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def own_name() -> str:
    """The name of this user's folder in a shared place: ``launcher-<uid>``."""
    return f"{PREFIX}{os.geteuid()}"


def base_path() -> Path:
    """Where :func:`base` is: this user's folder in the shared place, by path (a job's copies are named by it)."""
    return shared_place() / own_name()


def base() -> Folder:
    """This user's folder in the shared place, ``launcher-<uid>``; Taken when another user's file or folder, or a
    symlink, is there."""
    return Folder.open(base_path())


def fresh() -> Folder:
    """A new private folder of an unpredictable name in the shared place (``launcher-<uid>-XXXXXXXX``, created
    exclusively): where the node's state goes when :func:`base` is taken."""
    return Folder.open(Path(tempfile.mkdtemp(prefix=f"{own_name()}-", dir=shared_place())), create=False)


def sweep(unused: Callable[[Folder], bool]) -> None:
    """Remove this user's node-local folders that ``unused`` finds no longer used: each folder in :func:`base`
    and in the fresh ones, then the fresh ones themselves (the base stays). Only folders of this user's are
    looked into and only this user's files removed, by name: a symlink or another user's entry is passed over."""
    me = own_name()
    try:
        shared = _place(shared_place())
    except OSError:
        return
    with shared:
        for name in sorted(shared.names()):
            if not (name == me or name.startswith(f"{me}-")) or shared.kind(name) != "dir":
                continue
            try:
                top = shared.folder(name, create=False)
            except (Taken, OSError):
                continue
            with top:
                for inner in top.names():
                    if top.kind(inner) == "dir":
                        _remove_if(top, inner, unused)
            if name != me:
                _remove_if(shared, name, unused)


def _remove_if(parent: Folder, name: str, unused: Callable[[Folder], bool]) -> None:
    """Remove the folder ``name`` of ``parent`` and its files when ``unused`` says so (a folder left inside keeps
    it)."""
    try:
        folder = parent.folder(name, create=False)
    except (Taken, OSError):
        return
    with folder:
        if not unused(folder):
            return
        for entry in folder.names():
            if folder.kind(entry) == "file":
                folder.remove(entry)
    parent.remove_folder(name)


def _place(path: Path) -> Folder:
    """The shared place itself, opened to look names up in it (it is everyone's: only read through, never changed
    but by name)."""
    return Folder(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))


def _taken(where: Path, name: str, at: Optional[int]) -> Taken:
    """What is at ``where``, which is not a folder: a symlink (and its owner), or a file."""
    try:
        info = os.stat(name, dir_fd=at, follow_symlinks=False)
    except OSError:
        return Taken(where, "gone", None)
    owner = _user(info.st_uid)
    if stat.S_ISLNK(info.st_mode):
        return Taken(where, f"a symlink of user {owner} to {os.readlink(name, dir_fd=at)}", owner)
    return Taken(where, f"a file of user {owner}", owner)


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
