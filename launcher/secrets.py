"""``launcher secrets``: values every task of every run sees, without ever passing through Slurm.

    printf %s "$TOKEN" | launcher secrets create env HF_TOKEN          # value on stdin (preferred)
    launcher secrets create env WANDB_API_KEY --from ~/.wandb_key       # or from a file
    launcher secrets create file hf-token --env HF_TOKEN_FILE --from ./token
    launcher secrets create ssh github --from ~/.ssh/id_ed25519         # path in $SSH_KEY_PATH
    launcher secrets list [--json]
    launcher secrets delete NAME [NAME ...]

Kinds
    ``env``   the task sees ``VAR=<value>`` in its environment. ``VAR`` is ``--env VAR``, or the secret's
              name when that is a valid variable name. ``NAME=VALUE`` on the command line also works, as
              with ``mcli create secret env``, but it lands in shell history and ``ps``: prefer stdin,
              ``--value -``, or ``--from FILE``. One trailing newline of the value (as ``echo`` adds) is
              dropped; the value must be UTF-8 text without NUL bytes, at most 64 KiB.
    ``file``  the contents (any bytes, at most 1 MiB, kept exactly) are a file on every task; the
              variable named by ``--env VAR`` (required) holds its absolute path.
    ``ssh``   an SSH private key (the ``-----BEGIN ... PRIVATE KEY-----`` file, not the ``.pub``); its
              path is in ``--env VAR``, default ``SSH_KEY_PATH``. Use it as e.g.
              ``GIT_SSH_COMMAND="ssh -i $SSH_KEY_PATH -o IdentitiesOnly=yes"``. A passphrase-protected
              key cannot be unlocked by a batch job.

    Without ``--from`` or ``--value -``, the value is read from stdin when stdin is not a terminal;
    on a terminal an ``env`` value is prompted for without echo. Each variable can be set by one
    secret only, and variables the launcher, Slurm or the dynamic loader rely on (``PATH``,
    ``LD_PRELOAD``, ``RANK``, ``SLURM_*``, ...) cannot be secrets.

Storage
    ``$LAUNCHER_HOME/secrets/`` (default ``~/.launcher/secrets/``), a 0700 directory. Each secret is
    two 0600 files: ``<name>.value`` (the raw value) and ``<name>.json`` (name, kind, variable, created
    time; never the value). Both are written to a temporary file created 0600 by ``mkstemp`` in the same
    directory, fsynced and renamed into place, so no reader ever sees a partial or world-readable file.
    The value is written first and the metadata last: a secret exists once its ``.json`` does, and
    ``delete`` removes the ``.json`` first. On a cluster the home directory is shared with the compute
    nodes, which is how tasks read the store.

Injection
    ``launcher.entry.TrainTask`` records the store's absolute path when the run is submitted (so the
    ``LAUNCHER_HOME`` of the submitting shell decides) and, on every task, calls :func:`inject` before it
    imports ``train``: ``env`` values are put into ``os.environ``; ``file`` and ``ssh`` variables get the
    path of the stored 0600 ``.value`` file itself, read in place (no copies are left on node-local
    disks). The task prints one line naming the variables it set, never a value. Secrets are read when a
    task starts: a secret created, replaced or deleted later affects tasks that start later (including
    requeued ones), and replacing one in place swaps the file a running task's path points at.

    Nothing goes through Slurm: the sbatch script, the job's command line and environment, the run
    directory (config, logs, events, submitit's pickles) hold at most the store's path and the
    variables' names.

Every user mistake is one line ``error: ...`` and exit status 2, with nothing written.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import List, MutableMapping, NoReturn, Optional, Sequence

from launcher.errors import LaunchError, did_you_mean

KINDS = ("env", "file", "ssh")
DEFAULT_ENV = {"ssh": "SSH_KEY_PATH"}
MAX_BYTES = {"env": 64 * 1024, "file": 1024 * 1024, "ssh": 1024 * 1024}

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_MAX_NAME = 128
_ENV_VAR = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
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
    environ = os.environ if environ is None else environ
    home = environ.get("LAUNCHER_HOME") or "~/.launcher"
    return Path(os.path.expanduser(home)).absolute() / "secrets"


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
        if secret.kind in KINDS and path.name == f"{secret.name}.json" and _ENV_VAR.fullmatch(secret.env):
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
    if not _ENV_VAR.fullmatch(var):
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
            hint = " (that is a public key; pass the file without .pub)" if text.startswith((b"ssh-", b"ecdsa-")) else ""
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
    _check_free(directory, name, env, force)
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


def _check_free(directory: Path, name: str, env: str, force: bool) -> None:
    for other in load_all(directory):
        if other.name == name and not force:
            raise LaunchError(f"secret {name!r} already exists; add --force to replace it")
        if other.name != name and other.env == env:
            raise LaunchError(f"environment variable {env} is already set by secret {other.name!r}; "
                              "choose another with --env, or delete that one")


def _ensure_dir(directory: Path) -> None:
    """The store directory, created (with its parents) and made 0700 (never wider, even while created)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)  # the umask can only narrow this
    except FileExistsError:
        if not directory.is_dir():
            raise LaunchError(f"{directory} exists and is not a directory") from None
    os.chmod(directory, 0o700)


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


# --- command line -------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse whose mistakes are LaunchErrors (one line, exit 2) instead of usage dumps."""

    def error(self, message: str) -> NoReturn:
        raise LaunchError(f"{self.prog}: {message}; see --help")


def _parser() -> argparse.ArgumentParser:
    doc = __doc__ or ""
    parser = _Parser(
        prog="launcher secrets", formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Secrets every task of every run sees, stored 0600 under $LAUNCHER_HOME/secrets "
                    "(default ~/.launcher/secrets) and never passed through Slurm.",
        epilog=doc[doc.index("Kinds"):doc.index("Every user mistake")].rstrip().replace("``", ""),
    )
    sub = parser.add_subparsers(dest="command", metavar="{list,create,delete}", parser_class=_Parser)
    sub.required = True

    ls = sub.add_parser("list", help="list secrets: name, kind, variable, created (never values)",
                        description="List the secrets: name, kind, environment variable and creation time. "
                                    "Values are never shown.")
    ls.add_argument("--json", action="store_true", help="a JSON array of {name, kind, env, created}")

    cr = sub.add_parser(
        "create", help="create (or with --force replace) a secret",
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

    rm = sub.add_parser("delete", help="delete secrets", description="Delete the named secrets (all or none).")
    rm.add_argument("names", nargs="+", metavar="NAME")
    return parser


def main(argv: Sequence[str]) -> int:
    """``launcher secrets ...``; returns the exit status (user mistakes raise LaunchError)."""
    try:
        args = _parser().parse_args(list(argv))
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    directory = secrets_dir()
    if args.command == "list":
        return _list(directory, args.json)
    if args.command == "delete":
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
        print(f"No secrets in {directory}. Create one with: launcher secrets create env NAME < value.txt")
        return 0
    from tabulate import tabulate

    rows = [(s.name, s.kind, s.env, time.strftime("%Y-%m-%d %H:%M", time.localtime(s.created))) for s in secrets]
    print(tabulate(rows, headers=["NAME", "KIND", "ENV", "CREATED"]))
    return 0


def _create(directory: Path, args: argparse.Namespace) -> int:
    kind, name, inline = args.kind, args.name, None
    check_kind(kind)
    if "=" in name:
        if kind != "env":
            raise LaunchError(f"NAME=VALUE is only for env secrets; give a {kind} secret's value with --from FILE or stdin")
        name, inline = name.split("=", 1)
    check_name(name)
    env = args.env or DEFAULT_ENV.get(kind)
    if env is None and kind == "env":
        if not _ENV_VAR.fullmatch(name):
            raise LaunchError(f"secret name {name!r} is not an environment variable name; add --env VAR")
        env = name
    if env is None:
        raise LaunchError(f"{kind} secrets need --env VAR: the variable that holds the file's path")
    check_env_var(env)
    _check_free(directory, name, env, args.force)
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
    import getpass

    return getpass.getpass(f"value of {name} (not echoed): ").encode("utf-8"), "the prompt"
