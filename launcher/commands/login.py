"""``launcher login CLUSTER`` / ``launcher logout CLUSTER``: open or close a remote cluster's SSH master.

Every other command reaches a remote cluster with ``BatchMode=yes`` (it never prompts) over the cluster's master
connection (launcher/remote/ssh.py). A login node that asks for a password or a second factor is answered here,
once, interactively; the master then serves every command until ``logout`` or ten idle minutes.
"""
from __future__ import annotations

import argparse

from launcher.errors import LaunchError
from launcher.remote.clusters import find_remote
from launcher.remote.ssh import login, logout
from launcher.views.width import to_stderr


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cluster", metavar="CLUSTER", help="a remote cluster: the name of a cluster file with ssh:")


def main(args: argparse.Namespace) -> int:
    remote = find_remote(args.cluster)
    if args.command == "logout":
        print(f"closed the connection to {remote.cluster}" if logout(remote)
              else f"no open connection to {remote.cluster}")
        return 0
    status = login(remote)
    if status != 0:
        raise LaunchError(f"could not log in to cluster {remote.cluster} ({remote.ssh}): ssh exited with status "
                          f"{status}; try 'ssh {remote.ssh}' to see why")
    to_stderr(f"logged in to {remote.cluster} ({remote.ssh}); commands use this connection until "
              f"'launcher logout {remote.cluster}'")
    return 0
