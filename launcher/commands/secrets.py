"""``launcher secrets``: values every task of every run sees, without ever passing through Slurm.

    printf %s "$TOKEN" | launcher secrets create env HF_TOKEN          # value on stdin (preferred)
    launcher secrets create env WANDB_API_KEY --from ~/.wandb_key       # or from a file
    launcher secrets create file hf-token --env HF_TOKEN_FILE --from ./token
    launcher secrets create ssh github --from ~/.ssh/id_ed25519         # path in $SSH_KEY_PATH
    launcher secrets list [--json]
    launcher secrets delete NAME [NAME ...]

The kinds (env, file, ssh) and where values come from: ``launcher secrets create --help``. Storage and
injection: launcher/job/secret_store.py.

Every user mistake is one line ``error: ...`` and exit status 2, with nothing written.
"""
from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from launcher.job.secret_store import (ENV_VAR, DEFAULT_ENV, check_env_var, check_kind, check_name, create, delete,
                                   load_all, secrets_dir, check_free)
from launcher.errors import LaunchError
from launcher.remote.clusters import find_remote
from launcher.remote.ship import run_launcher
from launcher.views.lookup import invocation
from launcher.views.width import fit_table


# --- command line -------------------------------------------------------------------------------------

EPILOG = """kinds:
  env   tasks see VAR=<value> in their environment; VAR is --env VAR, or the secret's name when that is
        a valid variable name. The value is UTF-8 text (one trailing newline dropped), at most 64 KiB.
  file  the contents (any bytes, at most 1 MiB, kept exactly) are a file on every task; the variable
        named by --env VAR (required) holds its path.
  ssh   an SSH private key (not the .pub); its path is in --env VAR, default SSH_KEY_PATH. Use it as
        GIT_SSH_COMMAND="ssh -i $SSH_KEY_PATH -o IdentitiesOnly=yes". A key with a passphrase cannot be
        unlocked by a batch job.

The value comes from --from FILE, or stdin (--value -, or whenever stdin is not a terminal); on a
terminal an env value is prompted for without echo. NAME=VALUE also works for env secrets but lands in
shell history and ps. Each variable can be set by one secret only; variables the launcher, Slurm or the
dynamic loader rely on (PATH, LD_PRELOAD, RANK, SLURM_*, ...) cannot be secrets."""


def configure(parser: argparse.ArgumentParser) -> None:
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.description = ("Secrets every task of every run sees, stored 0600 under $LAUNCHER_HOME/secrets "
                          "(default ~/.launcher/secrets) and never passed through Slurm.")
    parser.epilog = EPILOG
    sub = parser.add_subparsers(dest="action", metavar="{list,create,delete}")
    sub.required = True
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--cluster", metavar="NAME",
                       help="a remote cluster (its file names ssh:): its own store, the value sent on SSH's stdin")

    ls = sub.add_parser("list", parents=[where], help="list secrets: name, kind, variable, created (never values)",
                        description="List the secrets: name, kind, environment variable and creation time. "
                                    "Values are never shown.")
    ls.add_argument("--json", action="store_true", help="a JSON array of {name, kind, env, created}")

    cr = sub.add_parser(
        "create", parents=[where], help="create (or with --force replace) a secret",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Create a secret. The value comes from --from FILE, from stdin (--value -, or "
                    "whenever stdin is not a terminal), or for env secrets as NAME=VALUE (which lands in "
                    "shell history: prefer stdin).",
        epilog="""kinds:
  env   NAME      tasks see $VAR=<value>; VAR is --env, default NAME
  file  NAME      tasks find the contents at the path in $VAR; --env VAR is required
  ssh   NAME      an SSH private key; its path is in $VAR, default SSH_KEY_PATH

examples:
  printf %s "$HF_TOKEN" | launcher secrets create env HF_TOKEN
  launcher secrets create env WANDB_API_KEY --from ~/.wandb_key
  launcher secrets create file hf-token --env HF_TOKEN_FILE --from ./token
  launcher secrets create ssh github --from ~/.ssh/id_ed25519""",
    )
    cr.add_argument("kind", help="env, file or ssh")
    cr.add_argument("name", metavar="NAME[=VALUE]",
                    help="secret name: a letter or _, then letters, digits, . _ -; env secrets may add =VALUE")
    cr.add_argument("--env", metavar="VAR", help="the environment variable tasks get")
    cr.add_argument("--from", dest="from_file", metavar="FILE", help="read the value from FILE")
    cr.add_argument("--value", metavar="-", help="'-': read the value from stdin")
    cr.add_argument("--force", action="store_true", help="replace a secret of the same name")

    rm = sub.add_parser("delete", parents=[where], help="delete secrets",
                        description="Delete the named secrets (all or none).")
    rm.add_argument("names", nargs="+", metavar="NAME")


def main(args: argparse.Namespace) -> int:
    """``launcher secrets ...``; returns the exit status (user mistakes raise LaunchError)."""
    if args.cluster:
        return on_cluster(args)
    directory = secrets_dir()
    if args.action == "list":
        return _list(directory, args.json)
    if args.action == "delete":
        for name in delete(directory, args.names):
            print(f"Deleted secret {name!r}")
        return 0
    return _create(directory, args)


def _list(directory: Path, as_json: bool) -> int:
    secrets = load_all(directory)
    if as_json:
        rows = [{**asdict(s), "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(s.created))}
                for s in secrets]
        print(json.dumps(rows, indent=2))
        return 0
    if not secrets:
        print(f"No secrets in {directory}. Create one with: {invocation()} secrets create env NAME < value.txt")
        return 0
    rows = [(s.name, s.kind, s.env, time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created))) for s in secrets]
    print(fit_table(rows, ["NAME", "KIND", "ENV", "CREATED"], {"NAME": 16, "ENV": 16}))
    return 0


def on_cluster(args: argparse.Namespace) -> int:
    """The same action on a remote cluster's own store. A value is read here (from --from, stdin or the prompt)
    and reaches the cluster on SSH's standard input, never in a command line that ``ps`` shows on either end."""
    remote = find_remote(args.cluster)
    if args.action == "list":
        forwarded, value = ["list", *(["--json"] if args.json else [])], None
    elif args.action == "delete":
        forwarded, value = ["delete", *args.names], None
    else:
        name, inline = args.name.split("=", 1) if "=" in args.name else (args.name, None)
        check_kind(args.kind)
        check_name(name)
        value, _ = _read_value(args.kind, name, inline, args.from_file, args.value)
        forwarded = ["create", args.kind, name, "--value", "-", *(["--env", args.env] if args.env else []),
                     *(["--force"] if args.force else [])]
    return run_launcher(remote, "launcher", ["secrets", *forwarded], input=value, timeout=120,
                        capture=False).returncode


def _create(directory: Path, args: argparse.Namespace) -> int:
    kind, name, inline = args.kind, args.name, None
    check_kind(kind)
    if "=" in name:
        if kind != "env":
            raise LaunchError(f"NAME=VALUE is only for env secrets; give a {kind} secret's value with --from FILE "
                              "or stdin")
        name, inline = name.split("=", 1)
    check_name(name)
    env = args.env or DEFAULT_ENV.get(kind)
    if env is None and kind == "env":
        if not ENV_VAR.fullmatch(name):
            raise LaunchError(f"secret name {name!r} is not an environment variable name; add --env VAR")
        env = name
    if env is None:
        raise LaunchError(f"{kind} secrets need --env VAR: the variable that holds the file's path")
    check_env_var(env)
    check_free(directory, name, env, args.force)
    value, origin = _read_value(kind, name, inline, args.from_file, args.value)
    replaced = any(s.name == name for s in load_all(directory))
    create(directory, name, kind, env, value, force=args.force, origin=origin)
    what = f"tasks see ${env}" if kind == "env" else f"tasks find it at the path in ${env}"
    print(f"{'Replaced' if replaced else 'Created'} {kind} secret {name!r}: {what}")
    return 0


def _read_value(kind: str, name: str, inline: Optional[str], from_file: Optional[str],
                value: Optional[str]) -> "tuple[bytes, str]":
    given = [label for label, present in (("NAME=VALUE", inline is not None), ("--from", from_file is not None),
                                          ("--value", value is not None)) if present]
    if len(given) > 1:
        raise LaunchError(f"give the value one way, not with {' and '.join(given)}")
    if value is not None and value != "-":
        raise LaunchError("--value only takes '-' (read stdin), so the value stays out of shell history; "
                          "or use --from FILE")
    if inline is not None:
        return inline.encode("utf-8"), "the command line"
    if from_file is not None:
        path = Path(os.path.expanduser(from_file))
        try:
            return path.read_bytes(), str(from_file)
        except OSError as err:
            raise LaunchError(f"cannot read --from {from_file}: {err.strerror or type(err).__name__}") from None
    stdin = sys.stdin
    if value == "-" or stdin is None or not stdin.isatty():
        if stdin is None:
            raise LaunchError("no value: stdin is closed; use --from FILE")
        return stdin.buffer.read(), "stdin"
    if kind != "env":
        raise LaunchError(f"no value for {kind} secret {name!r}: use --from FILE or pipe it on stdin")

    return getpass.getpass(f"value of {name} (not echoed): ").encode("utf-8"), "the prompt"
