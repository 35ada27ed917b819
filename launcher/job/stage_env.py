"""The tasks' environment read once per node (``cluster.stage_env``): packed into one archive once per version of the
environment, unpacked by one task per node to node-local storage, and run from there by every rank (docs/site.md,
"Staging the environment"; docs/performance.md, bring-up at scale).

Every rank imports about 2,000 modules from the tasks' environment (torch, its distributed and checkpoint code,
submitit, OmegaConf), which a site user keeps on the shared file system: each a stat, an open and more of its metadata
server's operations, per rank, in the same seconds. Staged, a node reads one file instead.

The archive, ``env-<version>.tar`` with its sha256 in ``env-<version>.sha256``, is kept beside the environment, in
``<prefix>/.launcher-stage/``, which every node can read already. The tasks' Python makes it itself (``python -m
launcher.job.stage_env pack``, which reads ``sys.prefix``): at launch once per version (launcher/submit/checks.py),
and again in the job's stage step where it is missing or fails its checksum, which that step checks on the batch host
before any node reads it (launcher/job/stage.py). A version is named by the interpreter, the environment's path and
each packed folder of packages' listing and change time: a stat and a directory read each, no file read. pip's
installs, upgrades and removals change a listing; a file edited in place does not (``touch`` the site-packages folder
to make a new version). Packing a version removes the archives of the others.

It holds the environment's prefix (a venv's; a conda environment's, which holds its interpreter and standard library
too) and, for a venv whose base interpreter's standard library is on a network file system as well, that library and
interpreter under ``.base/`` (the venv's links to its interpreter point there, and the staged ``pyvenv.cfg`` names
it), so that no rank imports from the shared file system.

On a node: ``env-<version>/`` in this user's private node-local folder (launcher/core/nodelocal.py: 0700, opened
without following a link, its owner checked), unpacked under a fresh name, its bytes checked against the checksum as
they are read, then renamed into place; kept for the node's later jobs of the same version. Another version is
removed by a later stage step once no process of this user's on the node runs from it.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, List, Optional, Sequence

from launcher.core import nodelocal

FOLDER = ".launcher-stage"  # beside the environment: its archives
BASE = ".base"  # in the archive: the base interpreter and its standard library, where on a network file system
STAGED = re.compile(r"env-[0-9a-f]{16}")  # a node's copy of one version (:attr:`Environment.name`)
LOCK = re.compile(r"\.env-[0-9a-f]{16}\.lock")  # held while a node's task unpacks that version (:func:`unpack`)
GRACE_S = 600.0  # another version's copy is left alone this long after it was made: a job may be about to run it
# File systems whose files a node reads over the network: a base interpreter's standard library on one of these is
# packed too (its mount's type in /proc/self/mountinfo).
NETWORK = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "fuse.glusterfs",
                     "cifs", "smb3", "panfs", "wekafs", "fuse.sshfs", "9p", "virtiofs", "orangefs"})
CHUNK = 1 << 20
# tar's own extraction filter where this Python has one: no absolute or climbing names, no device files, no set-id bits.
FILTER = {"filter": "tar"} if hasattr(tarfile, "tar_filter") else {}


@dataclass(frozen=True)
class Environment:
    """The tasks' environment as packed: its ``prefix``, the interpreter the ranks run (``python``, under it), the
    base interpreter's ``stdlib`` where that is packed too (None otherwise), and its ``version``."""

    prefix: Path
    python: Path
    stdlib: Optional[Path]
    version: str

    def to_json(self) -> dict:
        return {"prefix": str(self.prefix), "python": str(self.python),
                "stdlib": None if self.stdlib is None else str(self.stdlib), "version": self.version}

    @classmethod
    def from_json(cls, data: dict) -> "Environment":
        return cls(Path(data["prefix"]), Path(data["python"]), data["stdlib"] and Path(data["stdlib"]), data["version"])

    @property
    def name(self) -> str:
        return f"env-{self.version}"

    @property
    def archive(self) -> Path:
        return self.prefix / FOLDER / f"{self.name}.tar"

    @property
    def checksum(self) -> Path:
        return self.prefix / FOLDER / f"{self.name}.sha256"


def this_environment(mounts: Optional[str] = None, python: Optional[str] = None) -> Environment:
    """The environment of the Python running this, which is the tasks' (the stage step and ``pack`` run it), whose
    ranks run ``python`` (``cluster.python``: a wrapper in the environment's ``bin`` runs as such) where it lies in
    the environment, else this interpreter; ValueError where it is no environment of its own (a system's
    interpreter: its prefix is ``/usr``)."""
    prefix = Path(sys.prefix)
    refused = not_an_environment(sys.executable, prefix)
    if refused:
        raise ValueError(refused)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    base = sys.base_prefix != sys.prefix and network_fs(stdlib, mounts)
    packages = {Path(sysconfig.get_paths()[kind]) for kind in ("purelib", "platlib")}
    digest = hashlib.sha256(f"{sys.version}\n{prefix}\n{sys.executable}\n{base}\n".encode())
    digest.update("\0".join(sorted(set(os.listdir(prefix)) - {FOLDER})).encode())  # its change time is the archives'
    for folder in sorted([*packages, *([stdlib] if base else [])]):
        with contextlib.suppress(OSError):
            info = os.stat(folder)
            digest.update(f"{folder} {info.st_ino} {info.st_mtime_ns}\n".encode())
            digest.update("\0".join(sorted(os.listdir(folder))).encode())
    ranks = Path(python or sys.executable)
    ranks = ranks if ranks.is_absolute() and ranks.is_relative_to(prefix) else Path(sys.executable)
    return Environment(prefix, ranks, stdlib if base else None, digest.hexdigest()[:16])


def not_an_environment(python: str, prefix: Path) -> Optional[str]:
    """Why ``python``, whose prefix is ``prefix``, has no environment of its own to stage (a system's interpreter:
    ``/usr``), or None for a venv's or a conda environment's."""
    if (prefix / "pyvenv.cfg").is_file() or (prefix / "conda-meta").is_dir():
        return None
    return (f"the tasks' Python {python} is not in an environment of its own (its prefix {prefix} has no pyvenv.cfg "
            "or conda-meta); make one (python -m venv) or set cluster.stage_env=false")


def network_fs(path: Path, mounts: Optional[str] = None) -> bool:
    """Whether ``path`` lies on a network file system: the type of its mount, the longest mount point above it in
    ``mounts`` (``/proc/self/mountinfo``'s text, read where not given)."""
    if mounts is None:
        mounts = Path("/proc/self/mountinfo").read_text()
    where, best, kind = os.path.realpath(path), "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        if (where == point or where.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
            best, kind = point, line.split(" - ", 1)[1].split()[0]
    return kind in NETWORK


class Hashing:
    """A file read or written through, its sha256 taken of every byte that passes."""

    def __init__(self, file: BinaryIO) -> None:
        self.file, self.digest = file, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.digest.update(data)
        return self.file.write(data)

    def read(self, size: int = -1) -> bytes:
        data = self.file.read(size)
        self.digest.update(data)
        return data

    def rest(self) -> str:
        """The digest once every byte left is read."""
        while self.read(CHUNK):
            pass
        return self.digest.hexdigest()


def pack(env: Environment) -> None:
    """Write the environment's archive and its checksum (each under a fresh name, then renamed into place), then
    remove the archives of other versions."""
    folder = env.archive.parent
    folder.mkdir(exist_ok=True)
    mask = os.umask(0)
    os.umask(mask)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{env.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o644 & ~mask)
        with os.fdopen(fd, "wb") as file:
            out = Hashing(file)
            with tarfile.open(fileobj=out, mode="w|") as tar:  # type: ignore[call-overload]
                tar.add(env.prefix, arcname=".", filter=_outside(env))
                if env.stdlib is not None:
                    _add_base(tar, env)
        env.checksum.write_text(out.digest.hexdigest() + "\n")
        os.replace(tmp, env.archive)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    for old in folder.iterdir():
        if old.name.startswith("env-") and not old.name.startswith(f"{env.name}."):
            with contextlib.suppress(OSError):
                old.unlink()


def _outside(env: Environment):
    """tar's filter of the prefix: without its folder of archives; with a packed base, the venv's links to its
    interpreter pointed at the staged one."""
    executable = os.path.realpath(getattr(sys, "_base_executable", sys.executable))

    def member(info: tarfile.TarInfo) -> Optional[tarfile.TarInfo]:
        if info.name == f"./{FOLDER}" or info.name.startswith(f"./{FOLDER}/"):
            return None
        if env.stdlib is not None and info.issym() and info.name.startswith("./bin/") and \
                os.path.realpath(env.prefix / info.name) == executable:
            info.linkname = f"../{BASE}/bin/{os.path.basename(executable)}"
        return info
    return member


def _add_base(tar: tarfile.TarFile, env: Environment) -> None:
    """The base interpreter, its shared libraries and its standard library (but its own packages) under ``.base/``."""
    executable = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    tar.add(executable, arcname=f"{BASE}/bin/{os.path.basename(executable)}")
    libdir = Path(sysconfig.get_config_var("LIBDIR") or "/nonexistent")
    for library in sorted(libdir.glob("libpython*.so*")):
        tar.add(library, arcname=f"{BASE}/lib/{library.name}")
    assert env.stdlib is not None
    skip = {"site-packages", "dist-packages"}
    tar.add(env.stdlib, arcname=f"{BASE}/lib/{env.stdlib.name}",
            filter=lambda info: None if Path(info.name).parts[3:4] and Path(info.name).parts[3] in skip else info)


def problem(env: Environment) -> Optional[str]:
    """Why the environment's archive cannot be used (missing, or damaged: its sha256 is not the one recorded), or
    None. Reads it whole."""
    try:
        wanted = env.checksum.read_text().strip()
        with open(env.archive, "rb") as file:
            found = Hashing(file).rest()
    except FileNotFoundError:
        return "missing"
    return None if found == wanted else _damaged(found, wanted)


def ensure(env: Environment) -> Optional[str]:
    """The archive checked, and packed where it cannot be used: why it was packed, or None where it could be."""
    why = problem(env)
    if why is not None:
        pack(env)
    return why


def unpack(archive: Path, checksum: str, folder: nodelocal.Folder, env: Environment) -> Path:
    """A node's part: the environment's copy in ``folder`` (this user's private node-local one), unpacked from
    ``archive`` where this version is not there yet; its path. Tasks that share the folder (jobs starting together,
    the virtual nodes of one machine) unpack it once: the others wait for it under a lock in the folder. OSError where
    there is no room, ValueError where the archive's bytes are not those the checksum names (nothing of it is
    left)."""
    lock = os.open(_lock(env.name), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder.fd)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if folder.kind(env.name) != "dir":
            _unpack(archive, checksum, folder, env)
    finally:
        os.close(lock)
    return folder.path / env.name


def _lock(name: str) -> str:
    return f".{name}.lock"


def _unpack(archive: Path, checksum: str, folder: nodelocal.Folder, env: Environment) -> None:
    size, free = archive.stat().st_size, _free(folder)
    if free < size:
        raise OSError(errno.ENOSPC, f"No space left on device: {size / 1e9:.2f} GB to unpack, {free / 1e9:.2f} GB "
                                    "free", str(folder.path))
    part = f".{env.name}.{os.getpid()}.part"
    shutil.rmtree(folder.path / part, ignore_errors=True)  # this process's own, left by an unpacking cut short
    with folder.folder(part):
        pass
    try:
        with open(archive, "rb") as file:
            reader = Hashing(file)
            with tarfile.open(fileobj=reader, mode="r|") as tar:  # type: ignore[call-overload]
                tar.extractall(folder.path / part, members=_inside(tar), **FILTER)
            found = reader.rest()
        if found != checksum:
            raise ValueError(f"{archive}: {_damaged(found, checksum)}")
        if env.stdlib is not None:
            _name_base(folder.path / part, folder.path / env.name)
        os.rename(part, env.name, src_dir_fd=folder.fd, dst_dir_fd=folder.fd)
    except BaseException:
        shutil.rmtree(folder.path / part, ignore_errors=True)
        raise


def _damaged(found: str, wanted: str) -> str:
    return f"damaged (its sha256 is {found[:12]}..., not the {wanted[:12]}... recorded)"


def _inside(tar: tarfile.TarFile):
    """The archive's members, refused where one would land outside the folder it is unpacked in (Pythons before
    3.11.4 have no extraction filter to do it)."""
    for member in tar:
        if member.name.startswith("/") or ".." in Path(member.name).parts:
            raise ValueError(f"{member.name!r} is outside the environment")
        yield member


def _free(folder: nodelocal.Folder) -> int:
    info = os.statvfs(folder.fd)
    return info.f_bavail * info.f_frsize


def _name_base(unpacked: Path, final: Path) -> None:
    """The staged venv's ``pyvenv.cfg`` naming its staged base interpreter's folder (``home``), where it will be."""
    config = unpacked / "pyvenv.cfg"
    lines = [f"home = {final / BASE / 'bin'}" if line.split("=")[0].strip() == "home" else line
             for line in config.read_text().splitlines()]
    config.write_text("\n".join(lines) + "\n")


def remove_unused(folder: nodelocal.Folder, keep: str) -> None:
    """Remove this user's copies of other versions in ``folder`` that no process of this user's on the node runs from
    and that are older than :data:`GRACE_S`; only folders of this user's, by name, never through a link."""
    for name in folder.older(STAGED, "dir", GRACE_S):
        if name != keep and not running_from(str(folder.path / name)):
            shutil.rmtree(folder.path / name, ignore_errors=True)
    for name in folder.older(LOCK, "file", GRACE_S):  # a version's lock, once its copy is gone or was never made
        if name != _lock(keep) and folder.kind(name[1:-len(".lock")]) is None:
            folder.remove(name)


def running_from(path: str) -> bool:
    """Whether a process of this user's on the node runs an interpreter under ``path`` (its first argument)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0].decode(errors="replace")
        except OSError:
            continue
        if argv0.startswith(path + "/"):
            return True
    return False


def main(argv: Sequence[str]) -> int:
    """``pack``: this Python's environment packed where this version's archive is missing or damaged."""
    args: List[str] = list(argv)
    if args != ["pack"]:
        print("usage: python -m launcher.job.stage_env pack", file=sys.stderr)
        return 2
    try:
        env = this_environment()
        ensure(env)
    except ValueError as err:  # no environment of its own: says what to do
        print(err, file=sys.stderr)
        return 1
    except (OSError, tarfile.TarError) as err:
        print(f"the tasks' environment {sys.prefix} could not be packed: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
