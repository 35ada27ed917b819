"""The run's code staged once per node (launcher/job/stage.py), without Slurm: the archive and what a rank importing it
sees (a traceback names the frozen file and line), the batch host's step with a stand-in srun that runs the node's
part here, a damaged archive made again, a node that cannot stage recorded, and the sweep of ended jobs' copies."""
from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import time
import zipfile
from pathlib import Path

import pytest

from support.helpers import events
from launcher.compose.composer import compose_runs
from launcher.core.rundir import SOURCE_ROOT, code_archive, code_dir
from launcher.core import nodelocal
from launcher.errors import LaunchError
from launcher.job import stage, stage_env
from launcher.slurm.batch import render_sbatch
from launcher.submit.checks import pack_environment

BOOM = 'import os\n\n\ndef go():\n    raise RuntimeError("boom from the frozen copy")\n'
LOGGED = "import traceback\ntry: b.go()\nexcept RuntimeError: traceback.print_exc()"  # as a rank's log has it


@pytest.fixture
def run_dir(tmp_path) -> Path:
    """A run whose frozen copy holds a package and a module whose function raises, and its archive."""
    run = tmp_path / "run"
    for name, text in {"launcher/__init__.py": "", "launcher/core/__init__.py": "", "launcher/core/boom.py": BOOM,
                       "conf/config.yaml": "a: 1\n"}.items():
        (code_dir(run) / name).parent.mkdir(parents=True, exist_ok=True)
        (code_dir(run) / name).write_text(text)
    stage.pack(run)
    return run


def python(code: str, path: Path) -> subprocess.CompletedProcess:
    """A Python as a rank starts: only ``path`` on PYTHONPATH, the working directory not on it."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/",
                          env={**os.environ, "PYTHONPATH": str(path), "PYTHONSAFEPATH": "1"})


def test_a_rank_importing_a_copy_of_the_archive_prints_the_frozen_file_and_its_line(run_dir, tmp_path):
    node = tmp_path / "node" / "code-x.zip"  # the node's copy: the frozen copy itself is not on the path
    node.parent.mkdir()
    shutil.copy(code_archive(run_dir), node)
    with zipfile.ZipFile(node) as archive:  # the modules compiled, their sources apart, stamped
        assert sorted(archive.namelist()) == [
            "launcher/__init__.pyc", "launcher/core/__init__.pyc", "launcher/core/boom.pyc",
            "source/launcher/__init__.py", "source/launcher/core/__init__.py", "source/launcher/core/boom.py"]
        assert archive.comment == stage.stamp(run_dir)
    ran = python(f"import launcher.core.boom as b; print(b.__file__, flush=True); {LOGGED}", node)
    assert ran.stdout.strip() == f"{node}/launcher/core/boom.pyc"
    frozen = code_dir(run_dir) / "launcher/core/boom.py"
    said = f'File "{frozen}", line 5, in go\n    raise RuntimeError("boom from the frozen copy")'
    assert said in ran.stderr
    # A rank remembers the sources of the copy it imports: its traceback's lines are not read from the frozen copy.
    frozen.unlink()
    ran = python(f"import sys; sys.path.insert(0, {str(SOURCE_ROOT)!r}); from launcher.job import stage; "
                 f"stage.remember_sources({str(node)!r}); del sys.path[0]; "
                 "[sys.modules.pop(name) for name in list(sys.modules) if name.split('.')[0] == 'launcher']; "
                 f"import launcher.core.boom as b; {LOGGED}", node)
    assert said in ran.stderr


def test_the_projects_archive_keeps_source_root_at_the_frozen_copy(tmp_path):
    """A rank that imports the project's staged code finds its code root at the frozen copy (where a search's next
    trials freeze from), not inside the archive."""
    run = tmp_path / "run"
    shutil.copytree(SOURCE_ROOT / "launcher", code_dir(run) / "launcher", ignore=shutil.ignore_patterns("__pycache__"))
    stage.pack(run, SOURCE_ROOT)
    ran = python("import launcher.core.rundir as r; print(r.SOURCE_ROOT, r.__file__)", code_archive(run))
    assert ran.stdout.split() == [str(code_dir(run)), f"{code_archive(run)}/launcher/core/rundir.pyc"], ran.stderr


@pytest.fixture
def job(tmp_path, monkeypatch):
    """A job of one node ``n1`` whose srun runs the step's command here, with the node-local place in ``tmp_path``."""
    bin_dir, place = tmp_path / "bin", tmp_path / "shm"
    bin_dir.mkdir()
    place.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift; done\nexec "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    python_path = os.pathsep.join(filter(None, ["/elsewhere", os.environ.get("PYTHONPATH")]))
    for name, value in {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77", "SLURM_JOB_NUM_NODES": "1",
                        "SLURMD_NODENAME": "n1", nodelocal.VARIABLE: str(place), "PYTHONPATH": python_path}.items():
        monkeypatch.setenv(name, value)
    return place / f"launcher-{os.geteuid()}"


def test_the_host_step_remakes_a_damaged_archive_and_every_node_copies_it(run_dir, job):
    data = bytearray(code_archive(run_dir).read_bytes())
    data[40] ^= 0xFF  # inside the first member: its checksum fails
    code_archive(run_dir).write_bytes(bytes(data))
    assert stage.problem(bytes(data), run_dir).startswith("damaged")
    path = stage.stage(run_dir)["PYTHONPATH"]
    target = job / stage.copy_name(run_dir, "77")
    assert path.split(":")[:2] == [str(target), "/elsewhere"] and str(code_dir(run_dir)) not in path
    assert target.read_bytes() == code_archive(run_dir).read_bytes()
    assert stage.problem(target.read_bytes(), run_dir) is None and (target.stat().st_mode & 0o777) == 0o600
    assert events(run_dir) == []


def test_a_node_that_cannot_stage_is_recorded_and_the_job_imports_the_frozen_copy(run_dir, job):
    job.write_text("another user's file, say\n")  # where this user's private folder would be
    assert stage.stage(run_dir) == {}  # the job imports the frozen copy, as its PYTHONPATH says already
    (said,) = events(run_dir)
    assert (said["event"], said["node"], said["job_id"]) == ("code_not_staged", "n1", "77")
    assert said["error"].startswith(f"{job} is a file of user ") and said["path"] == str(
        job / stage.copy_name(run_dir, "77"))
    asked = json.dumps({"code": str(job / "x.zip")})
    assert json.loads(subprocess.run([sys.executable, "-m", "launcher.job.stage", "node", str(run_dir), asked],
                                     capture_output=True, text=True).stdout)["code"]["node"] == "n1"


def test_a_copy_is_removed_once_its_job_ended_and_its_grace_passed(tmp_path, monkeypatch):
    monkeypatch.setenv(nodelocal.VARIABLE, str(tmp_path))
    with nodelocal.base() as folder:
        names = {name: f"code-{'0' * 12}-{name}.zip" for name in ("old", "young", "used", "ours")}
        for name in names.values():
            folder.write(name, b"zip")
        folder.write("other.txt", b"not a copy")
        for key in ("old", "used", "ours"):
            os.utime(folder.path / names[key], (time.time() - 2 * stage.GRACE_S,) * 2)
        user = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                env={**os.environ, "PYTHONPATH": f"/a:{folder.path / names['used']}"})
        try:
            stage.remove_ended(folder, keep=names["ours"])
        finally:
            user.kill()
            user.wait()
        assert sorted(folder.names()) == sorted([names["young"], names["used"], names["ours"], "other.txt"])


def test_usage_is_one_line_and_exit_2():
    ran = subprocess.run([sys.executable, "-m", "launcher.job.stage"], capture_output=True, text=True)
    assert (ran.returncode, ran.stderr) == (
        2, "usage: python -m launcher.job.stage RUN_DIR [code] [env] | node RUN_DIR ASKED\n")


def test_a_sites_script_stages_the_code_before_srun_and_keeps_the_frozen_copy_where_the_step_fails(tmp_path):
    (site,) = compose_runs(["cluster=slurm", "gpus=16"])
    lines = render_sbatch(site.config, site.plan, "r", tmp_path / "submitit").splitlines()
    (line,) = [line for line in lines if "launcher.job.stage" in line]
    assert line == f'LAUNCHER_STAGED=$({sys.executable} -m launcher.job.stage {tmp_path} code) && eval "$LAUNCHER_STAGED"'

    assert lines.index(line) < lines.index(next(line for line in lines if line.startswith("srun ")))
    for answer, seen in (("echo PYTHONPATH=/shm/code.zip:/site", "/shm/code.zip:/site"), ("exit 1", "/frozen")):
        fake = tmp_path / "python"  # the host's Python, as the stage step answers
        fake.write_text(f"#!/bin/sh\n{answer}\n")
        fake.chmod(0o755)
        shell = subprocess.run(["bash", "-c", f'{line.replace(sys.executable, str(fake))}; echo "$PYTHONPATH"'],
                               env={**os.environ, "PYTHONPATH": "/frozen"}, capture_output=True, text=True)
        assert shell.stdout.strip() == seen
    boxed = copy.deepcopy(site.config)  # in a container, and on the local cluster: never staged
    boxed.cluster.container.image = "nvcr.io#nvidia/pytorch:24.05-py3"
    (local,) = compose_runs(["gpus=16"])
    for cfg, plan in ((boxed, site.plan), (local.config, local.plan)):
        assert "launcher.job.stage" not in render_sbatch(cfg, plan, "r", tmp_path / "submitit")


# The tasks' environment staged once per node (launcher/job/stage_env.py), with a small venv of the suite's Python:
# its packages found through a .pth file naming the suite's site-packages, so that what it packs stays small.
MOUNTS = "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n40 22 0:51 / /usr rw,relatime - nfs4 server:/usr rw\n"


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    prefix = tmp_path_factory.mktemp("envs") / "train"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(prefix)], check=True)
    (site,) = prefix.glob("lib/python3*/site-packages")
    (site / "suite.pth").write_text(str(Path(stage_env.__file__).parents[2]) + "\n" + sysconfig.get_paths()["purelib"]
                                    + "\n")
    return prefix


def in_venv(venv: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "python"), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(SOURCE_ROOT), **env})


def archives(venv: Path) -> list:
    return sorted(path.name for path in (venv / stage_env.FOLDER).glob("env-*"))


def test_a_mount_is_on_a_network_file_system_by_its_longest_mount_point():
    mounts = MOUNTS + ("41 40 0:52 / /usr/local rw - ext4 /dev/sdb rw\n"
                       "42 22 0:53 / /lus\\040tre rw - lustre 10.0.0.1@o2ib:/fs rw\n")
    found = {path: stage_env.network_fs(Path(path), mounts) for path in
             ("/usr/lib/python3.11", "/usr/local/lib", "/home/u", "/lus tre/env", "/usrx")}
    assert found == {"/usr/lib/python3.11": True, "/usr/local/lib": False, "/home/u": False, "/lus tre/env": True,
                     "/usrx": False}


def test_an_environment_is_packed_once_per_version_and_a_system_python_is_refused(venv):
    assert in_venv(venv, "-m", "launcher.job.stage_env", "pack").returncode == 0
    (first,) = [venv / stage_env.FOLDER / name for name in archives(venv) if name.endswith(".tar")]
    made = first.stat().st_mtime_ns
    assert in_venv(venv, "-m", "launcher.job.stage_env", "pack").returncode == 0
    assert first.stat().st_mtime_ns == made and len(archives(venv)) == 2  # this version is packed: nothing read again
    (site,) = venv.glob("lib/python3*/site-packages")
    (site / "newpkg-1.0.dist-info").mkdir()  # pip installed a package: a new version, the old one's archive removed
    try:
        assert in_venv(venv, "-m", "launcher.job.stage_env", "pack").returncode == 0
        assert len(archives(venv)) == 2 and first.name not in archives(venv)
    finally:
        (site / "newpkg-1.0.dist-info").rmdir()
    ran = subprocess.run([os.path.realpath(venv / "bin" / "python"), "-m", "launcher.job.stage_env", "pack"],
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(SOURCE_ROOT)})
    assert ran.returncode == 1 and "is not in an environment of its own" in ran.stderr
    with pytest.raises(LaunchError, match=r"^cluster.stage_env=true: the tasks' Python \S+ is not in an environment"):
        pack_environment(os.path.realpath(venv / "bin" / "python"))


UNPACK = """
import json, subprocess, sys
from pathlib import Path
from launcher.core import nodelocal
from launcher.job import stage_env
env = stage_env.this_environment(sys.argv[1])
stage_env.pack(env)
with nodelocal.Folder.open(Path(sys.argv[2])) as folder:
    copy = stage_env.unpack(env.archive, env.checksum.read_text().strip(), folder, env)
python = copy / env.python.relative_to(env.prefix)
ran = subprocess.run([python, "-c", "import os, sys; print(sys.prefix, sys.base_prefix, os.__file__)"],
                     capture_output=True, text=True, env={})
print(copy, ran.stdout, ran.stderr)
"""


def test_a_venv_whose_base_is_on_a_network_file_system_runs_its_staged_copy_of_the_standard_library(venv, tmp_path):
    ran = in_venv(venv, "-c", UNPACK, MOUNTS, str(tmp_path / "shm"))
    copy, prefix, base, module = ran.stdout.split()[:4]
    assert (prefix, base, module) == (copy, f"{copy}/.base", f"{copy}/.base/lib/{Path(module).parent.name}/os.py"), \
        ran.stdout + ran.stderr
    assert Path(copy).name.startswith("env-") and (Path(copy).parent.stat().st_mode & 0o777) == 0o700


def test_a_damaged_archive_is_refused_and_leaves_nothing_on_the_node(venv, tmp_path):
    assert in_venv(venv, "-m", "launcher.job.stage_env", "pack").returncode == 0
    ran = in_venv(venv, "-c", "from launcher.job import stage_env; e = stage_env.this_environment(); "
                              "print(e.archive, e.checksum.read_text().strip(), e.version, e.python)")
    archive, checksum, version, python = ran.stdout.split()
    env = stage_env.Environment(venv, Path(python), None, version)
    data = bytearray(Path(archive).read_bytes())
    data[len(data) // 2] ^= 0xFF
    Path(archive).write_bytes(bytes(data))
    try:
        assert stage_env.problem(env).startswith("damaged (its sha256 is ")
        with nodelocal.Folder.open(tmp_path / "shm") as folder:
            with pytest.raises(ValueError, match="damaged"):
                stage_env.unpack(Path(archive), checksum, folder, env)
            assert folder.names() == [f".{env.name}.lock"]  # nothing of it but the lock its unpacking is made under
    finally:
        Path(archive).unlink()  # the next pack makes it again


def test_another_versions_copy_is_removed_once_no_process_runs_from_it_and_its_grace_passed(tmp_path):
    with nodelocal.Folder.open(tmp_path / "shm") as folder:
        names = {name: f"env-{index:016x}" for index, name in enumerate(("old", "young", "used", "ours"))}
        for name in names.values():
            (folder.path / name / "bin").mkdir(parents=True)
        (folder.path / "other").mkdir()
        for key in ("old", "used", "ours"):
            os.utime(folder.path / names[key], (time.time() - 2 * stage_env.GRACE_S,) * 2)
        for key in ("old", "failed"):  # the locks of a version removed now, and of one whose unpacking failed
            lock = folder.path / f".env-{9 if key == 'failed' else 0:016x}.lock"
            lock.touch()
            os.utime(lock, (time.time() - 2 * stage_env.GRACE_S,) * 2)
        rank = subprocess.Popen([str(folder.path / names["used"] / "bin" / "python"), "60"], executable="sleep")
        try:
            stage_env.remove_unused(folder, keep=names["ours"])
        finally:
            rank.kill()
            rank.wait()
        assert sorted(folder.names()) == sorted([names["young"], names["used"], names["ours"], "other"])


def test_the_host_step_stages_the_environment_on_every_node_and_the_ranks_run_its_copy(venv, run_dir, job):
    assert in_venv(venv, "-m", "launcher.job.stage_env", "pack").returncode == 0  # as the launch does
    ran = in_venv(venv, "-m", "launcher.job.stage", str(run_dir), "code", "env",
                  LAUNCHER_TASK_PYTHON=str(venv / "bin" / "python3"))  # cluster.python, as the batch script exports it
    assigned = dict(line.split("=", 1) for line in ran.stdout.splitlines())
    python = Path(assigned["LAUNCHER_TASK_PYTHON"])
    assert python.parent.parent.parent == job and python.name == "python3", ran.stderr
    assert assigned["PYTHONPATH"].startswith(str(job / stage.copy_name(run_dir, "77")))
    (staged,) = events(run_dir)  # the launch's archive used: no env_packed
    assert (staged["event"], staged["python"]) == ("env_staged", str(python))
    assert staged["archive"] == str(venv / stage_env.FOLDER / f"env-{staged['version']}.tar")
    shutil.rmtree(python.parent.parent)


def test_a_sites_script_runs_the_staged_environment_and_refuses_it_in_a_container(tmp_path):
    (site,) = compose_runs(["cluster=slurm", "gpus=16", "cluster.stage_env=true", "cluster.python=/env/bin/python"])
    lines = render_sbatch(site.config, site.plan, "r", tmp_path / "submitit").splitlines()
    at = lines.index("export LAUNCHER_TASK_PYTHON=/env/bin/python")
    assert lines[at + 1] == (f'LAUNCHER_STAGED=$(/env/bin/python -m launcher.job.stage {tmp_path} code env) && '
                             'eval "$LAUNCHER_STAGED"')
    (srun,) = [line for line in lines if line.startswith("srun ")]
    assert '"$LAUNCHER_TASK_PYTHON" -u -m launcher.job.task' in srun
    for answer, seen in (("echo LAUNCHER_TASK_PYTHON=/shm/env-1/bin/python", "/shm/env-1/bin/python"),
                         ("exit 1", "/env/bin/python")):
        fake = tmp_path / "python"
        fake.write_text(f"#!/bin/sh\n{answer}\n")
        fake.chmod(0o755)
        steps = "\n".join(lines[at:at + 2]).replace("/env/bin/python -m", f"{fake} -m")
        shell = subprocess.run(["bash", "-c", f'{steps}\necho "$LAUNCHER_TASK_PYTHON"'], capture_output=True,
                               text=True)
        assert shell.stdout.strip() == seen
    with pytest.raises(LaunchError, match=r"^cluster.stage_env=true with cluster.container.image=img: the image is"):
        compose_runs(["cluster=slurm", "cluster.stage_env=true", "cluster.container.image=img"])
