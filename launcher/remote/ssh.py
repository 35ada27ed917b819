"""The system's OpenSSH client, one ControlMaster per cluster: how the launcher reaches a cluster over SSH.

Not a Python SSH library: OpenSSH reads the user's ``~/.ssh/config`` whole (ProxyJump, agents, hardware keys,
certificates, host-key policy), which partial re-implementations do not. The first command to a cluster opens a
master connection in the background (``ControlMaster=auto``, ``ControlPersist``); every later one rides it in a few
milliseconds instead of a handshake of 0.5-2 s. Every command runs with ``BatchMode=yes``: it never prompts, so a
cluster whose login needs a password or a second factor is opened once, interactively, by ``launcher login
CLUSTER``, and a command that finds no master says in one line to do that. Host keys are checked as the user's
config says; the launcher never adds one. ``$LAUNCHER_SSH_CONFIG`` names an ssh_config file to use instead of
``~/.ssh/config`` (``ssh -F``).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

from launcher.core.rundir import launcher_home
from launcher.core.safepath import HOME, UnsafePath, ensure_home, private_dir
from launcher.errors import LaunchError

PERSIST = "10m"  # how long an idle master stays open after the last command
SOCKET_MAX = 100  # a Unix socket's path must fit in 108 bytes
_DEST = re.compile(r"(?:ssh://)?(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\])"
                   r"(?::(?P<port>\d{1,5}))?")


class Unreachable(LaunchError):
    """The cluster's SSH server could not be reached, or would not let us in without a prompt."""


@dataclass(frozen=True)
class Remote:
    """A cluster reached over SSH, as its cluster file describes it."""

    cluster: str  # its name (cluster=NAME), for messages
    ssh: str  # an ~/.ssh/config alias, user@host or ssh://user@host:port
    timeout_s: float = 5.0
    python: Optional[str] = None  # the launcher's interpreter there (cluster.python); default python3
    slurm_conf: Optional[str] = None  # a path there
    run_root: Optional[str] = None  # a path there


def destination(remote: Remote) -> List[str]:
    """``ssh``'s arguments naming the host: ``user@host`` (and ``-p PORT`` from an ssh:// form). A value that
    could be read as an option, or that is not a host, is refused."""
    match = _DEST.fullmatch(remote.ssh)
    if not match or remote.ssh.startswith("-"):
        raise LaunchError(f"cluster.ssh={remote.ssh!r} (cluster {remote.cluster}) is not an SSH destination; use an "
                          "~/.ssh/config alias, user@host or ssh://user@host:port")
    host = f"{match['user']}@{match['host']}" if match["user"] else match["host"]
    return (["-p", match["port"]] if match["port"] else []) + ["--", host]


def control_dir() -> Path:
    """Where the masters' sockets live: ``$LAUNCHER_HOME/ssh`` (0700), or a 0700 directory under the system's
    temporary directory when that path is too long for a socket. Either is this user's own directory, not a
    symlink or another user's directory planted there (launcher/core/safepath.py): whoever controls it could
    stand in for the master and read what the launcher sends."""
    home = launcher_home() / "ssh"
    try:
        if len(str(home)) + 42 <= SOCKET_MAX:
            ensure_home(home.parent)
            private_dir(home, "SSH socket directory", HOME)
            return home
        folder = Path(tempfile.gettempdir()) / f"launcher-ssh-{os.getuid()}"
        private_dir(folder, "SSH socket directory", "set TMPDIR to a directory of your own")
        return folder
    except UnsafePath as err:
        raise LaunchError(str(err)) from None


def options(remote: Remote, batch: bool = True) -> List[str]:
    """The options of every ssh call to ``remote``: its master, no prompt, a connect timeout."""
    given = os.environ.get("LAUNCHER_SSH_CONFIG")
    return [*(["-F", given] if given else []), "-o", "ControlMaster=auto",
            "-o", f"ControlPath={control_dir() / '%C'}", "-o", f"ControlPersist={PERSIST}",
            *(["-o", "BatchMode=yes"] if batch else []), "-o", f"ConnectTimeout={max(1, round(remote.timeout_s))}",
            "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=3"]


def remote_command(remote: Remote, argv: Sequence[str], env: Optional[Dict[str, str]] = None) -> str:
    """The command line the cluster's shell runs: ``argv`` with ``env`` set, every word quoted."""
    words = [f"{name}={value}" for name, value in (env or {}).items()]
    return shlex.join(["env", *words, *argv]) if words else shlex.join(argv)


def run(remote: Remote, argv: Sequence[str], env: Optional[Dict[str, str]] = None,
        input: Union[bytes, str, None] = None, timeout: Optional[float] = 120, capture: bool = True
        ) -> subprocess.CompletedProcess:
    """Run ``argv`` on the cluster; its completed process. With ``capture`` false, its output and standard input
    are this process's own (a command run there as if here). Unreachable, in one line, when ssh itself failed
    (its exit status 255)."""
    cmd = ["ssh", *options(remote), *destination(remote), remote_command(remote, argv, env)]
    text = not isinstance(input, bytes)
    stdin = None if input is not None or not capture else subprocess.DEVNULL
    try:
        proc = subprocess.run(cmd, input=input, capture_output=capture, text=text, timeout=timeout, stdin=stdin)
    except FileNotFoundError:
        raise LaunchError("'ssh' is not installed: install OpenSSH's client to reach cluster "
                          f"{remote.cluster}") from None
    except subprocess.TimeoutExpired:
        raise Unreachable(f"cluster {remote.cluster} ({remote.ssh}) did not answer over ssh in {timeout:.0f} s") \
            from None
    if proc.returncode == 255:
        raise Unreachable(why_unreachable(remote, proc.stderr if capture else ""))
    return proc


Stream = subprocess.Popen  # a command running on the cluster, its output read as it comes


def stream(remote: Remote, argv: Sequence[str], env: Optional[Dict[str, str]] = None, text: bool = True) -> Stream:
    """Start ``argv`` on the cluster with its standard output a pipe read as text (``text`` false: bytes) as it
    comes (its standard error this process's own): for output that is followed, or too large to hold."""
    cmd = ["ssh", *options(remote), *destination(remote), remote_command(remote, argv, env)]
    if not text:
        return subprocess.Popen(cmd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL)
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True, errors="replace")


def sink(remote: Remote, argv: Sequence[str]) -> Stream:
    """Start ``argv`` on the cluster with its standard input a pipe written as bytes (its output dropped, its
    standard error a pipe): for data too large to hold, sent as it is made."""
    cmd = ["ssh", *options(remote), *destination(remote), remote_command(remote, argv)]
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def why_unreachable(remote: Remote, stderr: Union[str, bytes, None]) -> str:
    """ssh's last complaint, and what to do about it, in one line."""
    if isinstance(stderr, bytes):
        stderr = stderr.decode(errors="replace")
    said = [line.strip() for line in (stderr or "").splitlines() if line.strip()]
    last = said[-1] if said else "ssh exited with status 255"
    where = f"cluster {remote.cluster} ({remote.ssh})"
    if "Permission denied" in last or "Authentication" in last or "keyboard-interactive" in last:
        return f"{where}: {last}; run 'launcher login {remote.cluster}' to log in once (a password or a second factor)"
    if "Host key verification failed" in last or "REMOTE HOST IDENTIFICATION HAS CHANGED" in (stderr or ""):
        return (f"{where}: host key verification failed; check the host's key in your known_hosts (connect once with "
                "'ssh' to accept it): the launcher never accepts one for you")
    return f"{where} is unreachable: {last}"


def master_open(remote: Remote) -> bool:
    """Whether a master connection to ``remote`` is open."""
    check = ["ssh", *options(remote), "-O", "check", *destination(remote)]
    return subprocess.run(check, capture_output=True, timeout=10).returncode == 0


def login(remote: Remote) -> int:
    """Open the master interactively (a password or second-factor prompt is answered here, once); it stays open
    until ``logout`` or ``PERSIST`` idle. Returns ssh's exit status."""
    if master_open(remote):
        return 0
    cmd = ["ssh", *options(remote, batch=False), "-o", "ControlMaster=yes", "-f", "-N", *destination(remote)]
    return subprocess.run(cmd).returncode


def logout(remote: Remote) -> bool:
    """Close the master; whether one was open."""
    if not master_open(remote):
        return False
    subprocess.run(["ssh", *options(remote), "-O", "exit", *destination(remote)], capture_output=True, timeout=10)
    return True
