"""The SSH site that the tests of remote clusters stand on (tests/support/sshd_site.py), proved with plain OpenSSH:
its user logs in with the session's key and in no other way, words reach the remote command as given, Slurm's tools
there reach the suite's cluster when given SLURM_CONF (an SSH session has none of our environment), a job its user
submits runs as that user, and its sshd can be stopped and started again."""
from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest


@pytest.fixture
def remote_dir(remote_site):
    """A fresh folder in the site user's home, made and removed over SSH."""
    made = remote_site.ssh("mktemp", "-d", "-p", str(remote_site.home), "test.XXXXXX")
    assert made.returncode == 0, made.stderr
    path = Path(made.stdout.strip())
    yield path
    remote_site.ssh("rm", "-rf", str(path))


def ssh_without_the_site_key(site, *options: str) -> tuple[subprocess.CompletedProcess, float]:
    """Connect to the site as its user with none of the site's client settings but its host key (so that only
    authentication can fail); the result and how long it took."""
    started = time.monotonic()
    res = subprocess.run(["ssh", "-F", "/dev/null", "-p", str(site.port), "-o", "BatchMode=yes",
                          "-o", f"UserKnownHostsFile={site.state / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
                          "-o", "IdentitiesOnly=yes", "-o", "IdentityAgent=none", *options,
                          f"{site.user}@127.0.0.1", "true"], stdin=subprocess.DEVNULL, capture_output=True,
                         text=True, timeout=30)
    return res, time.monotonic() - started


def test_the_session_key_logs_in_as_the_site_user(remote_site):
    res = remote_site.ssh("id", "-un")
    assert (res.returncode, res.stdout.strip()) == (0, remote_site.user), res.stderr
    # Each word arrives as given (the remote shell gets them quoted), in the user's home.
    res = remote_site.ssh("sh", "-c", 'printf "%s|" "$PWD" "$@"', "sh", "two words", "$HOME;*", "'")
    assert res.stdout == f"{remote_site.home}|two words|$HOME;*|'|", res.stderr


def test_no_password_nor_other_key_opens_the_site(remote_site, tmp_path):
    res, took = ssh_without_the_site_key(remote_site, "-o", "PreferredAuthentications=password,keyboard-interactive")
    # The methods the server still offers, after the client tried none it accepts: public keys alone.
    assert res.returncode == 255 and "Permission denied (publickey)." in res.stderr, res.stderr
    assert took < 10
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "other")], check=True)
    res, took = ssh_without_the_site_key(remote_site, "-o", f"IdentityFile={tmp_path / 'other'}")
    assert res.returncode == 255 and "Permission denied (publickey)." in res.stderr, res.stderr
    assert took < 10


def test_slurm_on_the_site_is_the_suite_cluster_given_slurm_conf(remote_site, slurm):
    unset = remote_site.ssh("printenv", "SLURM_CONF")
    assert (unset.returncode, unset.stdout) == (1, ""), "the site's sessions must not see our SLURM_CONF"
    nodes = remote_site.slurm("sinfo", "-h", "-N", "-o", "%N")
    assert nodes.returncode == 0, nodes.stderr
    assert sorted(set(nodes.stdout.split())) == slurm.nodes
    # Slurm's tools authenticate with munge: a credential made there decodes as the site's user.
    socket = re.search(r"^AuthInfo=socket=([^,\s]+)", remote_site.slurm_conf.read_text(), re.M).group(1)
    cred = remote_site.ssh("sh", "-c", 'munge -n -S "$1" | unmunge -S "$1"', "sh", socket)
    assert re.search(rf"^UID:\s+{remote_site.user} ", cred.stdout, re.M), cred.stdout + cred.stderr


def test_a_job_the_site_user_submits_runs_as_that_user(remote_site, slurm, remote_dir):
    res = remote_site.slurm("sbatch", "--wait", "--parsable", "-o", str(remote_dir / "job-%j.out"), "--wrap", "id -un",
                            timeout=180)
    assert res.returncode == 0, res.stderr
    job = res.stdout.strip().split(";")[0]
    output = remote_site.ssh("cat", str(remote_dir / f"job-{job}.out"))
    assert output.stdout == f"{remote_site.user}\n", output.stderr
    accounted = slurm.run("sacct", "-n", "-X", "-P", "-o", "User,State", "-j", job).stdout.split()
    assert accounted == [f"{remote_site.user}|COMPLETED"]


def test_a_stopped_sshd_refuses_at_once_and_serves_again_once_started(remote_site):
    remote_site.stop_sshd()
    try:
        started = time.monotonic()
        res = remote_site.ssh("true", options=("-o", "ConnectTimeout=5"), timeout=30)
        took = time.monotonic() - started
    finally:
        remote_site.start_sshd()
    assert res.returncode == 255 and "Connection refused" in res.stderr, res.stderr
    assert took < 5
    res = remote_site.ssh("id", "-un")
    assert (res.returncode, res.stdout.strip()) == (0, remote_site.user), res.stderr
