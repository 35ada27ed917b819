"""Where ``launcher ui`` (launcher/commands/ui.py) serves the console: a listening socket, whether its address is
this machine's only, and the token's file, which only this user reads.
"""
from __future__ import annotations

import ipaddress
import os
import socket
import tempfile
from pathlib import Path

from launcher.core.rundir import launcher_home
from launcher.core.safepath import HOME, ensure_home, private_dir
from launcher.errors import LaunchError


def bound(host: str, port: int) -> socket.socket:
    """A listening socket on ``host``:``port``; LaunchError in one line where it cannot be had."""
    try:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except (OSError, UnicodeError) as err:
        raise LaunchError(f"cannot serve on {host}:{port}: {err.strerror or err}") from None
    return sock


def loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def write_token(token: str) -> Path:
    """Keep the token where only this user reads it: ``$LAUNCHER_HOME/console/token``, mode 0600, in a launcher home
    and a folder no other user could change or plant (launcher/core/safepath.py), written to a fresh file and
    renamed into place (a rename replaces a symlink rather than following it)."""
    folder = ensure_home(launcher_home()) / "console"
    private_dir(folder, "console folder", HOME)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".token.")  # 0600
    with os.fdopen(fd, "w") as handle:
        handle.write(token + "\n")
    os.replace(tmp, folder / "token")
    return folder / "token"
