"""A run's files are its owner's alone on the real local cluster, unless shared with a group; secrets never.

Another local user (``nobody``, by setpriv) tries to read every file of a real run: it can read none of a
default run's, and every one of a run launched with ``share_group`` when it is in that group. The files are
written by the launcher, submitit, Slurm, logging, training and torch's checkpointing on the nodes."""
from __future__ import annotations

import grp
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from support.helpers import launch, run_launcher, run_name
from launcher.core.privacy import PRIVATE_DIR, SHARED_DIR

TINY = ("gpus=2", "model=gpt_tiny", "train.steps=4", "train.log_every=2", "train.eval_every=2",
        "train.checkpoint_every=2", "train.keep_checkpoints=2")
# What nobody runs: open every path named on stdin, print those it could read (stat alone says nothing).
PROBE = ("import sys\nfor p in sys.stdin.read().split('\\0'):\n    try:\n        open(p, 'rb').read(1)\n"
         "        print(p)\n    except OSError:\n        pass\n")


@pytest.fixture
def place():
    """A run root and a secrets home in a directory every user may traverse (as /home/alice would be), and
    a group to share with; all removed afterwards."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not shutil.which("groupadd"):
        pytest.skip("needs root, setpriv and groupadd to act as a second user")
    base = Path(tempfile.mkdtemp(prefix="w-private-", dir="/tmp"))
    base.chmod(0o755)
    group = f"lshare{os.getpid() % 100000}"
    subprocess.run(["groupadd", group], check=True)
    try:
        yield base, group
    finally:
        subprocess.run(["groupdel", group], check=False)
        shutil.rmtree(base, ignore_errors=True)


def readable_by_nobody(paths: list[Path], groups: str = "") -> set[Path]:
    """The paths ``nobody`` (with these supplementary groups) can open and read."""
    who = ["setpriv", "--reuid=nobody", "--regid=nogroup"] + ([f"--groups={groups}"] if groups else ["--clear-groups"])
    out = subprocess.run([*who, "/usr/bin/python3", "-c", PROBE], input="\0".join(map(str, paths)),
                         capture_output=True, text=True, check=True, timeout=60).stdout
    return {Path(line) for line in out.splitlines()}


def tree(run_dir: Path) -> tuple[list[Path], list[Path]]:
    dirs, files = [run_dir], []
    for path in sorted(run_dir.rglob("*")):
        (dirs if path.is_dir() else files).append(path)
    return dirs, files


def trained(slurm, base: Path, *args: str) -> Path:
    """Launch a TINY run under ``base``/runs, wait until it completes; return its directory."""
    job = launch(slurm, base / "runs", *TINY, *args, env={"LAUNCHER_HOME": str(base / "home")}, timeout=120)
    assert slurm.wait(job, timeout=300) == "COMPLETED"
    return base / "runs" / run_name(base / "runs", job)


def test_runs_are_private_unless_shared_with_a_group_and_secrets_always_are(slurm, place):
    base, group = place
    res = run_launcher("secrets", "create", "env", "PRIVATE_TOKEN", input="s3cret-value",
                       env={**slurm.env, "LAUNCHER_HOME": str(base / "home")})
    assert res.returncode == 0, res.stderr
    secret_files = [p for p in (base / "home").rglob("*") if p.is_file()]
    assert secret_files

    private = trained(slurm, base, "name=mine")
    shared = trained(slurm, base, "name=ours", f"share_group={group}")
    gid = grp.getgrnam(group).gr_gid

    dirs, files = tree(private)
    kinds = {"config.yaml", "plan.json", "run.json", "events.jsonl", "metrics.jsonl", "sbatch.sh", "rank_0.log"}
    assert kinds <= {f.name for f in files}
    assert any("checkpoints" in f.parts for f in files) and any("submitit" in f.parts for f in files)
    assert any(f.suffix == ".out" for f in files) and any("heartbeat" in str(f) for f in files)
    assert {oct(stat.S_IMODE(d.stat().st_mode)) for d in dirs} == {oct(PRIVATE_DIR)}
    assert {oct(stat.S_IMODE(f.stat().st_mode)) for f in files} == {oct(0o600)}, \
        [f for f in files if stat.S_IMODE(f.stat().st_mode) != 0o600]
    assert readable_by_nobody(files, str(gid)) == set()  # not even with the group

    dirs, files = tree(shared)
    assert {(oct(stat.S_IMODE(d.stat().st_mode)), d.stat().st_gid) for d in dirs} == {(oct(SHARED_DIR), gid)}
    assert {(oct(stat.S_IMODE(f.stat().st_mode)), f.stat().st_gid) for f in files} == {(oct(0o640), gid)}, \
        [f for f in files if (stat.S_IMODE(f.stat().st_mode), f.stat().st_gid) != (0o640, gid)]
    assert readable_by_nobody(files, str(gid)) == set(files)  # the group reads every file
    assert readable_by_nobody(files) == set()  # others still nothing

    assert readable_by_nobody(secret_files, str(gid)) == set()  # the secrets store is never shared
    res = slurm.launcher("share_group=no-such-group-x", *TINY, root=base / "runs", timeout=60)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "share_group='no-such-group-x' is not a group" in lines[0]
    assert sorted(p.name for p in (base / "runs").iterdir() if not p.name.startswith(".")) == ["mine", "ours"]
