"""Remote clusters without a connection: SSH destinations and options, the command line the cluster's shell
runs, ssh's complaints in one line, the shipped code's hash, forwarding, and composing a run for a cluster
whose paths are its own (the real SSH server's tests are tests/cluster/test_remote.py)."""
from __future__ import annotations

import io
import json
import shlex
import shutil
import tarfile
import tempfile
from pathlib import Path

import pytest

from launcher.errors import LaunchError
from launcher.remote import ship
from launcher.remote.clusters import cluster_of_runs, remember, remotes
from launcher.remote.forward import without_option
from launcher.remote.ssh import Remote, destination, options, remote_command, why_unreachable

SITE = Remote("site", "me@login.site.edu", 5.0, "/opt/venv/bin/python", "/etc/slurm/slurm.conf", "/scratch/me/runs")


@pytest.mark.parametrize("given, args", [
    ("login", ["--", "login"]),
    ("me@login.site.edu", ["--", "me@login.site.edu"]),
    ("ssh://me@login.site.edu:2222", ["-p", "2222", "--", "me@login.site.edu"]),
    ("ssh://login.site.edu", ["--", "login.site.edu"]),
])
def test_destinations(given, args):
    assert destination(Remote("site", given)) == args


@pytest.mark.parametrize("bad", ["-oProxyCommand=evil", "me@host;rm -rf ~", "host name", "", "ssh://me@host:port"])
def test_a_destination_that_is_not_one_is_refused_in_one_line(bad):
    with pytest.raises(LaunchError) as err:
        destination(Remote("site", bad))
    assert "cluster.ssh=" in err.value.message and "~/.ssh/config alias, user@host" in err.value.message


def test_every_command_rides_the_clusters_master_and_never_prompts(monkeypatch):
    tmp_path = Path(tempfile.mkdtemp(prefix="h", dir="/tmp"))  # short enough for a socket's path
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / "h"))
    opts = options(SITE)
    assert ["-o", "ControlMaster=auto"] == opts[0:2] and "BatchMode=yes" in opts and "ConnectTimeout=5" in opts
    control = next(o for o in opts if o.startswith("ControlPath="))
    assert control == f"ControlPath={tmp_path / 'h' / 'ssh'}/%C"
    assert (tmp_path / "h" / "ssh").stat().st_mode & 0o777 == 0o700
    assert "BatchMode=yes" not in options(SITE, batch=False)  # launcher login: the prompt is answered there
    monkeypatch.setenv("LAUNCHER_SSH_CONFIG", "/my/ssh_config")
    assert options(SITE)[:2] == ["-F", "/my/ssh_config"]
    shutil.rmtree(tmp_path)


def test_a_long_home_puts_the_sockets_where_a_socket_path_fits(tmp_path, monkeypatch):
    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path / ("x" * 90)))
    control = next(o for o in options(SITE) if o.startswith("ControlPath=")).split("=", 1)[1]
    assert len(control.replace("%C", "c" * 40)) <= 100


def test_the_remote_command_is_quoted_word_by_word():
    line = remote_command(SITE, ["python", "-m", "launcher", "describe", "a b; rm -rf ~"], {"X": "1 2"})
    assert shlex.split(line) == ["env", "X=1 2", "python", "-m", "launcher", "describe", "a b; rm -rf ~"]


@pytest.mark.parametrize("stderr, said", [
    ("me@login: Permission denied (publickey,keyboard-interactive).", "run 'launcher login site'"),
    ("Host key verification failed.", "the launcher never accepts one for you"),
    ("ssh: connect to host login port 22: Connection refused", "is unreachable: ssh: connect to host login"),
    ("", "is unreachable: ssh exited with status 255"),
])
def test_what_ssh_said_is_one_line_with_what_to_do(stderr, said):
    text = why_unreachable(SITE, stderr)
    assert said in text and "\n" not in text and text.startswith("cluster site (me@login.site.edu)")


def test_the_shipped_code_is_named_by_its_contents():
    files = ship.code_files()
    assert "launcher/remote/agent.py" in files and "launcher/train/task.py" in files
    assert any(name.endswith("cluster/local.yaml") for name in files)
    assert not any("__pycache__" in name for name in files)
    assert ship.code_hash() == ship.code_hash() and len(ship.code_hash()) == 20
    assert ship.code_path() == f".launcher/code/{ship.code_hash()}"


def test_the_launcher_runs_there_with_the_clusters_python_and_paths():
    argv = ship.launcher_argv(SITE, "launcher", ["runs", "--json"])
    script = argv[2]
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["sh", "/opt/venv/bin/python", "-m", "launcher", "runs", "--json"]
    assert script.startswith(f"test -d {ship.code_path()} || exit {ship.MISSING};")
    assert f"PYTHONPATH={ship.code_path()}" in script and "SLURM_CONF=/etc/slurm/slurm.conf" in script
    assert "LAUNCHER_RUN_ROOT=/scratch/me/runs" in script


def test_cluster_option_is_dropped_when_forwarded():
    assert without_option(["logs", "r1", "--cluster", "site", "--follow"], "--cluster") == ["logs", "r1", "--follow"]
    assert without_option(["describe", "--cluster=site", "r1"], "--cluster") == ["describe", "r1"]


def test_remote_runs_are_found_by_name_or_unique_prefix(tmp_path, monkeypatch):
    from launcher.core.run_index import RunRecord

    monkeypatch.setenv("LAUNCHER_HOME", str(tmp_path))
    record = dict(model="gpt_tiny", gpus=2, nodes=1, gpus_per_node=2, steps=10, cluster="site", submitted_at=1.0,
                  job_id="7")
    remember("site", [RunRecord(name="alpha-1", run_dir="/r/alpha-1", **record),
                      RunRecord(name="alpha-2", run_dir="/r/alpha-2", **record)])
    remember("other", [RunRecord(name="beta", run_dir="/r/beta", **record)])
    assert json.loads((tmp_path / "remote-runs.json").read_text()) == {"alpha-1": "site", "alpha-2": "site",
                                                                        "beta": "other"}
    assert cluster_of_runs(["alpha-1"]) == "site" and cluster_of_runs(["alpha-1", "alpha-2"]) == "site"
    assert cluster_of_runs(["alpha"]) is None  # ambiguous
    assert cluster_of_runs(["alpha-1", "beta"]) is None and cluster_of_runs(["gamma"]) is None


def test_remote_clusters_are_the_cluster_files_that_name_ssh(tmp_path, monkeypatch):
    site = tmp_path / "site" / "cluster"
    site.mkdir(parents=True)
    (site / "far.yaml").write_text("name: far\nssh: ssh://me@far:2200\npython: /opt/py\nssh_timeout_s: 3\n")
    (site / "near.yaml").write_text("name: near\nslurm_conf: /etc/slurm.conf\n")
    monkeypatch.setenv("LAUNCHER_SITE_CONFIG", str(tmp_path / "site"))
    assert remotes() == [Remote("far", "ssh://me@far:2200", 3.0, "/opt/py", None, None)]


def test_a_run_for_a_remote_cluster_keeps_the_clusters_paths(tmp_path, monkeypatch):
    """Composed here, but its run root, data and slurm.conf are the cluster's: not made absolute here, and not
    $LAUNCHER_RUN_ROOT (this machine's)."""
    from launcher.compose.composer import compose_runs

    site = tmp_path / "site" / "cluster"
    site.mkdir(parents=True)
    (site / "far.yaml").write_text("name: far\nssh: far\nslurm_conf: etc/slurm.conf\nvirtual_gpus: true\n")
    monkeypatch.setenv("LAUNCHER_SITE_CONFIG", str(tmp_path / "site"))
    monkeypatch.setenv("LAUNCHER_RUN_ROOT", str(tmp_path / "here"))
    (run,) = compose_runs(["cluster=far", "gpus=8", "model=gpt_tiny", "data.path=tokens/shards"])
    assert run.config.cluster.ssh == "far" and run.config.run_root == "~/.launcher/runs"
    assert run.config.data.path == "tokens/shards" and run.config.cluster.slurm_conf == "etc/slurm.conf"
    assert run.data.source == "tokens/shards on cluster far" and run.data.tokens is None
    (scratch,) = compose_runs(["cluster=far", "gpus=8", "model=gpt_tiny", "cluster.run_root=/scratch/me"])
    assert scratch.config.run_root == "/scratch/me"


def tar_stream(*members: tuple[tarfile.TarInfo, bytes]) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w|") as archive:
        for info, data in members:
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    return buffer


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mode = kind, link, 0o644
    return info


def test_a_fetched_folder_is_written_as_plain_files_on_any_python(tmp_path):
    # As tarfile's filter="data" would, on a Python without it (Debian 12's 3.11.2): an export copied with
    # --to-local hung there, its extraction raising while the cluster's end still wrote (launcher/remote/ship.py).
    source = tar_stream((member("far-hf", tarfile.DIRTYPE), b""), (member("far-hf/config.json"), b"{}"),
                        (member("far-hf/deep/model.safetensors"), b"x" * 70_000))
    assert ship.unpack(source, tmp_path) == "far-hf"
    assert (tmp_path / "far-hf" / "config.json").read_bytes() == b"{}"
    assert (tmp_path / "far-hf" / "deep" / "model.safetensors").read_bytes() == b"x" * 70_000


@pytest.mark.parametrize("bad", [member("far-hf/link", tarfile.SYMTYPE, "/etc/passwd"),
                                 member("far-hf/hard", tarfile.LNKTYPE, "far-hf/config.json"),
                                 member("far-hf/../../outside"), member("/abs/file"),
                                 member("far-hf/dev", tarfile.CHRTYPE)], ids=["symlink", "hardlink", "up", "absolute",
                                                                           "device"])
def test_anything_but_files_and_folders_inside_the_copy_is_refused_in_one_line(tmp_path, bad):
    into = tmp_path / "into"
    source = tar_stream((member("far-hf", tarfile.DIRTYPE), b""), (bad, b""))
    with pytest.raises(LaunchError) as err:
        ship.unpack(source, into)
    assert err.value.message == (f"refused to copy {bad.name!r}: only files and folders inside the copied folder are "
                                 "copied")
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["far-hf", "into"]
