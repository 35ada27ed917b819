"""The laptop's launcher on the cluster: its code shipped once per content hash, and run there.

Every remote action is this machine's own code (``launcher/`` with ``launcher/train/``, and ``conf/``: what a
run's frozen copy holds, launcher/submit/freeze.py) run on the cluster with ``cluster.python``, so the two ends
never disagree on a format. The code goes to ``~/.launcher/code/HASH/`` there, named by the hash of its
contents: a command first tries it in place (one round trip) and only when the cluster lacks it sends a tar
over the same connection and tries again. Nothing is shipped when nothing changed.
"""
from __future__ import annotations

import functools
import hashlib
import io
import json
import shlex
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Union

from launcher.errors import LaunchError
from launcher.remote.ssh import Remote, Stream, run, sink, stream
from launcher.core.rundir import SOURCE_ROOT, frozen_files

CODE_HOME = ".launcher/code"  # under the remote user's home, where ssh's commands start
MISSING = 97  # the exit status that says the cluster lacks this code


@functools.lru_cache(maxsize=1)
def code_files() -> Dict[str, bytes]:
    """The files shipped, by path relative to the code's root (the checkout, or site-packages)."""
    return {path.relative_to(SOURCE_ROOT).as_posix(): path.read_bytes() for path in frozen_files(SOURCE_ROOT)}


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    digest = hashlib.sha256()
    for rel, data in code_files().items():
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()[:20]


def code_tar() -> bytes:
    """The code as a gzipped tar (contents only, no owners: the cluster's user owns what it unpacks)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for rel, data in code_files().items():
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def code_path() -> str:
    return f"{CODE_HOME}/{code_hash()}"


def ship(remote: Remote) -> None:
    """Unpack this code on the cluster (into a temporary directory renamed into place: a copy is whole or absent)."""
    target = code_path()
    script = (f"set -e; mkdir -p {CODE_HOME}; t=$(mktemp -d {CODE_HOME}/.incoming.XXXXXX); tar -xzf - -C \"$t\"; "
              f"chmod -R u+rwX,go-w \"$t\"; mv -T \"$t\" {target} 2>/dev/null || rm -rf \"$t\"")
    proc = run(remote, ["sh", "-c", script], input=code_tar(), timeout=300)
    if proc.returncode != 0:
        raise LaunchError(f"cluster {remote.cluster}: could not unpack the launcher's code into ~/{target}: "
                          f"{last_line(proc.stderr)}")


def launcher_argv(remote: Remote, module: str, args: Sequence[str]) -> List[str]:
    """The command that runs ``python -m MODULE ARGS`` there with this code, or exits MISSING without it."""
    python = remote.python or "python3"
    # Unbuffered: its output is a pipe to ssh, and `logs --follow` must show each line as it comes. Its tables fit
    # this terminal (COLUMNS, else this one's width; neither into a pipe: launcher/views/width.py's fallback there).
    columns = shutil.get_terminal_size((0, 0)).columns
    env = {"PYTHONPATH": code_path(), "PYTHONSAFEPATH": "1", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONUNBUFFERED": "1",
           **({"SLURM_CONF": remote.slurm_conf} if remote.slurm_conf else {}),
           **({"LAUNCHER_RUN_ROOT": remote.run_root} if remote.run_root else {}),
           **({"COLUMNS": str(columns)} if columns else {})}
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
    return ["sh", "-c", f'test -d {code_path()} || exit {MISSING}; {exports} exec "$@"', "sh", python, "-m", module,
            *args]


def run_launcher(remote: Remote, module: str, args: Sequence[str], input: Union[bytes, str, None] = None,
                 timeout: Optional[float] = 300, capture: bool = True):
    """Run ``python -m MODULE ARGS`` on the cluster with this machine's launcher code, shipping it first when the
    cluster lacks it. Returns the completed process."""
    proc = run(remote, launcher_argv(remote, module, args), input=input, timeout=timeout, capture=capture)
    if proc.returncode == MISSING:
        ship(remote)
        proc = run(remote, launcher_argv(remote, module, args), input=input, timeout=timeout, capture=capture)
    if proc.returncode == 127 or (capture and "No such file or directory" in (proc.stderr or "")
                                  and proc.returncode in (126, 127)):
        raise LaunchError(f"cluster {remote.cluster}: cluster.python={remote.python or 'python3'} cannot be run "
                          "there; set it to an interpreter with this package's dependencies")
    return proc


def stream_launcher(remote: Remote, args: Sequence[str]) -> Stream:
    """``python -m launcher ARGS`` on the cluster with its standard output a pipe read line by line (its standard
    error this process's own), shipping the code first when the cluster lacks it."""
    ready = run(remote, ["sh", "-c", f"test -d {code_path()} || exit {MISSING}"], timeout=max(30.0, remote.timeout_s))
    if ready.returncode == MISSING:
        ship(remote)
    return stream(remote, launcher_argv(remote, "launcher", args))


def call(remote: Remote, action: str, payload: Optional[Dict[str, Any]] = None, timeout: float = 300) -> Any:
    """Ask the cluster's agent (launcher/remote/agent.py) to do ``action`` with ``payload``; its JSON answer.
    A refusal there (a one-line ``error: ...``) is raised here as the same LaunchError."""
    proc = run_launcher(remote, "launcher.remote.agent", [action], input=json.dumps(payload or {}), timeout=timeout)
    if proc.returncode != 0:
        raise LaunchError(remote_error(remote, proc.stderr))
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise LaunchError(f"cluster {remote.cluster}: the launcher there answered {last_line(proc.stdout)!r}, "
                          "not JSON") from None


def remote_error(remote: Remote, stderr: str) -> str:
    """The cluster's one-line error, as it said it (``error:`` removed), or its last line."""
    line = last_line(stderr)
    if line.startswith("error: "):
        return line[len("error: "):]
    if "ModuleNotFoundError" in (stderr or "") or "ImportError" in (stderr or ""):
        return (f"cluster {remote.cluster}: cluster.python={remote.python or 'python3'} lacks this package's "
                f"dependencies ({line}); pip install slurm-gpt-launcher there")
    return f"cluster {remote.cluster}: {line}"


def last_line(text: Optional[str]) -> str:
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


# Run there with cluster.python: a directory (its path as a command there would take it, ~ expanded) as a tar
# stream on standard output.
_PACK = ("import os, sys, tarfile; path = os.path.abspath(os.path.expanduser(sys.argv[1])); "
         "archive = tarfile.open(fileobj=sys.stdout.buffer, mode='w|'); "
         "archive.add(path, arcname=os.path.basename(path)); archive.close()")


def fetch_dir(remote: Remote, path: str, into: Path) -> Path:
    """Copy the directory ``path`` on the cluster into the local directory ``into`` over the same connection, as
    a stream (never held whole); returns the copy."""
    into.mkdir(parents=True, exist_ok=True)
    proc = stream(remote, [remote.python or "python3", "-c", _PACK, path], text=False)
    assert proc.stdout is not None
    top = None
    try:
        top = unpack(proc.stdout, into)
    except tarfile.TarError:
        pass  # what went wrong there is its exit status, and its words on standard error
    except BaseException:
        proc.kill()  # nothing reads the stream any more: the packer there would wait on a full pipe for ever
        raise
    finally:
        status = proc.wait()
    if status or top is None:
        raise LaunchError(f"cluster {remote.cluster}: could not copy {path} from there (exit status {status})")
    return into / top


def send_files(remote: Remote, folder: Path, names: Sequence[str], into: str) -> None:
    """Copy the files and folders ``names`` of the local ``folder`` into the folder ``into`` on the cluster over
    the same connection, as a tar stream (never held whole: a checkpoint may be large)."""
    proc = sink(remote, ["tar", "-x", "-f", "-", "-C", into])
    assert proc.stdin is not None
    try:
        with tarfile.open(fileobj=proc.stdin, mode="w|") as archive:
            for name in names:
                archive.add(folder / name, arcname=name)
        proc.stdin.close()
    except BrokenPipeError:
        pass  # the unpacker there ended: its exit status and its words say why
    finally:
        status, said = proc.wait(), proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if status:
        raise LaunchError(f"cluster {remote.cluster}: could not copy {folder.name} into {into} there: "
                          f"{last_line(said)}")


def unpack(source: BinaryIO, into: Path) -> Optional[str]:
    """Write a tar stream's folders and files under ``into`` as plain data; the name of its first member.

    Anything else (a link, a device, a path out of ``into``) is refused in one line. This is tarfile's own
    ``filter="data"``, written out because Python 3.11.2 (Debian 12's python3) and 3.10 before 3.10.12 lack it."""
    top = None
    with tarfile.open(fileobj=source, mode="r|") as archive:
        for member in archive:
            name = PurePosixPath(member.name)
            if not name.parts or name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
                raise LaunchError(f"refused to copy {member.name!r}: only files and folders inside the copied "
                                  "folder are copied")
            top = top or name.parts[0]
            target = into.joinpath(*name.parts)
            if member.isdir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with archive.extractfile(member) as data, open(target, "wb") as out:
                shutil.copyfileobj(data, out)
    return top
