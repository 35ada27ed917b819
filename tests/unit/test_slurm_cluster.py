"""The local Slurm cluster (slurm/up.sh) behaves like a real multi-node GPU cluster."""
from __future__ import annotations

import socket

import pytest

from support.helpers import run_up


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nodes", "0"], "--nodes must be a positive integer, got '0'"),
        (["--gpus", "abc"], "--gpus must be a non-negative integer, got 'abc'"),
        (["--cpus", "-1"], "--cpus must be a positive integer, got '-1'"),
        (["--bogus"], "unknown option '--bogus'"),
    ],
)
def test_up_rejects_impossible_settings_without_starting_anything(tmp_path, args, message):
    state = tmp_path / "state"
    res = run_up("--dir", str(state), *args)
    assert res.returncode != 0
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"slurm/up.sh: {message}")
    assert not state.exists()


def test_up_names_a_taken_port(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        res = run_up("--dir", str(tmp_path / "s"), "--name", "porttest", "--no-accounting", "--port", str(port))
    assert res.returncode != 0
    assert f"port {port} is already in use" in res.stderr
