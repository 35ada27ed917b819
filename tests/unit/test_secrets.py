"""`launcher secrets`: the store (0700/0600, atomic), the command line, and what a task gets (injection into real
Slurm tasks: tests/cluster/test_secrets.py).
"""
from __future__ import annotations

import io
import json
import os
import pickle
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from support.helpers import REPO, run_launcher
from support.helpers import events as read_events
from launcher import cli
from launcher.job import secret_store as sec
from launcher.core.damage import DamagedRun
from launcher.job.entry import TrainTask
from launcher.job.task import TASK, write_task

SSH_KEY = (b"-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n"
           b"-----END OPENSSH PRIVATE KEY-----")  # no final newline: the store adds it


@pytest.fixture
def home(tmp_path, monkeypatch):
    path = tmp_path / "home"
    monkeypatch.setenv("LAUNCHER_HOME", str(path))
    return path


def set_stdin(monkeypatch, data: bytes, tty: bool = False) -> None:
    stream = io.TextIOWrapper(io.BytesIO(data))
    if tty:
        stream.isatty = lambda: True  # type: ignore[method-assign]
    monkeypatch.setattr(sys, "stdin", stream)


def secrets_cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(["secrets", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def snapshot(root: Path) -> dict | None:
    """Every path under root with its mode, contents and mtime (None if root does not exist)."""
    if not root.exists():
        return None
    return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else None, p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def assert_private(store: Path) -> None:
    assert stat.S_IMODE(os.stat(store).st_mode) == 0o700
    files = list(store.iterdir())
    assert files
    for path in files:
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
        assert not path.name.startswith("."), f"temporary file left behind: {path.name}"


# --- unit: create / list / delete --------------------------------------------------------------------


def test_create_list_delete_every_kind_private_files(home, tmp_path, monkeypatch, capsys):
    old_umask = os.umask(0)  # modes must not depend on the umask
    try:
        set_stdin(monkeypatch, b"env-from-stdin-7f3a\n")
        assert secrets_cli(capsys, "create", "env", "HF_TOKEN")[0] == 0
        assert secrets_cli(capsys, "create", "env", "WANDB=inline-4c1d")[0] == 0
        token = tmp_path / "token"
        token.write_bytes(b"file-contents-91be\n\x00binary")
        rc, out, _ = secrets_cli(capsys, "create", "file", "hf-token", "--env", "HF_TOKEN_FILE", "--from", str(token))
        assert rc == 0 and out == "Created file secret 'hf-token': tasks find it at the path in $HF_TOKEN_FILE\n"
        key = tmp_path / "id_ed25519"
        key.write_bytes(SSH_KEY)
        assert secrets_cli(capsys, "create", "ssh", "github", "--from", str(key))[0] == 0
    finally:
        os.umask(old_umask)

    store = home / "secrets"
    assert_private(store)
    assert (store / "HF_TOKEN.value").read_bytes() == b"env-from-stdin-7f3a"  # echo's newline dropped
    assert (store / "WANDB.value").read_bytes() == b"inline-4c1d"
    assert (store / "hf-token.value").read_bytes() == b"file-contents-91be\n\x00binary"  # exact bytes
    assert (store / "github.value").read_bytes() == SSH_KEY + b"\n"

    rc, table, _ = secrets_cli(capsys, "list")
    assert rc == 0
    rows = [line.split() for line in table.splitlines()[2:]]
    assert [row[:3] for row in rows] == [["github", "ssh", "SSH_KEY_PATH"], ["hf-token", "file", "HF_TOKEN_FILE"],
                                         ["HF_TOKEN", "env", "HF_TOKEN"], ["WANDB", "env", "WANDB"]]  # case-blind
    assert table.splitlines()[0].split() == ["NAME", "KIND", "ENV", "CREATED"]
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d", " ".join(row[3:])) for row in rows)
    rc, listed, _ = secrets_cli(capsys, "list", "--json")
    data = json.loads(listed)
    assert [(d["name"], d["kind"], d["env"]) for d in data] == [tuple(row[:3]) for row in rows]
    assert all(set(d) == {"name", "kind", "env", "created"} for d in data)
    for value in ("env-from-stdin-7f3a", "inline-4c1d", "file-contents-91be", "b3BlbnNzaC1rZXkt"):
        assert value not in table and value not in listed
        for meta in store.glob("*.json"):
            assert value not in meta.read_text()

    rc, out, _ = secrets_cli(capsys, "delete", "WANDB", "hf-token")
    assert rc == 0 and out == "Deleted secret 'WANDB'\nDeleted secret 'hf-token'\n"
    assert sorted(p.name for p in store.iterdir()) == ["HF_TOKEN.json", "HF_TOKEN.value", "github.json", "github.value"]
    assert [d["name"] for d in json.loads(secrets_cli(capsys, "list", "--json")[1])] == ["github", "HF_TOKEN"]


def test_value_sources_stdin_dash_prompt_and_force_replace(home, monkeypatch, capsys):
    set_stdin(monkeypatch, b"first\r\n")
    assert secrets_cli(capsys, "create", "env", "TOKEN", "--value", "-")[0] == 0
    assert sec.value_path(home / "secrets", "TOKEN").read_bytes() == b"first"

    prompts = []
    monkeypatch.setattr("getpass.getpass", lambda prompt: prompts.append(prompt) or "typed-secret")
    set_stdin(monkeypatch, b"", tty=True)
    rc, out, err = secrets_cli(capsys, "create", "env", "TOKEN", "--force")
    assert rc == 0, err
    assert out == "Replaced env secret 'TOKEN': tasks see $TOKEN\n" and prompts == ["value of TOKEN (not echoed): "]
    assert sec.value_path(home / "secrets", "TOKEN").read_bytes() == b"typed-secret"
    assert [s.name for s in sec.load_all(home / "secrets")] == ["TOKEN"]
    assert_private(home / "secrets")


def test_real_stdin_pipe_and_exit_status(tmp_path):
    env = {**os.environ, "LAUNCHER_HOME": str(tmp_path / "home")}

    def launcher(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess:
        return run_launcher("secrets", *args, input=stdin, env=env, cwd=REPO, timeout=60)

    res = launcher("create", "env", "PIPED", stdin=b"piped-value-0b7e\n")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "home" / "secrets" / "PIPED.value").read_bytes() == b"piped-value-0b7e"
    res = launcher("create", "env", "PIPED", stdin=b"other")
    assert (res.returncode, res.stderr) == (2, b"error: secret 'PIPED' already exists; add --force to replace it\n")
    res = launcher("list")
    assert res.returncode == 0 and b"PIPED" in res.stdout and b"piped-value" not in res.stdout + res.stderr
    for args in (["--help"], ["list", "--help"], ["create", "--help"], ["delete", "--help"]):
        res = launcher(*args)
        assert res.returncode == 0 and res.stdout.startswith(b"usage: launcher secrets"), args
        assert b"launcher/core" not in res.stdout and b"``" not in res.stdout, args  # for users, not internals
    assert b"SSH_KEY_PATH" in launcher("create", "--help").stdout
    assert b"0600" in launcher("--help").stdout
    res = subprocess.run([sys.executable, "-c", "import launcher.job.secret_store, launcher.job.entry, sys; "
                          "assert 'torch' not in sys.modules and 'tabulate' not in sys.modules"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr


# --- unit: bad input ---------------------------------------------------------------------------------

PUB = b"ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFx user@host\n"
# (args, stdin, existing secret HF_TOKEN?, message); FILE / DIR / PUBKEY are replaced by real paths.
BAD_INPUTS = [
    (["create", "env", "9lives"], b"v", False, "invalid secret name '9lives': start with a letter or _"),
    (["create", "env", "a/b", "--env", "X"], b"v", False, "invalid secret name 'a/b'"),
    (["create", "env", "x" * 129, "--env", "X"], b"v", False, "at most 128 characters"),
    (["create", "env", "hf-token"], b"v", False, "secret name 'hf-token' is not an environment variable name; add --env VAR"),
    (["create", "env", "tok", "--env", "1BAD"], b"v", False, "invalid environment variable name '1BAD'"),
    (["create", "env", "tok", "--env", "A-B"], b"v", False, "invalid environment variable name 'A-B'"),
    (["create", "env", "PATH"], b"v", False, "environment variable PATH is reserved"),
    (["create", "env", "tok", "--env", "SLURM_JOB_ID"], b"v", False, "environment variable SLURM_JOB_ID is reserved"),
    (["create", "env", "tok", "--env", "LD_PRELOAD"], b"v", False, "environment variable LD_PRELOAD is reserved"),
    (["create", "envv", "tok"], b"v", False, "unknown secret kind 'envv' (did you mean 'env'?); kinds: env, file, ssh"),
    (["create", "yaml", "tok"], b"v", False, "unknown secret kind 'yaml'; kinds: env, file, ssh"),
    (["create", "file", "tok", "--from", "FILE"], b"", False, "file secrets need --env VAR"),
    (["create", "file", "tok", "--env", "X", "--from", "/nonexistent/token"], b"", False,
     "cannot read --from /nonexistent/token: No such file or directory"),
    (["create", "file", "tok", "--env", "X", "--from", "DIR"], b"", False, "Is a directory"),
    (["create", "file", "tok", "--env", "X"], b"", False, "the value from stdin is empty"),
    (["create", "file", "tok=abc", "--env", "X"], b"", False, "NAME=VALUE is only for env secrets"),
    (["create", "ssh", "key", "--from", "PUBKEY"], b"", False, "is not an SSH private key (that is a public key"),
    (["create", "ssh", "key"], b"hello", False, "the value from stdin is not an SSH private key"),
    (["create", "env", "tok=abc", "--value", "-"], b"", False, "give the value one way, not with NAME=VALUE and --value"),
    (["create", "env", "tok", "--from", "FILE", "--value", "-"], b"", False, "give the value one way, not with --from and --value"),
    (["create", "env", "tok", "--value", "abc"], b"", False, "--value only takes '-' (read stdin)"),
    (["create", "env", "tok"], b"\n", False, "the value from stdin is empty"),
    (["create", "env", "tok=",], b"", False, "the value from the command line is empty"),
    (["create", "env", "tok"], b"a\x00b", False, "contains a NUL byte"),
    (["create", "env", "tok"], b"\xff\xfe", False, "is not UTF-8 text; use a file secret"),
    (["create", "env", "tok"], b"x" * (65 * 1024), False, "env secrets hold at most 64 KiB"),
    (["create", "env", "HF_TOKEN"], b"v", True, "secret 'HF_TOKEN' already exists; add --force to replace it"),
    (["create", "file", "other", "--env", "HF_TOKEN", "--from", "FILE"], b"", True,
     "environment variable HF_TOKEN is already set by secret 'HF_TOKEN'"),
    (["delete", "HF_TOKN"], b"", True, "no secret named 'HF_TOKN' (did you mean 'HF_TOKEN'?); secrets: HF_TOKEN"),
    (["delete", "HF_TOKEN", "nope"], b"", True, "no secret named 'nope'; secrets: HF_TOKEN"),
    (["delete", "nope"], b"", False, "no secret named 'nope'; secrets: none"),
    (["lst"], b"", False, "invalid choice: 'lst'"),
    ([], b"", False, "the following arguments are required"),
    (["list", "--yaml"], b"", False, "unrecognized arguments: --yaml"),
    (["create", "env"], b"", False, "the following arguments are required: NAME[=VALUE]"),
]  # fmt: skip


@pytest.mark.parametrize("args, stdin, existing, message", BAD_INPUTS,
                         ids=[" ".join(a)[:60] or "(none)" for a, *_ in BAD_INPUTS])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(home, tmp_path, monkeypatch, capsys, args, stdin,
                                                          existing, message):
    (tmp_path / "token").write_bytes(b"contents")
    (tmp_path / "id.pub").write_bytes(PUB)
    paths = {"FILE": str(tmp_path / "token"), "DIR": str(tmp_path), "PUBKEY": str(tmp_path / "id.pub")}
    args = [paths.get(arg, arg) for arg in args]
    if existing:
        sec.create(home / "secrets", "HF_TOKEN", "env", "HF_TOKEN", b"existing-value")
    before = snapshot(home)
    set_stdin(monkeypatch, stdin)
    rc, out, err = secrets_cli(capsys, *args)
    assert rc == 2
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], err
    assert out == ""
    assert snapshot(home) == before


def test_failed_write_leaves_no_secret_and_no_temporary_file(home, monkeypatch, capsys):
    seen_modes = []
    real_replace = os.replace

    def replace(src, dst):
        seen_modes.append(stat.S_IMODE(os.stat(src).st_mode))
        if str(dst).endswith(".json"):
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(sec.os, "replace", replace)
    with pytest.raises(OSError):
        sec.create(home / "secrets", "TOKEN", "env", "TOKEN", b"v")
    assert seen_modes == [0o600, 0o600]  # private before the rename made it visible
    assert sec.load_all(home / "secrets") == []  # the metadata, written last, never landed
    assert not [p for p in (home / "secrets").iterdir() if p.name.startswith(".")]


# --- unit: injection ---------------------------------------------------------------------------------


def test_inject_sets_env_values_and_paths_of_private_files(tmp_path, capsys):
    store = tmp_path / "secrets"
    assert sec.inject(store, {}) == []  # no store: nothing to do
    sec.create(store, "HF_TOKEN", "env", "HF_TOKEN", b"env-value")
    sec.create(store, "hf-token", "file", "HF_TOKEN_FILE", b"file-value")
    sec.create(store, "gh", "ssh", "SSH_KEY_PATH", SSH_KEY)
    sec.create(store, "gone", "file", "GONE_FILE", b"x")
    sec.value_path(store, "gone").unlink()  # e.g. deleted while the task started
    environ = {"HF_TOKEN": "from the submitting shell"}
    assert sec.inject(store, environ) == ["SSH_KEY_PATH", "HF_TOKEN_FILE", "HF_TOKEN"]
    assert environ["HF_TOKEN"] == "env-value"
    assert Path(environ["HF_TOKEN_FILE"]).read_bytes() == b"file-value"
    assert Path(environ["SSH_KEY_PATH"]).read_bytes() == SSH_KEY + b"\n"
    for var in ("HF_TOKEN_FILE", "SSH_KEY_PATH"):
        assert Path(environ[var]).is_absolute() and stat.S_IMODE(os.stat(environ[var]).st_mode) == 0o600
    assert "GONE_FILE" not in environ
    err = capsys.readouterr().err
    assert err == "launcher: warning: secret 'gone' not injected (No such file or directory)\n"


def test_a_failing_task_records_its_error_without_secret_values(tmp_path, monkeypatch):
    """The 'failed' event quotes the error's first line; an injected value in it is masked."""
    store, run_dir = tmp_path / "store", tmp_path / "run-dir-holding-the-value"
    run_dir.mkdir()
    sec.create(store, "leaky", "env", "LEAKY", str(run_dir).encode())
    monkeypatch.delenv("LEAKY", raising=False)
    with pytest.raises(DamagedRun):  # no config.yaml: the error names the path, i.e. the value
        TrainTask(str(store))(str(run_dir))
    os.environ.pop("LEAKY", None)
    events = read_events(run_dir)
    assert events[-1]["event"] == "failed" and "***/config.yaml" in events[-1]["error"]
    assert str(run_dir) not in (run_dir / "events.jsonl").read_text()


def test_train_task_carries_the_store_path_from_submission(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "submit-home"))
    task = TrainTask()
    assert task.secrets_store == str(tmp_path / "submit-home" / "secrets")
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "elsewhere"))
    restored = pickle.loads(pickle.dumps(task))
    assert restored.secrets_store == str(tmp_path / "submit-home" / "secrets")
    (tmp_path / "run").mkdir()
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "submit-home"))
    write_task(tmp_path / "run")  # the job's pickle (launcher/job/task.py), which the tasks load elsewhere
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "elsewhere"))
    pickled = pickle.loads((tmp_path / "run" / "submitit" / TASK).read_bytes())
    assert pickled.func.secrets_store == task.secrets_store


# --- on the real cluster -----------------------------------------------------------------------------
