"""Where secrets are kept (``$LAUNCHER_HOME/secrets``, 0700) and how a task gets them: stored, listed and
deleted for ``launcher secrets`` (launcher/commands/secrets.py), injected into each task's environment by
the task entry (launcher/job/entry.py, :func:`inject`) before it imports launcher/train/.

Storage
    ``$LAUNCHER_HOME/secrets/`` (default ``~/.launcher/secrets/``), a 0700 directory. Each secret is
    two 0600 files: ``<name>.value`` (the raw value) and ``<name>.json`` (name, kind, variable, created
    time; never the value). Both are written to a temporary file created 0600 by ``mkstemp`` in the same
    directory, fsynced and renamed into place, so no reader ever sees a partial or world-readable file.
    The value is written first and the metadata last: a secret exists once its ``.json`` does, and
    ``delete`` removes the ``.json`` first. On a cluster the home directory is shared with the compute
    nodes, which is how tasks read the store. The store is written only in a launcher home no other user
    could change, and only when it is this user's own directory, not a symlink or a directory another user
    planted in a sticky home (launcher/core/safepath.py): its files would be theirs to read or replace.

Injection
    ``launcher.job.entry.TrainTask`` records the store's absolute path when the run is submitted (so the
    ``LAUNCHER_HOME`` of the submitting shell decides) and, on every task, calls :func:`inject` before it
    imports ``train``: ``env`` values are put into ``os.environ``; ``file`` and ``ssh`` variables get the
    path of the stored 0600 ``.value`` file itself, read in place (no copies are left on node-local
    disks). The task prints one line naming the variables it set, never a value. Secrets are read when a
    task starts: a secret created, replaced or deleted later affects tasks that start later (including
    requeued ones), and replacing one in place swaps the file a running task's path points at.

    Nothing goes through Slurm: the sbatch script, the job's command line and environment, the run
    directory (config, logs, events, submitit's pickles) hold at most the store's path and the
    variables' names.
"""
from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, MutableMapping, Optional, Sequence

from launcher.core.rundir import launcher_home
from launcher.core.safepath import HOME, UnsafePath, ensure_home, private_dir
from launcher.errors import LaunchError, did_you_mean

KINDS = ("env", "file", "ssh")
DEFAULT_ENV = {"ssh": "SSH_KEY_PATH"}
MAX_BYTES = {"env": 64 * 1024, "file": 1024 * 1024, "ssh": 1024 * 1024}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_MAX_NAME = 128
ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Variables the task, Slurm, submitit, torch.distributed or the dynamic loader rely on.
_RESERVED_VARS = {
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "PWD", "TMPDIR", "LAUNCHER_HOME", "LAUNCHER_RUN_ROOT",
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
    "MASTER_PORT", "CUDA_VISIBLE_DEVICES",
}
_RESERVED_PREFIXES = ("SLURM_", "SUBMITIT_", "LD_", "PYTHON")


@dataclass(frozen=True)
class Secret:
    """A secret's metadata, as stored in ``<name>.json`` and listed; never its value."""

    name: str
    kind: str
    env: str
    created: float


def secrets_dir(environ: Optional[MutableMapping[str, str]] = None) -> Path:
    """The store: ``$LAUNCHER_HOME/secrets`` (default ``~/.launcher/secrets``), as an absolute path."""
    return launcher_home(environ) / "secrets"


def value_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.value"


def meta_path(directory: Path, name: str) -> Path:
    return directory / f"{name}.json"


def load_all(directory: Path) -> List[Secret]:
    """Every secret in the store, by name; unreadable or malformed metadata files are skipped."""
    found = []
    try:
        entries = list(directory.glob("*.json"))
    except OSError:
        return []
    for path in entries:
        try:
            data = json.loads(path.read_text())
            secret = Secret(name=str(data["name"]), kind=str(data["kind"]), env=str(data["env"]),
                            created=float(data["created"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if secret.kind in KINDS and path.name == f"{secret.name}.json" and ENV_VAR.fullmatch(secret.env):
            found.append(secret)
    return sorted(found, key=lambda s: (s.name.lower(), s.name))


# --- checks -------------------------------------------------------------------------------------------


def check_name(name: str) -> None:
    if len(name) > _MAX_NAME or not _NAME.fullmatch(name):
        raise LaunchError(
            f"invalid secret name {name!r}: start with a letter or _, then letters, digits, . _ -; "
            f"at most {_MAX_NAME} characters"
        )


def check_env_var(var: str) -> None:
    if not ENV_VAR.fullmatch(var):
        raise LaunchError(f"invalid environment variable name {var!r}: use letters, digits and _, not a digit first")
    if var in _RESERVED_VARS or var.startswith(_RESERVED_PREFIXES):
        raise LaunchError(f"environment variable {var} is reserved for the launcher, Slurm or the runtime; "
                          "choose another with --env")


def check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise LaunchError(f"unknown secret kind {kind!r}{did_you_mean(kind, KINDS)}; kinds: {', '.join(KINDS)}")


def check_value(kind: str, value: bytes, origin: str) -> bytes:
    """The value as it will be stored; raises LaunchError if it cannot be a secret of this kind."""
    if kind == "env":
        if value.endswith(b"\r\n"):
            value = value[:-2]
        elif value.endswith(b"\n"):
            value = value[:-1]
    if not value:
        raise LaunchError(f"the value from {origin} is empty")
    if len(value) > MAX_BYTES[kind]:
        raise LaunchError(f"the value from {origin} is {len(value)} bytes; {kind} secrets hold at most "
                          f"{MAX_BYTES[kind] // 1024} KiB")
    if kind == "env":
        if b"\0" in value:
            raise LaunchError(f"the value from {origin} contains a NUL byte, which an environment variable cannot hold")
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            raise LaunchError(f"the value from {origin} is not UTF-8 text; use a file secret for binary data") from None
    if kind == "ssh":
        text = value.lstrip()
        if not (text.startswith(b"-----BEGIN ") and b"PRIVATE KEY-----" in text):
            public = text.startswith((b"ssh-", b"ecdsa-"))
            hint = " (that is a public key; pass the file without .pub)" if public else ""
            raise LaunchError(f"the value from {origin} is not an SSH private key{hint}")
        if not value.endswith(b"\n"):
            value += b"\n"  # OpenSSH refuses a key file without its final newline
    return value


# --- store --------------------------------------------------------------------------------------------


def create(directory: Path, name: str, kind: str, env: str, value: bytes, force: bool = False,
           origin: str = "input") -> Secret:
    """Check everything, then store the secret (atomically, 0600 in a 0700 directory)."""
    check_name(name)
    check_kind(kind)
    check_env_var(env)
    check_free(directory, name, env, force)
    value = check_value(kind, value, origin)
    secret = Secret(name=name, kind=kind, env=env, created=time.time())
    _ensure_dir(directory)
    _write_private(value_path(directory, name), value)
    _write_private(meta_path(directory, name), (json.dumps(asdict(secret), indent=2, sort_keys=True) + "\n").encode())
    return secret


def delete(directory: Path, names: Sequence[str]) -> List[str]:
    """Remove the named secrets; every name must exist, or nothing is removed."""
    known = [secret.name for secret in load_all(directory)]
    for name in names:
        if name not in known:
            raise LaunchError(f"no secret named {name!r}{did_you_mean(name, known)}; "
                              f"secrets: {', '.join(known) or 'none'}")
    _ensure_dir(directory)  # the store to remove from is ours, not a symlink another user planted
    removed = []
    for name in dict.fromkeys(names):
        for path in (meta_path(directory, name), value_path(directory, name)):  # metadata first: gone at once
            try:
                path.unlink()
            except FileNotFoundError:
                pass
        removed.append(name)
    return removed


def inject(directory: Path, environ: Optional[MutableMapping[str, str]] = None) -> List[str]:
    """Set every secret's variable in ``environ`` (default ``os.environ``); return the variables set.

    ``env`` secrets get their value; ``file`` and ``ssh`` secrets the path of their stored 0600 file.
    A secret that vanishes or cannot be read meanwhile is skipped with a warning naming it.
    """
    environ = os.environ if environ is None else environ
    injected = []
    for secret in load_all(directory):
        path = value_path(directory, secret.name)
        try:
            if secret.kind == "env":
                environ[secret.env] = path.read_bytes().decode("utf-8")
            else:
                with open(path, "rb"):  # readable now, by this user
                    pass
                environ[secret.env] = str(path)
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else type(err).__name__
            print(f"launcher: warning: secret {secret.name!r} not injected ({reason})", file=sys.stderr, flush=True)
            continue
        injected.append(secret.env)
    return injected


def check_free(directory: Path, name: str, env: str, force: bool) -> None:
    for other in load_all(directory):
        if other.name == name and not force:
            raise LaunchError(f"secret {name!r} already exists; add --force to replace it")
        if other.name != name and other.env == env:
            raise LaunchError(f"environment variable {env} is already set by secret {other.name!r}; "
                              "choose another with --env, or delete that one")


def _ensure_dir(directory: Path) -> None:
    """The store directory, created (with its parents) and made 0700 (never wider, even while created), in
    a launcher home no other user can change, and never through a symlink (launcher/core/safepath.py)."""
    try:
        ensure_home(directory.parent)
        private_dir(directory, "secrets store", HOME)
    except UnsafePath as err:
        raise LaunchError(str(err)) from None


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` atomically: a temporary file created 0600 (mkstemp), fsynced, renamed into place."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


# ----------------------------------------------------------------------------------------------
# An object store's credentials (data.path=s3://..., launcher/core/store.py)

RUN_CREDENTIALS = "runs"  # a folder of the store: the credentials a launch captured, one 0600 file per run


def store_secrets(directory: Path, environ: Optional[MutableMapping[str, str]] = None) -> List[str]:
    """Put the store's AWS variables (``AWS_ACCESS_KEY_ID``, ``AWS_SHARED_CREDENTIALS_FILE``, ...) that
    ``environ`` (default ``os.environ``) does not set into it, so that the launch checks a bucket with the
    credentials its tasks will have; returns the variables set."""
    environ = os.environ if environ is None else environ
    found: dict = {}
    inject(directory, found)
    added = [name for name in found if name.startswith("AWS_") and name not in environ]
    for name in added:
        environ[name] = found[name]
    return added


def keep_run_credentials(directory: Path, run_dir: Path, credentials: bytes) -> Path:
    """Keep the object store's credentials the launch found in its shell for the run's tasks, in a 0600 file of
    the store (``runs/<run>.json``): what launcher/job/entry.py points the tasks at."""
    _ensure_dir(directory)
    folder = directory / RUN_CREDENTIALS
    private_dir(folder, "secrets store", HOME)
    path = run_credentials(directory, run_dir)
    _write_private(path, credentials)
    return path


def run_credentials(directory: Path, run_dir: Path) -> Path:
    return directory / RUN_CREDENTIALS / f"{Path(run_dir).name}.json"
