"""The shards of a dataset in a bucket (``data.path=s3://...``), as a node's ranks read them: each shard downloaded
once per node into a node-local cache, ahead of the steps that need it, and read from there through ``np.memmap``
like a shard on disk.

The cache is a private folder of this user's on the node (launcher/core/nodelocal.py: made 0700, opened without
following a link, owner checked), ``data.stream_cache_dir`` or the node's temporary directory, one folder per
dataset (its fingerprint), shared by every rank and every job of the user on the node. No shared memory and no
state that outlives a process decides anything: the node's ranks agree through ``flock``, which the kernel drops
with the process that held it, so a job killed at any moment leaves nothing that blocks or misleads the next.

- One rank downloads a shard: it holds the shard's lock file exclusively, writes the bytes to a fresh name made
  with ``O_EXCL``, checks their CRC-32 against the dataset's metadata and renames the file into place; the node's
  other ranks wait on the same lock and then find the file. What a killed download leaves (a ``.part`` file) is
  removed by the next downloader of that shard, which holds the lock.
- A rank pins the shards its next steps need with a shared ``flock`` on each file; the cache's size is held to
  ``data.stream_cache_gb`` by removing the least recently used shards that no rank pins (a pinned one answers
  ``LOCK_EX | LOCK_NB`` with EWOULDBLOCK).
- Reading ahead: the shards of the window of the sample order being read and of the next one
  (launcher/train/data.py ``WindowSampler``) are fetched by a few threads (``data.stream_connections`` per node,
  shared among its ranks) while the current step trains; a thread passes over a shard another rank of the node is
  downloading, so the node's ranks fetch different shards side by side.
- A node keeps the folders of the datasets its jobs read; each job holds a shared lock on its dataset's, and one
  that opens its cache removes the folders no job holds (:func:`cache_folder`).
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import tempfile
import threading
import time
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from launcher.core import nodelocal
from launcher.core.config import DataConfig
from launcher.core.dataset import DatasetError
from launcher.core.store import Location, Store

PART = ".part"


class Closed(Exception):
    """A download stopped because its cache was closed."""


@dataclass
class Counters:
    """What this rank's reading cost: bytes it downloaded, shards it found in the cache (``hits``) or fetched
    (``fetched``), and the seconds its steps waited for a shard."""

    downloaded: int = 0
    hits: int = 0
    fetched: int = 0
    wait_s: float = 0.0


IN_USE = ".in-use"  # each dataset folder's: every cache open on it holds a shared flock


def cache_folder(data: DataConfig, fingerprint: str) -> Tuple[nodelocal.Folder, int]:
    """This dataset's folder in the node's cache (``data.stream_cache_dir``, made private if missing, else
    ``launcher-<uid>/shards`` in the node's temporary directory), and a descriptor holding its shared ``in use``
    lock. The folders of other datasets no process uses any more are removed first: the node keeps the shards of
    the datasets its jobs read, each within ``data.stream_cache_gb``, and a later job of the same dataset finds
    them. Taken when another user has the name."""
    if data.stream_cache_dir:
        top = nodelocal.Folder.open(Path(os.path.expanduser(data.stream_cache_dir)))
    else:
        top = nodelocal.Folder.open(Path(tempfile.gettempdir()) / nodelocal.own_name())
    with top:
        shards = top.folder("shards")
    with shards:
        for name in shards.names():
            if name != fingerprint and shards.kind(name) == "dir":
                _remove_unused(shards, name)
        folder = shards.folder(fingerprint)
    fd = os.open(IN_USE, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder.fd)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return folder, fd


def _remove_unused(shards: nodelocal.Folder, name: str) -> None:
    """Remove another dataset's folder, unless a process holds its ``in use`` lock (then it stays whole)."""
    try:
        folder = shards.folder(name, create=False)
    except (nodelocal.Taken, OSError):
        return
    with folder:
        try:
            fd = os.open(IN_USE, os.O_RDONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=folder.fd)
        except OSError:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return
        try:
            for entry in folder.names():
                if folder.kind(entry) == "file":
                    folder.remove(entry)
        finally:
            os.close(fd)
    shards.remove_folder(name)


@dataclass
class ShardCache:
    """A dataset's shards (``meta``'s records) in ``folder``, fetched from ``location`` by ``store``."""

    store: Store
    location: Location
    shards: List[Dict[str, Any]]
    folder: nodelocal.Folder
    limit_bytes: int
    threads: int = 2
    in_use: int = -1  # the descriptor of the folder's shared ``in use`` lock (cache_folder), closed with the cache
    counters: Counters = field(default_factory=Counters)
    _pins: Dict[int, int] = field(default_factory=dict)  # shard -> the descriptor holding its shared lock
    _maps: Dict[int, np.ndarray] = field(default_factory=dict)
    _pending: Dict[int, Future] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _closing: threading.Event = field(default_factory=threading.Event)
    _pool: Optional[ThreadPoolExecutor] = None

    def array(self, index: int, dtype: str) -> np.ndarray:
        """Shard ``index`` as an array of tokens, from the cache; fetched now (and waited for) if it is not."""
        mapped = self._maps.get(index)
        if mapped is not None:
            return mapped
        began = time.perf_counter()
        future = self._pending.pop(index, None)
        if future is not None:
            future.result()
        while True:
            try:
                fd = self._pin(index)
                break
            except FileNotFoundError:  # not fetched yet, or removed by another rank since
                self._fetch(index)
        self.counters.wait_s += time.perf_counter() - began
        with os.fdopen(os.dup(fd), "rb") as handle:
            mapped = np.memmap(handle, dtype=dtype, mode="r")
        self._maps[index] = mapped
        return mapped

    def keep(self, needed: List[int]) -> None:
        """The shards the next steps read, in the order they are read: fetched in the background if missing (a
        shard another rank of the node is downloading is passed over, so that the node's ranks fetch different
        shards at once); every other shard this rank held is let go (unpinned, unmapped), so the cache may remove
        it."""
        wanted = set(needed)
        for index in [i for i in self._pins if i not in wanted]:
            self._maps.pop(index, None)
            os.close(self._pins.pop(index))
        for index in [i for i in self._pending if i not in wanted and self._pending[i].done()]:
            del self._pending[index]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="shards")
        for index in needed:
            if index not in self._pins and index not in self._pending:
                self._pending[index] = self._pool.submit(self._fetch, index, False)

    def close(self) -> None:
        """Let go of every shard; downloads under way stop at their next chunk (a failing rank does not wait for
        them, nor does its interpreter's exit)."""
        self._closing.set()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._maps.clear()
        for fd in self._pins.values():
            os.close(fd)
        self._pins.clear()
        if self.in_use >= 0:
            os.close(self.in_use)
        self.folder.close()

    # ------------------------------------------------------------------------------------------

    def _fetch(self, index: int, wait: bool = True) -> None:
        """Shard ``index`` is in the cache when this returns (downloaded by this rank or another of the node);
        without ``wait``, it may also be on its way, by another rank, which holds its lock."""
        name = self.shards[index]["file"]
        if self._present(name):
            self._touch(name)
            with self._lock:
                self.counters.hits += 1
            return
        with self._held(f"{name}.lock", wait) as held:
            if not held:
                return
            if self._present(name):  # another rank of the node fetched it while this one waited
                with self._lock:
                    self.counters.hits += 1
                return
            self._make_room(self.shards[index]["bytes"])
            self._download(index, name)

    def _download(self, index: int, name: str) -> None:
        record = self.shards[index]
        part = f"{name}{PART}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(part, dir_fd=self.folder.fd)  # a killed download's: this process holds the shard's lock
        fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600,
                     dir_fd=self.folder.fd)
        crc = 0
        try:
            with os.fdopen(fd, "wb") as out:
                def write(chunk: bytes) -> None:
                    nonlocal crc
                    if self._closing.is_set():
                        raise Closed(f"{self.location.url(name)}: the cache was closed")
                    out.write(chunk)
                    crc = zlib.crc32(chunk, crc)
                done = self.store.download(self.location, name, record["bytes"], write)
            if crc != record["crc32"]:
                raise DatasetError(f"{self.location.url(name)} has changed since the dataset was prepared: its CRC-32 "
                                   "is not the one metadata.json records; prepare or upload the dataset again")
            os.replace(part, name, src_dir_fd=self.folder.fd, dst_dir_fd=self.folder.fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(part, dir_fd=self.folder.fd)
            raise
        with self._lock:
            self.counters.downloaded += done
            self.counters.fetched += 1

    def _present(self, name: str) -> bool:
        return self.folder.kind(name) == "file"

    def _touch(self, name: str) -> None:
        """Mark a shard used now (the cache removes the least recently used first)."""
        with contextlib.suppress(OSError):
            os.utime(name, dir_fd=self.folder.fd, follow_symlinks=False)

    def _pin(self, index: int) -> int:
        """A descriptor of shard ``index``'s file holding a shared lock on it: no rank removes it while held."""
        if index in self._pins:
            return self._pins[index]
        name = self.shards[index]["file"]
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.folder.fd)
        info = os.fstat(fd)
        if info.st_uid != os.geteuid() or info.st_size != self.shards[index]["bytes"]:
            os.close(fd)
            raise DatasetError(f"{self.folder.path / name} in the node's shard cache is not the shard it should be "
                               "(another user's, or another size): not read")
        fcntl.flock(fd, fcntl.LOCK_SH)
        self._pins[index] = fd
        self._touch(name)
        return fd

    @contextlib.contextmanager
    def _held(self, name: str, wait: bool):
        """The lock file ``name`` held exclusively (yields True); without ``wait``, False at once when another
        process holds it."""
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=self.folder.fd)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
            except BlockingIOError:
                yield False
                return
            yield True
        finally:
            os.close(fd)

    def _make_room(self, size: int) -> None:
        """Remove the least recently used shards no rank pins until ``size`` more bytes fit in the limit."""
        files = []
        for entry in self.folder.names():
            if entry.endswith(".bin"):
                with contextlib.suppress(OSError):
                    info = os.stat(entry, dir_fd=self.folder.fd, follow_symlinks=False)
                    files.append((info.st_mtime, entry, info.st_size))
        used = sum(f[2] for f in files)
        for _, entry, bytes_ in sorted(files):
            if used + size <= self.limit_bytes:
                return
            if self._evict(entry):
                used -= bytes_

    def _evict(self, entry: str) -> bool:
        """Remove the shard file ``entry`` unless a rank pins it; whether it went."""
        try:
            fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self.folder.fd)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.unlink(entry, dir_fd=self.folder.fd)
            return True
        except OSError:  # EWOULDBLOCK: a rank pins it
            return False
        finally:
            os.close(fd)
