"""On the local cluster: the run's code read once per node (launcher/job/stage.py). Sixteen ranks on two nodes of a
cluster of the test's own open a few files of the run's frozen copy with staging and a thousand without, and train
to the same losses; a node whose memory is full falls back to the frozen copy, recorded, and a damaged archive is
made again (the archive, the script's lines and the sweep: tests/unit/test_stage.py).

Opens are counted with inotify (IN_OPEN on every folder of the frozen copy, and on the archive) from the job's
release to its end, the frozen copy compiled beforehand as after a run's first job."""
from __future__ import annotations

import compileall
import ctypes
import json
import os
import re
import select
import struct
import subprocess
import threading
import zipfile
from pathlib import Path

from support.helpers import events, job_id_of, losses
from launcher.core.plan import read_plan
from launcher.core.rundir import CODE_ARCHIVE, code_archive, code_dir
from launcher.job import stage

IN_OPEN, IN_CREATE, IN_ISDIR, IN_NONBLOCK = 0x20, 0x100, 0x40000000, 0o4000
EVENT = struct.Struct("iIII")  # struct inotify_event: wd, mask, cookie, len; then len bytes of name
RUN = ("model=gpt_tiny", "gpus=16", "train.steps=2", "train.log_every=1", "+cluster.sbatch_flags.hold=true")


class Opens:
    """Counts the opens of files and folders under a run's frozen copy, and of its archive, while in its ``with``."""

    def __init__(self, run_dir: Path) -> None:
        self.libc = ctypes.CDLL(None, use_errno=True)
        self.fd, self.count, self.folders, self.done = self.libc.inotify_init1(IN_NONBLOCK), 0, {}, threading.Event()
        self.archive = self.libc.inotify_add_watch(self.fd, str(run_dir).encode(), IN_OPEN)
        for folder, _, _ in os.walk(code_dir(run_dir)):
            self.watch(folder)
        self.reader = threading.Thread(target=self.read, daemon=True)

    def watch(self, folder: str) -> None:
        self.folders[self.libc.inotify_add_watch(self.fd, folder.encode(), IN_OPEN | IN_CREATE)] = folder

    def read(self) -> None:
        while not self.done.is_set():
            if select.select([self.fd], [], [], 0.2)[0]:
                data, at = os.read(self.fd, 1 << 16), 0
                while at < len(data):
                    wd, mask, _, size = EVENT.unpack_from(data, at)
                    name = data[at + EVENT.size:at + EVENT.size + size].rstrip(b"\0").decode()
                    at += EVENT.size + size
                    if mask & IN_CREATE and mask & IN_ISDIR and wd in self.folders:
                        self.watch(os.path.join(self.folders[wd], name))
                    elif mask & IN_OPEN and (wd in self.folders or name == CODE_ARCHIVE):
                        self.count += 1

    def __enter__(self) -> "Opens":
        self.reader.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.done.set()
        self.reader.join()
        os.close(self.fd)


def counted_run(cluster, root: Path, name: str, *args: str) -> tuple[Path, int]:
    """A held run of ``RUN`` released once its frozen copy is compiled and watched: its directory and the opens under
    its frozen copy and of its archive until its job ended."""
    res = cluster.launcher(*RUN, f"name={name}", *args, root=root)
    assert res.returncode == 0, res.stderr
    job, run_dir = job_id_of(res.stdout), root / name
    compileall.compile_dir(str(code_dir(run_dir)), quiet=1)
    with Opens(run_dir) as opens:
        cluster.run("scontrol", "release", job)
        assert cluster.wait(job, timeout=300) == "COMPLETED"
    return run_dir, opens.count


def test_sixteen_ranks_on_two_nodes_read_the_code_once_per_node_and_train_as_without(own_cluster, tmp_path):
    run_dir, staged = counted_run(own_cluster, tmp_path, "g16", "cluster.stage_code=true")
    plain, unstaged = counted_run(own_cluster, tmp_path, "plain", "cluster.stage_code=false")
    print(f"opens under the frozen copy: {staged} staged, {unstaged} without")
    assert staged < 200 and unstaged > 3 * staged
    assert losses(run_dir) == losses(plain) and len(losses(run_dir)) == 2
    (started,) = [e for e in events(run_dir) if e["event"] == "started"]
    assert re.fullmatch(rf"/dev/shm/launcher-{os.geteuid()}/code-[0-9a-f]{{12}}-\d+\.zip", started["staged"])
    assert started["code"] == str(code_dir(run_dir)) and not [e for e in events(run_dir) if "staged" in e["event"]]
    assert [e["staged"] for e in events(plain) if e["event"] == "started"] == [None]
    os.unlink(started["staged"])  # the node's memory is the machine's: not left for a later job's sweep

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


def test_a_node_whose_memory_is_full_falls_back_and_a_damaged_archive_is_made_again(slurm, tmpfs, tmp_path):
    place = tmpfs("64k")
    subprocess.run(["dd", "if=/dev/zero", f"of={place}/filler", "bs=4k"], capture_output=True)  # the memory is full
    res = slurm.launcher("model=gpt_tiny", "gpus=1", "train.steps=2", "cluster.stage_code=true", "name=full",
                         f"+cluster.env.LAUNCHER_LOCAL_DIR={place}", "+cluster.sbatch_flags.hold=true",
                         root=tmp_path / "runs")
    assert res.returncode == 0, res.stderr
    job, run_dir = job_id_of(res.stdout), tmp_path / "runs" / "full"
    data = bytearray(code_archive(run_dir).read_bytes())
    member = zipfile.ZipFile(code_archive(run_dir)).infolist()[3]
    data[member.header_offset + 30 + len(member.filename) + 4] ^= 0xFF  # in its compressed bytes
    code_archive(run_dir).write_bytes(bytes(data))
    slurm.run("scontrol", "release", job)
    assert slurm.wait(job, timeout=300) == "COMPLETED"
    (said,) = [e for e in events(run_dir) if e["event"] == "code_not_staged"]
    assert (said["errno"], said["error"]) == ("ENOSPC", "[Errno 28] No space left on device")
    assert said["node"] in slurm.nodes and said["path"].startswith(f"{place}/launcher-{os.geteuid()}/code-")
    assert stage.problem(code_archive(run_dir).read_bytes(), run_dir) is None
    assert [e["staged"] for e in events(run_dir) if e["event"] == "started"] == [None]
