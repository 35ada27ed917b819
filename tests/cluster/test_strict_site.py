"""A strict site as a user meets it: a local cluster set up by ``slurm/up.sh --strict`` (accounting enforced, the
users in account ``lab`` with QOS ``normal`` (8 GPUs per user, their default) and ``big``, a ``debug`` partition of
one node and 10 minutes beside the default one of 60). Whatever Slurm would reject or never start, a dry run, a
plan and a launch refuse in the same one line, naming the way out; a run that will wait behind the user's own is
warned, then says why it waits in words; a second Unix user gets the same answers."""
from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from support.helpers import (UNTIL_STOPPED, SlurmCluster, cluster_port, job_id_of, run_down, run_up, runs_json, said,
                             wait_for)
from support.sshd_site import let_reach

# One worker starts the site (a fixed port) for the module's tests.
pytestmark = pytest.mark.xdist_group("strict_site")
SECOND = "lstrict"
QOS_LIMIT = ("gpus=16 can never start under QOS normal, which allows at most 8 GPUs to each user at once "
             "(MaxTRESPerUser=gres/gpu=8): use gpus=8 or cluster.qos=big")


@pytest.fixture(scope="module")
def site(slurm):
    if os.geteuid() != 0 or not shutil.which("useradd"):
        pytest.skip("needs root and useradd for the site's second user")
    made = subprocess.run(["useradd", "--user-group", "--no-create-home", "--shell", "/bin/sh", SECOND],
                          capture_output=True, text=True)
    assert made.returncode in (0, 9), made.stderr  # 9: there already
    # Outside pytest's tree, which the second user reaches through ACLs (let_reach) that a worker's first use of
    # tmp_path can take away: pytest takes group and other bits off /tmp/pytest-of-root, and with them the ACL mask.
    state = Path(tempfile.mkdtemp(prefix="w-strict-site-", dir="/tmp"))
    port = cluster_port("strict")
    up = run_up("--dir", str(state), "--name", f"strict{port}", "--port", str(port), "--strict", f"root,{SECOND}")
    assert up.returncode == 0, up.stderr
    yield SlurmCluster(env={**slurm.env, "SLURM_CONF": str(state / "etc" / "slurm.conf")},
                       nodes=[f"strict{port}-node{n}" for n in (1, 2)], gpus_per_node=8)
    run_down(state)
    shutil.rmtree(state, ignore_errors=True)


def launcher(site, root: Path, *args: str):
    return site.launcher("model=gpt_tiny", "train.steps=10", *args, root=root)


@pytest.mark.parametrize("args, refusal", [
    (["gpus=16"], QOS_LIMIT),
    (["gpus=2", "cluster.account=physics"], "cluster.account=physics is not one of your accounts (lab, root): set "
                                            "one of them"),
    (["gpus=2", "cluster.qos=gold"], "cluster.qos=gold is not one of account lab's QOS for you (big, normal): set one "
                                     "of them"),
    (["gpus=2", "cluster.account=root", "cluster.qos=big"], "cluster.qos=big is not one of account root's QOS for you "
                                                            "(normal): set one of them"),
    (["gpus=16", "cluster.qos=big", "cluster.partition=debug"], "gpus=16 needs 2 nodes; partition 'debug' allows at "
                                                                "most 1 per job (MaxNodes)"),
    (["gpus=2", "cluster.partition=debug", "cluster.time_limit_min=20"], "cluster.time_limit_min=20 is above "
                                                                         "partition 'debug''s MaxTime of 10 min"),
])  # fmt: skip
def test_the_dry_run_plan_and_launch_refuse_what_the_site_would_in_one_line(site, tmp_path, args, refusal):
    dry = launcher(site, tmp_path, *args, "dry_run=true")
    assert dry.returncode == 2 and "#SBATCH" in dry.stdout, dry.stderr
    refused = [line for line in said(dry.stderr) if line.startswith("a launch would be refused: ")]
    assert refused and refused[0].startswith(f"a launch would be refused: {refusal}"), dry.stderr
    plan = site.launcher("plan", "model=gpt_tiny", *args, "--check", root=tmp_path)
    assert plan.returncode == 2 and refusal in plan.stdout + plan.stderr, plan.stdout + plan.stderr
    res = launcher(site, tmp_path, *args)
    assert res.returncode == 2 and res.stderr.startswith(f"error: {refusal}") and res.stderr.count("\n") == 1, \
        res.stderr
    assert not any(tmp_path.iterdir())  # no run directory, nothing submitted
    assert site.run("squeue", "-h", "-o", "%i").stdout.strip() == ""


def test_the_way_out_it_names_is_taken(site, tmp_path):
    dry = launcher(site, tmp_path, "gpus=16", "cluster.qos=big", "dry_run=true")
    assert dry.returncode == 0 and not [line for line in said(dry.stderr) if "refused" in line], dry.stderr
    listed = site.launcher("clusters", root=tmp_path)
    row = next(line for line in listed.stdout.splitlines() if " gpu* " in line)
    assert "8 (QOS normal, MaxTRESPerUser)" in row, listed.stdout
    added = site.launcher("clusters", "add", "mysite", "--print", root=tmp_path)
    assert "\naccount: lab\nqos: normal\n" in added.stdout and "default QOS normal" in added.stdout, added.stdout


def test_a_run_behind_the_users_own_is_warned_then_says_why_it_waits(site, tmp_path):
    first = site.launcher("model=gpt_tiny", "gpus=8", "train.steps=100000", "name=first", root=tmp_path,
                          env=UNTIL_STOPPED)
    assert first.returncode == 0, first.stderr
    job = job_id_of(first.stdout)
    try:
        wait_for(lambda: site.run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() == "RUNNING", 60, "first runs")
        warning = (f"warning: will wait: QOS normal allows each user 8 GPUs at once and your jobs {job} hold or ask "
                   "for 8")
        dry = launcher(site, tmp_path, "gpus=8", "dry_run=true")
        assert dry.returncode == 0 and warning in dry.stderr.splitlines(), dry.stderr
        second = launcher(site, tmp_path, "gpus=8", "name=second")
        assert second.returncode == 0 and warning in second.stderr.splitlines(), second.stderr

        def in_words():
            row = runs_json(site, tmp_path).get("second")
            return row if row and row["reason"].startswith("your other running jobs hold 8 GPUs in 1 job") else None

        row = wait_for(in_words, 60, "the pending reason in words", patient=True)
        assert row["status"] == "PENDING" and "cluster.qos" in row["reason"], row
    finally:
        site.run("scancel", "-u", "root", check=False)


def test_the_runs_of_a_sweep_count_against_the_limit_together(site, tmp_path):
    sweep = launcher(site, tmp_path, "gpus=8", "train.lr=1e-3,2e-3", "dry_run=true", "-m")
    waits = [line for line in said(sweep.stderr) if "will wait" in line]
    assert sweep.returncode == 0 and waits == [
        "warning: [model=gpt_tiny train.steps=10 gpus=8 train.lr=0.002 dry_run=true] will wait: QOS normal allows each "
        "user 8 GPUs at once and your jobs (run 1 of this launch) hold or ask for 8"], sweep.stderr


@pytest.fixture
def second_user(site, wheel):
    """``lstrict``, another Unix user of the site, with a home of their own and the launcher installed there from
    the wheel without torch (its dependencies reused from the suite's environment, torch and CUDA's left out: a
    real ``pip install`` from the index is the installed-wheel tests'). Yields a function that runs a command as
    that user in a shell of its own (``env``: variables of that shell beyond HOME, USER, PATH and SLURM_CONF)."""
    home = Path(tempfile.mkdtemp(prefix="w-strict-", dir="/tmp"))
    try:
        user = pwd.getpwnam(SECOND)
        home.chmod(0o755)
        let_reach(SECOND, [Path(sys.executable), Path(sys.executable).resolve(), Path(sys.prefix),
                           Path(sys.base_prefix), Path(site.env["SLURM_CONF"]).parent])
        deps = home / "deps"  # the suite's packages but torch's
        deps.mkdir()
        for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
            if not entry.name.lower().startswith(("torch", "nvidia", "triton", "functorch", "_slurm_gpt",
                                                  "__editable__", "slurm_gpt_launcher")):
                (deps / entry.name).symlink_to(entry)
        shutil.copy(wheel, home / wheel.name)
        for path in (home, *home.iterdir()):
            os.lchown(path, user.pw_uid, user.pw_gid)
        base = {"PATH": f"{home}/venvs/launcher/bin:/usr/bin:/bin", "HOME": str(home), "USER": SECOND,
                "SLURM_CONF": site.env["SLURM_CONF"]}

        def as_second(*cmd: str, env: dict | None = None, timeout: float = 180) -> subprocess.CompletedProcess:
            return subprocess.run(["setpriv", f"--reuid={SECOND}", f"--regid={SECOND}", "--clear-groups", *cmd],
                                  env={**base, **(env or {})}, cwd=home, capture_output=True, text=True,
                                  timeout=timeout)

        venv = home / "venvs" / "launcher"
        made = as_second(sys.executable, "-m", "venv", "--without-pip", str(venv))
        assert made.returncode == 0, made.stderr
        site_dir = as_second(str(venv / "bin" / "python"), "-c",
                             "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        as_second("sh", "-c", f"echo {deps} > {site_dir.stdout.strip()}/deps.pth")
        installed = as_second(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q",
                              "--no-deps", "--no-index", str(home / wheel.name), env={"PYTHONPATH": ""})
        assert installed.returncode == 0, installed.stderr
        yield as_second, home
    finally:
        shutil.rmtree(home, ignore_errors=True)


def test_a_second_user_follows_the_readme_recipe_and_finds_the_run_in_a_new_shell(site, second_user):
    """The README's "At your site", literally: clusters add with the tasks' Python, clusters default, the run root
    in the environment, plan, a launch with no cluster=, runs; then a new shell without LAUNCHER_RUN_ROOT."""
    as_second, home = second_user
    torch = as_second("python", "-c", "import importlib.util, launcher; print(importlib.util.find_spec('torch'), "
                                      "launcher.__file__)")
    assert torch.stdout.startswith("None ") and "site-packages" in torch.stdout, torch  # the wheel, no torch
    dry = as_second("launcher", "model=gpt_tiny", "gpus=16", "dry_run=true")  # the site's limits, as they see them
    assert dry.returncode == 2 and f"a launch would be refused: {QOS_LIMIT}" in dry.stderr.splitlines(), dry.stderr
    added = as_second("launcher", "clusters", "add", "mysite", "--python", sys.executable)
    assert added.returncode == 0, added.stderr
    written = (home / ".config" / "launcher" / "cluster" / "mysite.yaml").read_text()
    assert f"\npython: {sys.executable}\n" in written and "\naccount: lab\nqos: normal\n" in written, written
    assert as_second("launcher", "clusters", "default", "mysite").returncode == 0
    shell = {"LAUNCHER_RUN_ROOT": f"{home}/scratch/runs"}
    plan = as_second("launcher", "plan", "gpus=2", "model=gpt_tiny", env=shell)
    assert plan.returncode == 0 and "gpt_tiny" in plan.stdout, plan.stderr
    launched = as_second("launcher", "gpus=2", "model=gpt_tiny", "train.steps=10", "name=recipe", env=shell)
    assert launched.returncode == 0, launched.stderr
    job = job_id_of(launched.stdout)
    state = site.wait(job, timeout=300)
    assert state == "COMPLETED", (state, as_second("launcher", "describe", "recipe", env=shell).stdout)
    assert site.run("sacct", "-n", "-X", "-P", "-j", job, "-o", "User,Account,QOS").stdout.split() == \
        [f"{SECOND}|lab|normal"]
    listed = as_second("launcher", "runs", "--json")  # a new shell: no LAUNCHER_RUN_ROOT
    rows = {row["name"]: row for row in json.loads(listed.stdout)}
    assert rows["recipe"]["status"] == "COMPLETED" and rows["recipe"]["cluster"] == "mysite", listed


def test_a_partition_chosen_with_a_shorter_max_time_brings_it(site, tmp_path):
    """cluster.partition=debug asks for debug's 10 minutes, not for a refusal of the cluster file's 30 (local.yaml)."""
    dry = launcher(site, tmp_path, "gpus=2", "cluster.partition=debug", "dry_run=true")
    assert dry.returncode == 0, dry.stderr
    assert ("warning: cluster.time_limit_min is 10, partition 'debug''s MaxTime, not the cluster file's 30 (set "
            "cluster.time_limit_min to choose another)") in dry.stderr.splitlines(), dry.stderr
    assert "#SBATCH --time=10\n" in dry.stdout and "#SBATCH --partition=debug\n" in dry.stdout
    longer = launcher(site, tmp_path, "gpus=2", "cluster.partition=debug", "cluster.time_limit_min=5", "dry_run=true")
    assert longer.returncode == 0 and "#SBATCH --time=5\n" in longer.stdout and "MaxTime" not in longer.stderr
