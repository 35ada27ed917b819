"""``launcher ui``: serve the web console (launcher/console/) on this machine until Ctrl-C, and print its one URL
with its token.

The web stack (Starlette on uvicorn, small dependencies of the package) is imported only here, so no other command
starts slower for it. The server binds 127.0.0.1 on a free port unless told otherwise; another address is served with a
warning (anyone who can reach it and has the URL can stop your runs). On a login node, reach it from a laptop with
``ssh -L PORT:127.0.0.1:PORT LOGIN_NODE`` and open the printed URL there (docs/console.md).

While it serves, Slurm's answers are shared by every tab and kept ``--slurm-every`` seconds (30 by default:
launcher/slurm/client.py ``SharedAnswers``): a console left open asks each cluster's controller a question at
most that often, however many tabs show it.
"""
from __future__ import annotations

import argparse
import secrets

from launcher.console.serve import bound, loopback, write_token
from launcher.errors import LaunchError
from launcher.slurm.client import SHARED
from launcher.views.lookup import roots_of
from launcher.views.width import to_stderr

EXTRA = "pip install 'starlette>=0.37' 'uvicorn>=0.29' (dependencies of slurm-gpt-launcher: reinstall it)"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=0, help="the port to serve on (default: a free one)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to serve on (default 127.0.0.1; another is served with a warning)")
    parser.add_argument("--slurm-every", type=float, default=30.0, metavar="S",
                        help="ask each cluster's Slurm at most once per S seconds, for every tab (default 30)")


def main(args: argparse.Namespace) -> int:
    if not 0 <= args.port <= 65535:
        raise LaunchError(f"--port {args.port}: allowed 0 (a free one) to 65535")
    if args.slurm_every < 1:
        raise LaunchError(f"--slurm-every {args.slurm_every:g}: allowed 1 second or more")
    try:
        import uvicorn  # lazy: the web stack is imported by this command only

        from launcher.console.app import Console, application  # lazy: Starlette, as uvicorn
    except ImportError as err:
        raise LaunchError(f"launcher ui needs the console's web stack ({err.name} is missing): {EXTRA}") from None

    sock = bound(args.host, args.port)
    port = sock.getsockname()[1]
    if not loopback(args.host):
        to_stderr(f"warning: serving on {args.host}, not only this machine: anyone who reaches it with the URL can "
                  "stop and delete your runs; prefer the default 127.0.0.1 and ssh -L")
    token = secrets.token_urlsafe(32)
    where = write_token(token)
    shown = f"[{args.host}]" if ":" in args.host else args.host
    # The Host a request may name (against DNS rebinding); every address (0.0.0.0) is reached by any of the
    # machine's names, which the warning above covers.
    hosts = [] if args.host in ("0.0.0.0", "::") else [f"{shown}:{port}"] + (
        [f"localhost:{port}"] if loopback(args.host) else [])
    SHARED.max_age_s = args.slurm_every
    app = application(Console(roots_of(args), args.root, token, hosts))
    print(f"Console of your runs at http://{shown}:{port}/?token={token}\n(token also in {where}; Ctrl-C stops it)",
          flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    return 0
