"""The local Slurm cluster (slurm/up.sh) behaves like a real multi-node GPU cluster."""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from support.helpers import DOWN, run_up


@pytest.mark.parametrize(
    "args, message",
    [
        (["--nodes", "0"], "--nodes must be a positive integer, got '0'"),
        (["--gpus", "abc"], "--gpus must be a non-negative integer, got 'abc'"),
        (["--cpus", "-1"], "--cpus must be a positive integer, got '-1'"),
        (["--bogus"], "unknown option '--bogus'"),
        (["--strict", "nosuchuser"], "--strict: no such user 'nosuchuser'"),
        (["--strict", "root", "--no-accounting"], "--strict needs accounting"),
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


@pytest.mark.parametrize("args, rc, out, err", [
    (["--help"], 0, "Stop everything slurm/up.sh started", ""),
    (["-h"], 0, "Stop everything slurm/up.sh started", ""),
    (["--bogus"], 2, "", "slurm/down.sh: unknown argument '--bogus' (allowed: --dir DIR, --help); nothing was stopped"),
    (["--dir"], 2, "", "slurm/down.sh: --dir needs a directory"),
])
def test_down_prints_its_usage_and_refuses_what_it_does_not_know_stopping_nothing(tmp_path, args, rc, out, err):
    # a cluster directory whose controller is a process of the test's own: down.sh would stop it if it went on
    run = tmp_path / "state" / "run"
    run.mkdir(parents=True)
    daemon = subprocess.Popen(["sleep", "60"])
    try:
        (run / "slurmctld.pid").write_text(f"{daemon.pid}\n")
        res = subprocess.run(["bash", DOWN, *args], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "SLURM_LOCAL_DIR": str(tmp_path / "state")})
        assert (res.returncode, res.stderr.strip()) == (rc, err) and res.stdout.startswith(out), res
        assert daemon.poll() is None and (run / "slurmctld.pid").exists()
    finally:
        daemon.kill()
        daemon.wait()



@pytest.mark.parametrize("program, stopped", [("slurmd", True), ("sleep", False)], ids=["the-daemon", "a-reused-pid"])
def test_down_stops_the_process_a_pid_file_names_only_if_it_is_that_daemon(tmp_path, program, stopped):
    """A slurmd's pid, freed when it died and handed to another process, is not the slurmd: down.sh (and up.sh's
    repair, through the same check) stops only a process that is the daemon its pid file is named after."""
    run = tmp_path / "state" / "run"
    run.mkdir(parents=True)
    binary = tmp_path / program
    shutil.copy(shutil.which("sleep"), binary)  # a process whose name is the program's
    # Started as up.sh starts a daemon, orphaned (its shell exits), so that init reaps it once stopped: down.sh waits
    # for the process to be gone, and a child of this test would stay a zombie until the test waited for it.
    pid = int(subprocess.run(["sh", "-c", f"{binary} 60 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True,
                             check=True).stdout)
    try:
        (run / "slurmd-n1.pid").write_text(f"{pid}\n")
        res = subprocess.run(["bash", DOWN], capture_output=True, text=True, timeout=30,
                             env={**os.environ, "SLURM_LOCAL_DIR": str(tmp_path / "state")})
        assert res.returncode == 0, res.stderr
        assert running(pid, program) is not stopped
        assert not list(run.glob("slurmd-n1.pid"))  # the record is gone either way: nothing of it runs
    finally:
        if running(pid, program):  # a stopped one's pid may be another process's by now
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def running(pid: int, program: str) -> bool:
    """Whether ``pid`` is a live (not zombie) process named ``program``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.index("(") + 1:stat.rindex(")")] == program and stat[stat.rindex(")") + 2] != "Z"
