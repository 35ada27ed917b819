"""On the local cluster: the run's code and the tasks' environment read once per node (launcher/job/stage.py,
launcher/job/stage_env.py). Sixteen ranks on two nodes of a cluster of the test's own open a few files of the run's
frozen copy and of the environment's torch package with staging, and thousands without, and train to the same losses;
a damaged archive of the environment is made again; a node whose memory is full falls back to the frozen copy and the
shared environment, recorded, and a damaged code archive is made again (the archives, the script's lines and the
sweeps: tests/unit/test_stage.py).

Opens are counted with inotify (IN_OPEN on every folder of the frozen copy and of the environment's torch package, and
on the code's archive) from the job's release to its end, the frozen copy compiled beforehand as after a run's first
job. The environment is a venv of the tasks' packages, hard links to the suite's, so that packing it reads a GB, not
the suite's whole environment."""
from __future__ import annotations

import compileall
import ctypes
import json
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import sysconfig
import threading
import zipfile
from pathlib import Path

import pytest

from support.helpers import events, job_id_of, losses
from launcher.core.plan import read_plan
from launcher.core.rundir import CODE_ARCHIVE, code_archive, code_dir
from launcher.job import stage, stage_env

IN_OPEN, IN_CREATE, IN_ISDIR, IN_NONBLOCK = 0x20, 0x100, 0x40000000, 0o4000
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
RUN = ("model=gpt_tiny", "gpus=16", "train.steps=2", "train.log_every=1", "+cluster.sbatch_flags.hold=true")


class Opens:
    """Counts the opens of files and folders under each of ``trees`` (and of a run's code archive, counted with the
    first tree) while in its ``with``."""

    def __init__(self, *trees: Path) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd, self.counts, self.folders, self.done = self.libc.inotify_init1(IN_NONBLOCK), [0] * len(trees), {}, \
            threading.Event()
        self.libc.inotify_add_watch(self.fd, str(trees[0].parent).encode(), IN_OPEN)  # the run directory's archive
        for index, tree in enumerate(trees):
            for folder, _, _ in os.walk(tree):
                self.watch(folder, index)
        self.reader = threading.Thread(target=self.read, daemon=True)

    def watch(self, folder: str, tree: int) -> None:
        self.folders[self.libc.inotify_add_watch(self.fd, folder.encode(), IN_OPEN | IN_CREATE)] = (folder, tree)

    def read(self) -> None:
        while not self.done.is_set():
            if select.select([self.fd], [], [], 0.2)[0]:
                data, at = os.read(self.fd, 1 << 16), 0
                while at < len(data):
                    wd, mask, _, size = EVENT.unpack_from(data, at)
                    name = data[at + EVENT.size:at + EVENT.size + size].rstrip(b"\0").decode()
                    at += EVENT.size + size
                    if mask & IN_CREATE and mask & IN_ISDIR and wd in self.folders:
                        self.watch(os.path.join(self.folders[wd][0], name), self.folders[wd][1])
                    elif mask & IN_OPEN and wd in self.folders:
                        self.counts[self.folders[wd][1]] += 1
                    elif mask & IN_OPEN and name == CODE_ARCHIVE:
                        self.counts[0] += 1

    def __enter__(self) -> "Opens":
        while select.select([self.fd], [], [], 0)[0]:  # the watches' own walk opened every folder: not counted
            os.read(self.fd, 1 << 16)
        self.reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.reader.join()
        os.close(self.fd)


# What a rank imports from the environment (the probe's packages), and torch's own requirements it may import later.
PROBE = ("import sys, sysconfig; import launcher.job.task, launcher.job.entry, launcher.train.task; "
         "site = sysconfig.get_paths()['purelib'] + '/'; print(*{m.__file__[len(site):].split('/')[0] for m in "
         "list(sys.modules.values()) if (getattr(m, '__file__', None) or '').startswith(site)})")
TORCH_NEEDS = ("filelock", "fsspec", "jinja2", "markupsafe", "networkx", "sympy", "mpmath", "typing_extensions.py",
               "numpy.libs")


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A venv of the tasks' packages: hard links to the suite's (its site-packages), its own interpreter's prefix."""
    prefix = tmp_path_factory.mktemp("envs") / "train"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    (site,) = prefix.glob("lib/python3*/site-packages")
    suite = Path(sysconfig.get_paths()["purelib"])
    names = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True).stdout.split()
    for name in {*names, *TORCH_NEEDS} - {name for name in names if name.startswith("__editable__")}:
        if (suite / name).exists():
            subprocess.run(["cp", "-al", str(suite / name), str(site / name)], check=True)
    return prefix


def counted_run(cluster, root: Path, name: str, venv: Path, *args: str) -> tuple[Path, list]:
    """A held run of ``RUN`` with ``venv``'s Python, released once its frozen copy is compiled and watched: its
    directory and the opens under its frozen copy (and of its archive) and under the environment's torch package until
    its job ended."""
    res = cluster.launcher(*RUN, f"name={name}", f"cluster.python={venv}/bin/python", *args, root=root)
    assert res.returncode == 0, res.stderr
    job, run_dir = job_id_of(res.stdout), root / name
    compileall.compile_dir(str(code_dir(run_dir)), quiet=1)
    (torch,) = venv.glob("lib/python3*/site-packages/torch")
    with Opens(code_dir(run_dir), torch) as opens:
        cluster.run("scontrol", "release", job)
        assert cluster.wait(job, timeout=300) == "COMPLETED"
    return run_dir, opens.counts


def test_sixteen_ranks_on_two_nodes_read_the_code_and_environment_once_per_node_and_train_as_without(
        own_cluster, venv, tmp_path):
    run_dir, (code, torch) = counted_run(own_cluster, tmp_path, "g16", venv, "cluster.stage_code=true",
                                         "cluster.stage_env=true")
    plain, (code_plain, torch_plain) = counted_run(own_cluster, tmp_path, "plain", venv, "cluster.stage_code=false")
    print(f"opens under the frozen copy: {code} staged, {code_plain} without; under torch: {torch} staged, "
          f"{torch_plain} without")
    assert code < 200 and code_plain > 3 * code and torch < 64 and torch_plain > 1000
    assert losses(run_dir) == losses(plain) and len(losses(run_dir)) == 2
    (started,) = [e for e in events(run_dir) if e["event"] == "started"]
    assert re.fullmatch(rf"/dev/shm/launcher-{os.geteuid()}/code-[0-9a-f]{{12}}-\d+\.zip", started["staged"])
    assert re.fullmatch(rf"/dev/shm/launcher-{os.geteuid()}/env-[0-9a-f]{{16}}/bin/python", started["python"])
    (staged,) = [e for e in events(run_dir) if e["event"] == "env_staged"]  # the launch packed it: no env_packed
    assert staged["python"] == started["python"] and not [e for e in events(run_dir) if e["event"] == "env_packed"]
    assert started["code"] == str(code_dir(run_dir)) and not [e for e in events(run_dir) if "not_staged" in e["event"]]
    assert [(e["staged"], e["python"]) for e in events(plain) if e["event"] == "started"] == [
        (None, f"{venv}/bin/python")]
    os.unlink(started["staged"])  # the node's memory is the machine's: not left for a later job's sweep
    shutil.rmtree(Path(started["python"]).parents[1])

    plan = read_plan(run_dir)  # the layout: two nodes of eight ranks in one group
    assert (plan.nodes, plan.tasks_per_node, plan.world_size) == (2, 8, 16)
    assert "#SBATCH --nodes=2" in (run_dir / "sbatch.sh").read_text()
    assert (run_dir / "config.yaml").read_text().count("name: g16") == 1
    nodes_of_rank = {}
    for rank in range(16):
        log = (run_dir / "logs" / f"rank_{rank}.log").read_text()
        m = re.search(rf"rank {rank}/16 local (\d+) node (\S+) device cpu threads 1 allreduce (\d+) ok", log)
        assert m, f"rank {rank} did not report its all-reduce check"
        assert int(m.group(3)) == sum(range(1, 17))  # every rank contributed rank+1
        assert int(m.group(1)) == rank % 8
        nodes_of_rank[rank] = m.group(2)
    assert sorted(set(nodes_of_rank.values())) == own_cluster.nodes
    assert {nodes_of_rank[r] for r in range(8)} != {nodes_of_rank[r] for r in range(8, 16)}
    record = json.loads((run_dir / "run.json").read_text())
    assert (record["name"], record["gpus"], record["nodes"]) == ("g16", 16, 2)


def test_a_node_whose_memory_is_full_falls_back_and_a_damaged_archive_is_made_again(slurm, tmpfs, venv, tmp_path):
    place = tmpfs("64k")
    subprocess.run(["dd", "if=/dev/zero", f"of={place}/filler", "bs=4k"], capture_output=True)  # the memory is full
    res = slurm.launcher("model=gpt_tiny", "gpus=1", "train.steps=2", "cluster.stage_code=true", "name=full",
                         "cluster.stage_env=true", f"cluster.python={venv}/bin/python",
                         f"+cluster.env.LAUNCHER_LOCAL_DIR={place}", "+cluster.sbatch_flags.hold=true",
                         root=tmp_path / "runs")
    assert res.returncode == 0, res.stderr
    job, run_dir = job_id_of(res.stdout), tmp_path / "runs" / "full"
    data = bytearray(code_archive(run_dir).read_bytes())
    member = zipfile.ZipFile(code_archive(run_dir)).infolist()[3]
    data[member.header_offset + 30 + len(member.filename) + 4] ^= 0xFF  # in its compressed bytes
    code_archive(run_dir).write_bytes(bytes(data))
    (archive,) = (venv / stage_env.FOLDER).glob("env-*.tar")  # and the environment's
    with open(archive, "r+b") as file:
        file.seek(archive.stat().st_size // 2)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    slurm.run("scontrol", "release", job)
    assert slurm.wait(job, timeout=300) == "COMPLETED"
    (said,) = [e for e in events(run_dir) if e["event"] == "code_not_staged"]
    assert (said["errno"], said["error"]) == ("ENOSPC", "[Errno 28] No space left on device")
    assert said["node"] in slurm.nodes and said["path"].startswith(f"{place}/launcher-{os.geteuid()}/code-")
    assert stage.problem(code_archive(run_dir).read_bytes(), run_dir) is None
    (packed,) = [e for e in events(run_dir) if e["event"] == "env_packed"]
    assert packed["archive"] == str(archive) and packed["why"].startswith("damaged (its sha256 is "), packed
    assert stage_env.problem(stage_env.Environment(venv, venv / "bin/python", None, packed["version"])) is None
    (env,) = [e for e in events(run_dir) if e["event"] == "env_not_staged"]
    assert (env["node"], env["errno"]) == (said["node"], "ENOSPC") and " GB to unpack, 0.00 GB free" in env["error"]
    assert env["path"].startswith(f"{place}/launcher-{os.geteuid()}/env-")
    assert [(e["staged"], e["python"]) for e in events(run_dir) if e["event"] == "started"] == [
        (None, f"{venv}/bin/python")]
