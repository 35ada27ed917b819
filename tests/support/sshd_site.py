"""A real OpenSSH site for the tests of remote clusters: an sshd of our own on 127.0.0.1, a second Unix user whose
sessions reach the suite's local Slurm cluster, and an ssh_config that names the site, so that a test speaks to it
as the launcher speaks to a cluster it reaches over SSH (``ssh -F CONFIG testsite COMMAND``).

Needs root (a user, an ACL, sshd itself) and the Debian packages openssh-server and acl (scripts/setup.sh). The
user stays after a session (making it again is a no-op); the session's key, configs and sshd go with it."""
from __future__ import annotations

import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from support.helpers import REPO, cluster_port, wait_for

SSHD = "/usr/sbin/sshd"
USER = "lremote"
ALIAS = "testsite"
PRIVSEP_DIR = Path("/run/sshd")  # sshd refuses to start without it; the package leaves it to its service to make


def run(*cmd: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run a set-up command as root; fail naming it and what it said."""
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, f"{shlex.join(cmd)} exited {res.returncode}: {res.stderr.strip()}"
    return res


def ensure_user(name: str) -> Path:
    """The user ``name`` with a home and bash (made once per machine; a second session reuses it); its home."""
    try:
        pwd.getpwnam(name)
    except KeyError:
        made = subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name], capture_output=True,
                              text=True)
        assert made.returncode in (0, 9), f"useradd {name}: {made.stderr.strip()}"  # 9: a session beside made it
    # sshd without PAM refuses a locked account, and useradd's "!" (no password) reads as locked; "*" is no
    # password either, but not locked.
    run("usermod", "--shell", "/bin/bash", "--password", "*", name)
    return Path(pwd.getpwnam(name).pw_dir)


def let_reach(user: str, paths: list[Path]) -> None:
    """Give ``user`` the right to pass through each folder on the way to ``paths`` that it may not yet pass (an
    ACL for that user alone, left in place): a virtual environment's interpreter under /root (pyenv) is out of
    reach of other users, and the remote side runs its Python there."""
    folders = sorted({folder for path in paths for folder in (path, *path.parents) if folder.is_dir()},
                     key=lambda folder: len(folder.parts))  # each folder's parents before it
    assert shutil.which("setfacl"), "setfacl is not installed (run scripts/setup.sh)"
    for folder in folders:
        if subprocess.run(["runuser", "-u", user, "--", "test", "-x", str(folder)]).returncode != 0:
            run("setfacl", "-m", f"u:{user}:x", str(folder))


def install_key(keys: Path, user: str, public_key: str) -> None:
    """Write ``public_key`` as the authorized key file ``keys`` (in ``user``'s ~/.ssh) as StrictModes wants it: owned
    by the user, no one else may write it or its folder."""
    pw = pwd.getpwnam(user)
    keys.parent.mkdir(mode=0o700, exist_ok=True)
    keys.write_text(public_key)
    for path, mode in ((keys.parent, 0o700), (keys, 0o600)):
        os.chown(path, pw.pw_uid, pw.pw_gid)
        path.chmod(mode)


def keygen(path: Path) -> str:
    """A new ed25519 key pair at ``path`` (and ``path``.pub), no passphrase; the public key's line."""
    run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", path.name, "-f", str(path))
    return path.with_suffix(".pub").read_text()


def sshd_config(port: int, host_key: Path, pid_file: Path, keys_name: str, user: str) -> str:
    """Keys alone, for one user, on the loopback only; the rest sshd's defaults."""
    return "\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f'HostKey "{host_key}"', f'PidFile "{pid_file}"',
        "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        f"AuthorizedKeysFile .ssh/{keys_name}", "StrictModes yes", f"AllowUsers {user}", "PermitRootLogin no",
        "PrintMotd no", "Subsystem sftp internal-sftp", ""])


def ssh_config(alias: str, port: int, user: str, identity: Path, known_hosts: Path) -> str:
    """The client's view of the site: one Host, its key alone, its host key known and checked."""
    return "\n".join([
        f"Host {alias}", "  HostName 127.0.0.1", f"  Port {port}", f"  User {user}", f'  IdentityFile "{identity}"',
        "  IdentitiesOnly yes", f'  UserKnownHostsFile "{known_hosts}"', "  GlobalKnownHostsFile /dev/null",
        "  StrictHostKeyChecking yes", "  BatchMode yes", ""])


class Sshd:
    """Our sshd: started in a session of its own, stopped by the pid we started (its PidFile names it to a later
    session should this one die before it stops it)."""

    def __init__(self, config: Path, log: Path, pid_file: Path, port: int):
        self.config, self.log, self.pid_file, self.port = config, log, pid_file, port
        self.process: subprocess.Popen | None = None

    def start(self, timeout: float = 30) -> None:
        assert self.process is None, "sshd is already running"
        self._stop_left_over()
        assert not self._answers(), f"port {self.port} is taken by a process not ours"
        PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        with open(self.log, "a") as log:
            self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)], stdin=subprocess.DEVNULL,
                                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(self._serving, timeout, f"sshd on port {self.port}", interval=0.1)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def _serving(self) -> bool:
        """Whether sshd answers with its banner; fails with its log if it has died."""
        if self.process.poll() is not None:
            self.process = None
            raise AssertionError(f"sshd exited at start-up; {self.log}:\n{self.log.read_text()[-2000:]}")
        return self._answers()

    def _answers(self) -> bool:
        """Whether an SSH server answers on the port."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                return conn.recv(64).startswith(b"SSH-2.0-")
        except OSError:
            return False

    def _stop_left_over(self) -> None:
        """A session killed before its teardown leaves its sshd on our port: stop it, if the pid file still names
        an sshd started as we start ours (its title, which sshd rewrites, still shows how)."""
        try:
            pid = int(self.pid_file.read_text())
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError):
            return
        if f"{SSHD} -D -e -f " in title:
            os.kill(pid, signal.SIGTERM)
            wait_for(lambda: not Path(f"/proc/{pid}").exists(), 10, f"end of the left-over sshd {pid}")


@dataclass(frozen=True)
class RemoteSite:
    """A site reached over SSH: ``ssh -F ssh_config alias`` logs in as ``user`` (home ``home``) on ``port``, with
    the session's own key; ``state`` holds the keys, configs and sshd's log. Slurm's tools find the suite's cluster
    when given ``SLURM_CONF=slurm_conf`` (an SSH session has no environment of ours); ``python`` is an interpreter
    the user can run."""

    user: str
    home: Path
    ssh_config: Path
    alias: str
    port: int
    state: Path
    slurm_conf: Path
    python: Path
    sshd: Sshd = field(repr=False, compare=False)

    def ssh(self, *remote_argv: str, input: str | None = None, timeout: float = 60,
            options: tuple = ()) -> subprocess.CompletedProcess:
        """Run ``remote_argv`` on the site as its user: each word is quoted for the remote shell, so it arrives as
        given. ``options`` go to ssh before the alias."""
        cmd = ["ssh", "-F", str(self.ssh_config), "-o", "BatchMode=yes", *options, self.alias, "--",
               shlex.join(remote_argv)]
        return subprocess.run(cmd, input=input, stdin=subprocess.DEVNULL if input is None else None,
                              capture_output=True, text=True, timeout=timeout)

    def slurm(self, *argv: str, **kwargs) -> subprocess.CompletedProcess:
        """A Slurm tool run on the site against the suite's cluster, as the launcher runs one: SLURM_CONF passed."""
        return self.ssh("env", f"SLURM_CONF={self.slurm_conf}", *argv, **kwargs)

    def stop_sshd(self) -> None:
        self.sshd.stop()

    def start_sshd(self) -> None:
        self.sshd.start()


def add_to_accounting(env: dict, user: str) -> None:
    """Give ``user`` an association on the cluster (under its one account, root's), as a site gives its users:
    then sbatch is accepted where associations are enforced, and sacct names an account. Nothing on a cluster
    without accounting, or where the user has one already."""
    conf = Path(env["SLURM_CONF"]).read_text()
    if "AccountingStorageType=accounting_storage/slurmdbd" not in conf:
        return
    cluster = re.search(r"^ClusterName=(\S+)", conf, re.M).group(1)

    def sacctmgr(*args: str) -> str:
        res = subprocess.run(["sacctmgr", *args], env=env, capture_output=True, text=True, timeout=60)
        assert res.returncode == 0, f"sacctmgr {shlex.join(args)}: {res.stderr.strip() or res.stdout.strip()}"
        return res.stdout

    if not sacctmgr("-n", "-P", "show", "assoc", f"user={user}", f"cluster={cluster}", "format=user").strip():
        sacctmgr("-i", "add", "user", user, "account=root", f"cluster={cluster}")


@contextmanager
def started_site(env: dict, state: Path, user: str = USER, alias: str = ALIAS):
    """Start the site in ``state`` for the cluster of ``env`` (its SLURM_CONF); yield a RemoteSite that works (its
    user logs in, runs the suite's interpreter and reaches the cluster); stop it and remove its files afterwards,
    its user's key for this session included."""
    port = cluster_port("sshd")
    home = ensure_user(user)
    python, slurm_conf = Path(sys.executable), Path(env["SLURM_CONF"])
    let_reach(user, [python, python.resolve(), Path(sys.prefix), Path(sys.base_prefix), REPO, slurm_conf.parent])
    add_to_accounting(env, user)
    # A key file of this port's own: suites of other checkouts (other ports) may use the same user at once.
    keys = home / ".ssh" / f"authorized_keys.sshd-site-{port}"
    pid_file = Path(tempfile.gettempdir()) / f"sshd-site-{port}.pid"
    sshd = Sshd(state / "sshd_config", state / "sshd.log", pid_file, port)
    site = RemoteSite(user=user, home=home, ssh_config=state / "ssh_config", alias=alias, port=port, state=state,
                      slurm_conf=slurm_conf, python=python, sshd=sshd)
    try:
        install_key(keys, user, keygen(state / "client_key"))
        host_key = keygen(state / "host_key").split()
        (state / "known_hosts").write_text(f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}\n")
        sshd.config.write_text(sshd_config(port, state / "host_key", pid_file, keys.name, user))
        site.ssh_config.write_text(ssh_config(alias, port, user, state / "client_key", state / "known_hosts"))
        sshd.start()
        check_usable(site)
        yield site
    finally:
        sshd.stop()
        keys.unlink(missing_ok=True)
        shutil.rmtree(state, ignore_errors=True)


def check_usable(site: RemoteSite) -> None:
    """Fail at set-up, saying why, where the user cannot log in, run the interpreter, or reach the cluster: a test
    on the site would fail later and less clearly."""
    res = site.ssh(str(site.python), "-c", "import sys, launcher; print(sys.prefix)")
    assert res.returncode == 0 and res.stdout.strip() == sys.prefix, \
        f"{site.user} cannot run {site.python} over ssh: {res.stderr.strip()}\n{site.sshd.log.read_text()[-2000:]}"
    res = site.slurm("scontrol", "ping")
    assert res.returncode == 0 and "UP" in res.stdout, \
        f"{site.user} cannot reach the cluster of {site.slurm_conf}: {res.stdout.strip()} {res.stderr.strip()}"
