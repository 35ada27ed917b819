"""Who may read a run's files: its owner only, unless the run names a group to share them with.

A run directory holds the config, logs, metrics, checkpoints (the weights) and the sbatch script; on a
shared cluster none of it is for other users. So run directories are 0700 and their files 0600. With
``share_group`` set, they are 0750 and 0640, with that group (the directory setgid, so everything created
inside takes the group), and the run root gets the group too, so that its members can reach the runs.

Files are created by many hands: the launcher, Slurm (the job's output files), and on the nodes torch
(checkpoints), logging and training. A umask reaches all of them: the launcher makes a run's files and submits
its jobs inside one writer, :class:`RunWriter`, which owns the umask and the group (sbatch passes the umask to the
job as SLURM_UMASK), and the batch script sets it again before anything runs (a resubmission from the node
inherits it). Files the launcher writes later take their directory's mode (file_mode). Secrets
(launcher/job/secret_store.py) are never shared: their store stays 0700/0600.
"""
from __future__ import annotations

import grp
import os
import stat
from pathlib import Path
from typing import Optional

PRIVATE_UMASK = 0o077  # dirs 0700, files 0600
SHARED_UMASK = 0o027  # dirs 0750, files 0640 (the group reads, others nothing)
PRIVATE_DIR = 0o700
SHARED_DIR = 0o2750  # setgid: what is created inside takes the directory's group


def umask_for(share_group: Optional[str]) -> int:
    return SHARED_UMASK if share_group else PRIVATE_UMASK


def umask_line(share_group: Optional[str]) -> str:
    """The batch script's shell line that sets the run's umask before anything of the job runs."""
    return f"umask {umask_for(share_group):04o}"


def group_id(share_group: Optional[str]) -> Optional[int]:
    """The id of the group to share with (None: private). A ValueError in one line when there is no such
    group, or this user may not give files to it (not a member)."""
    if not share_group:
        return None
    import grp  # only where a run is shared

    try:
        gid = grp.getgrnam(share_group).gr_gid
    except KeyError:
        raise ValueError(f"share_group={share_group!r} is not a group on this machine; "
                         f"use one of your groups: {', '.join(my_groups())}") from None
    if os.geteuid() != 0 and gid not in os.getgroups() and gid != os.getegid():
        raise ValueError(f"share_group={share_group!r}: you are not in that group; "
                         f"use one of yours: {', '.join(my_groups())}")
    return gid


def my_groups() -> list[str]:
    names = []
    for gid in sorted({os.getegid(), *os.getgroups()}):
        try:
            names.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            names.append(str(gid))
    return names


class RunWriter:
    """The one writer of a run's files, which owns their umask and group: every step that makes a run's files or
    submits its job (a launch, a retry, ``launcher resume``) runs inside ``with RunWriter(share_group, root)``. Inside
    it, files and directories (and the jobs submitted, which inherit the umask) are made under the run's umask; on
    entry the run root, when given, is made reachable by the group (:func:`share_root`); a run directory made inside
    it is given the run's mode and group by :meth:`own`. One inside another (a launch submits a run's job as a
    retry does) sets the same umask, and puts back the outer one's when it ends."""

    def __init__(self, share_group: Optional[str], root: Optional[Path] = None) -> None:
        self.share_group, self.root = share_group, root
        self._previous = 0

    def __enter__(self) -> "RunWriter":
        if self.root is not None:
            share_root(self.root, self.share_group)
        self._previous = os.umask(umask_for(self.share_group))
        return self

    def __exit__(self, *exc: object) -> None:
        os.umask(self._previous)

    def own(self, run_dir: Path) -> Path:
        """Give a run directory made inside this writer the run's mode and group (:func:`protect_dir`)."""
        protect_dir(run_dir, self.share_group)
        return run_dir


def protect_dir(path: Path, share_group: Optional[str]) -> None:
    """Give a directory the run's mode: private, or shared with the group (setgid, so its contents follow)."""
    gid = group_id(share_group)
    if gid is None:
        os.chmod(path, PRIVATE_DIR)
        return
    if os.stat(path).st_gid != gid:
        os.chown(path, -1, gid)
    os.chmod(path, SHARED_DIR)


def share_root(root: Path, share_group: Optional[str]) -> None:
    """Let the group reach (and list) the run root, when a run is shared and this user owns the root."""
    gid = group_id(share_group)
    if gid is None or os.stat(root).st_uid != os.geteuid():
        return
    if os.stat(root).st_gid != gid:
        os.chown(root, -1, gid)
    os.chmod(root, stat.S_IMODE(os.stat(root).st_mode) | 0o050 | stat.S_ISGID)


def file_mode(directory: Path) -> int:
    """The mode of a new file in ``directory``: the directory's read and write bits (0700 gives 0600, 0750
    gives 0640), so files the launcher adds later match those created under the run's umask."""
    try:
        return stat.S_IMODE(os.stat(directory).st_mode) & 0o666
    except OSError:
        return 0o600
